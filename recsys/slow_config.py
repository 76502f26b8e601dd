"""A one-line warning when a configuration will be very slow on the hardware found.

The reference sizes (DLRM: global batch 65536, 1024-wide MLPs; Wide & Deep: 131072 x
five 1024-wide layers) are GPU sizes: on CPU cores one step takes minutes, and
``--amp`` (float16 math is emulated on CPUs) or ``--xla`` (compiles for minutes on
CPUs) make it worse, with nothing on the console to say why. The estimate is the
dense work of a step, about 6 floating-point operations per dense weight per sample
(forward and backward), over a rate of ``CPU_FLOPS_PER_CORE`` per core; embedding
lookups are cheap next to it. It is a rough bound to warn by, not a prediction.
"""
from __future__ import annotations

from typing import Optional

CPU_FLOPS_PER_CORE = 10e9      # sustained fp32 rate of TF's CPU kernels on one core, about
SLOW_STEP_S = 2.0              # warn when one step is estimated to take longer than this


def estimated_cpu_step_s(cfg, cores: int) -> float:
    """Seconds of one training step of ``cfg`` on ``cores`` CPU cores (dense work only)."""
    from recsys.models.defaults import dense_param_count
    tables = cfg.embedding_tables or []
    n_tables = len([t for t in tables if not str(t[0]).endswith("/wide")])
    dim = cfg.factors if cfg.model == "ncf" else cfg.embedding_dim
    overrides = {k: getattr(cfg, k) for k in ("bottom_mlp", "top_mlp", "deep_hidden_units", "layers")
                 if getattr(cfg, k, None) is not None}
    dense = dense_param_count(cfg.model, n_tables=max(1, n_tables), embedding_dim=dim, **overrides)
    samples = cfg.batch_size // max(1, cfg.world_size)
    return 6.0 * dense * samples / (CPU_FLOPS_PER_CORE * max(1, cores))


def slow_warning(cfg, gpus: int, cores: int) -> Optional[str]:
    """The warning line for ``cfg`` on this rank's hardware (``gpus`` visible, ``cores`` usable),
    or None when it should run at a reasonable speed."""
    if gpus:
        return None
    reasons = []
    step_s = estimated_cpu_step_s(cfg, cores)
    if step_s > SLOW_STEP_S:
        reasons.append(f"--batch-size {cfg.batch_size} with these layer widths is about {step_s:,.0f} s per step "
                       f"on {cores} CPU core(s)")
    if cfg.amp:
        reasons.append("--amp emulates float16 on CPUs (slower than float32)")
    if cfg.xla:
        reasons.append("--xla compiles for minutes on CPUs")
    if not reasons:
        return None
    return (f"warning: no GPU found and this configuration will be very slow here: {'; '.join(reasons)}. "
            f"For a quick CPU run use --synthetic (small sizes) or a smaller --batch-size and layers, without --amp/--xla")
