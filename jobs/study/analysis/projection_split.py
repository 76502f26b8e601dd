"""The compute split of `recsys-submit study project`: which share of a step's batch-proportional
compute is embedding work (lookups and table gradients) and which is dense (MLPs, interaction).

The two scale with different things. Dense work follows the batch per GPU. In a model-parallel
step a rank looks up its own tables for the global batch, so its embedding work follows the
slowest rank's share of global batch x hotness x width in the engine's placement
(jobs.study.projection_model.embedding_work), which falls far slower than the batch per GPU as
GPUs are added. The split's source, in order: a step breakdown that measures the lookup apart
(a phase named in LOOKUP_PHASES), else the model's own arithmetic per sample, dense FLOPs at
the GPU's peak FLOP rate against embedding bytes at its memory bandwidth (the profile's
`fabric.gpu`), else not known (compute stays one term; the band spans all-dense to
all-embedding). docs/studies.md, "The model, part by part", states the formulas. No constant is
fitted: the rates are the datasheet's, the sizes the engine's. Standard library only.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, Optional, Tuple

from .projection_model import embedding_work

# a dense parameter costs 2 FLOPs per sample forward and 4 backward (input and weight gradients)
DENSE_FLOPS_PER_PARAM = 6
# an embedding element is read by the lookup and written by the table gradient, 4 bytes each time
EMBEDDING_PASSES = 2
EMBEDDING_BYTES = 4
# the arithmetic split's stated range: either part reaching half its peak where the other
# reaches all of it (peaks are not what kernels reach; no figure says which part falls further)
SPLIT_RANGE_FACTOR = 2.0
# step breakdown phases that time the embedding lookup apart from the dense compute
LOOKUP_PHASES = ("embedding_lookup", "lookup")


def lookup_elements(layout: Dict[str, Any]) -> int:
    """Embedding vector elements one sample looks up: hotness x width over the engine's tables."""
    return sum(int(t[4]) * int(t[3]) for t in layout["tables"])


def interaction_flops(layout: Dict[str, Any], model: str) -> int:
    """FLOPs per sample of DLRM's dot interaction, forward and backward: F(F-1)/2 dot products of
    width d (F: the tables and the bottom MLP's output), 2d FLOPs each, x3 with the backward pass.
    The other models concatenate (Wide & Deep, distributed-embeddings' synthetic models) or
    multiply elementwise (NCF's GMF, one vector per sample): no term."""
    if model != "dlrm" or not layout["tables"]:
        return 0
    f = len(layout["tables"]) + 1
    d = max(int(t[3]) for t in layout["tables"])
    return 3 * f * (f - 1) * d


def arithmetic_split(layout: Dict[str, Any], model: str, precision: str,
                     rates: Optional[Tuple[float, float]]) -> Tuple[Optional[float], Tuple[float, float], str]:
    """(embedding share, (low, high), source) of the model's own arithmetic at one GPU's peak
    `rates` (FLOP/s, bytes/s; None: not known, share None and the range all-dense to
    all-embedding). The range: either part at 1/SPLIT_RANGE_FACTOR of its peak."""
    if rates is None:
        return None, (0.0, 1.0), (f"not known: the profile's fabric states no GPU peak rates for {precision} "
                                  "(fabric.gpu); compute scaled as one term, the band spans all-dense to "
                                  "all-embedding")
    flops_rate, bytes_rate = rates
    flops = DENSE_FLOPS_PER_PARAM * int(layout["dense_params"]) + interaction_flops(layout, model)
    nbytes = EMBEDDING_PASSES * EMBEDDING_BYTES * lookup_elements(layout)
    dense, emb = flops / flops_rate, nbytes / bytes_rate
    if dense + emb <= 0:
        return 0.0, (0.0, 0.0), "the model has neither dense parameters nor tables: all compute dense"
    k = SPLIT_RANGE_FACTOR
    share, low, high = emb / (dense + emb), emb / (emb + k * dense), k * emb / (k * emb + dense)
    return share, (low, high), (
        f"the model's arithmetic per sample: dense {flops / 1e6:.3g} MFLOP at {flops_rate / 1e12:g} TFLOPS "
        f"({precision}), {dense * 1e9:.3g} ns; embedding {nbytes / 1e3:.3g} kB at {bytes_rate / 1e9:g} GB/s, "
        f"{emb * 1e9:.3g} ns: embedding share {share:.2f} (range {low:.2f}-{high:.2f}: either part at "
        f"1/{k:g} of its peak)")


def breakdown_share(phases_ms: Dict[str, float], scaled_ms: float, k: float) -> Optional[float]:
    """The embedding share a step breakdown measures (a lookup phase, x k the timed/split ratio,
    over the calibration's batch-proportional ms), or None when it has no lookup phase."""
    lookup = sum(phases_ms.get(p, 0.0) for p in LOOKUP_PHASES if p in phases_ms)
    if not any(p in phases_ms for p in LOOKUP_PHASES) or scaled_ms <= 0:
        return None
    return min(1.0, lookup * k / scaled_ms)


def with_split(calibration, layout: Dict[str, Any], model: str, precision: str,
               rates: Optional[Tuple[float, float]]):
    """The calibration (jobs.study.projection_model.Calibration) with its compute split: the
    slowest rank's embedding work at the calibration point (from `layout`, the engine's placement
    there), and the share, unless a breakdown measured it already, from the model's arithmetic."""
    work = max(embedding_work(layout, calibration.gpus, calibration.batch_per_gpu))
    if calibration.embedding_share is not None and calibration.split_source:
        return replace(calibration, embedding_work=work)
    share, rng, source = arithmetic_split(layout, model, precision, rates)
    note = calibration.split_source + "; " if calibration.split_source else ""
    return replace(calibration, embedding_work=work, embedding_share=share, embedding_share_range=rng,
                   split_source=note + source)
