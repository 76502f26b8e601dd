"""A one-line warning when a configuration will be very slow on the hardware found.

The reference sizes (DLRM: global batch 65536, 1024-wide MLPs; Wide & Deep: 131072 x
five 1024-wide layers) are GPU sizes: on CPU cores one step takes minutes, and
``--amp`` (float16 math is emulated on CPUs) or ``--xla`` (compiles for minutes on
CPUs) make it worse, with nothing on the console to say why. The estimate is the
dense work of a step, about 6 floating-point operations per dense weight per sample
(forward and backward), over a rate of ``CPU_FLOPS_PER_CORE`` per core, times
``AMP_CPU_SLOWDOWN`` with --amp; embedding lookups are cheap next to it. It is a rough
bound to warn by, not a prediction: small models with --amp or --xla are not warned about.
"""
from __future__ import annotations

from typing import Optional

from recsys.runtime.devices import amp_cpu_slowdown

CPU_FLOPS_PER_CORE = 10e9      # sustained fp32 rate of TF's CPU kernels on one core, about
AMP_CPU_SLOWDOWN = amp_cpu_slowdown()  # float16 is emulated on CPUs: measured (recsys.runtime.devices)
SLOW_STEP_S = 2.0              # warn when one step is estimated to take longer than this


def estimated_cpu_step_s(cfg, cores: int) -> float:
    """Seconds of one training step of ``cfg`` on ``cores`` CPU cores (dense work only)."""
    dense = cfg.dense_parameters
    samples = cfg.batch_size // max(1, cfg.world_size)
    seconds = 6.0 * dense * samples / (CPU_FLOPS_PER_CORE * max(1, cores))
    return seconds * (AMP_CPU_SLOWDOWN if cfg.amp else 1.0)


def slow_warning(cfg, gpus: int, cores: int) -> Optional[str]:
    """The warning line for ``cfg`` on this rank's hardware (``gpus`` visible, ``cores`` usable),
    or None when it should run at a reasonable speed."""
    if gpus:
        return None
    step_s = estimated_cpu_step_s(cfg, cores)
    if step_s <= SLOW_STEP_S:
        return None
    why = [f"--batch-size {cfg.batch_size} with these layer widths"]
    if cfg.amp:
        why.append("--amp (float16 is emulated on CPUs)")
    if cfg.xla:
        why.append("--xla compilation on top")
    return (f"warning: no GPU found: this configuration will be very slow here, about {step_s:,.0f} s per step "
            f"on {cores} CPU core(s) ({'; '.join(why)}); for a quick CPU run use --synthetic (small sizes) "
            f"or a smaller --batch-size and layers, without --amp")
