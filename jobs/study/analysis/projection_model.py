"""The arithmetic of `recsys-submit study project` (jobs.study.analysis.projection): the model's sizes
from the engine's planner, the exchange bytes, a collective's time on a profile's fabric, and the
band of one GPU count. docs/studies.md, "Projecting a study", states every formula; the module
docstring of jobs.study.analysis.projection says what is measured and what is not. Standard library only."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from jobs.errors import RequestError
from jobs.profiles.fabric import EDGES, bus_factor


PHASES = ("compute", "embedding_exchange", "gradient_exchange")
BYTES_PER_PARAM = 4
PLANNER = [sys.executable, "-m", "recsys.plan_tables"]
# 2: calibration.curve, fabric.core_sharing; 3: calibration.exchanges_in/spread/noisy, model_size;
# 4: calibration.embedding_share/_range/split_source/embedding_work, points' compute_ms_range
# 5: points' exchange_ms_range (the fabric's measured range), fabric.exchange_sharing
PROJECTION_VERSION = 5


@dataclass(frozen=True)
class Workload:
    """A model's sizes given explicitly (a table list the engine's placement rule spreads as one
    group): the published validation's models, whose tables no recsys-train flag describes."""

    model: str
    tables: List[List[Any]]                 # [name, rows, width, ids per sample, vectors per sample]
    dense_params: int = 0
    model_parallel: bool = True
    implementation: str = "horovod-alltoall"    # the placement rule: recsys-train's --embedding-implementation
    dp_input: bool = True                   # ids arrive data parallel and are exchanged (False: each rank reads its tables' ids)
    optimizer_slots: int = 0
    column_slice_threshold: Optional[int] = None
    data_parallel_threshold: Optional[int] = None
    source: str = ""


@dataclass(frozen=True)
class Calibration:
    """One step time the projection stands on: at `gpus` ranks of `batch_per_gpu`, `scaled_ms` of
    work proportional to the per-GPU batch and `fixed_ms` that is not (the optimizer), with the
    exchanges of that point already taken out."""

    gpus: int
    batch_per_gpu: int
    scaled_ms: float
    fixed_ms: float = 0.0
    source: str = ""
    # a measured compute curve: [[batch per GPU, ms], ...] of one GPU at several batches (>= 2
    # batches: it replaces the proportional scaling; see compute_ms)
    curve: Tuple[Tuple[int, float], ...] = ()
    curve_source: str = ""
    # the step still holds its own exchanges (a step time given at N > 1 GPUs, or a study point
    # without a breakdown): jobs.study.analysis.projection takes them out, projected at N, before scaling
    exchanges_in: bool = False
    # the band's calibration term: factors on the calibration's compute at its fast and slow
    # repeats (a study point's fastest and slowest measured throughput; 1, 1 for one figure)
    spread: Tuple[float, float] = (1.0, 1.0)
    spread_source: str = ""
    noisy: Optional[str] = None             # the repeats are further apart than a study report allows
    # the compute split (jobs.study.projection_split): the share of the batch-proportional compute
    # that is embedding work (None: not known, one term), the band's range of it, where it comes
    # from, and the slowest rank's embedding work at this point (vector elements per step)
    embedding_share: Optional[float] = None
    embedding_share_range: Tuple[float, float] = (0.0, 0.0)
    split_source: str = ""
    embedding_work: int = 0

    def with_spread_over(self, step_ms: float) -> "Calibration":
        """The spread re-expressed on a compute of `step_ms` (after exchanges are taken out of the
        step the spread was measured on): the same ms either side, a larger share of less time."""
        k = self.step_ms / step_ms if step_ms > 0 else 1.0
        low, high = self.spread
        return replace(self, spread=(1.0 + (low - 1.0) * k, 1.0 + (high - 1.0) * k))

    @property
    def step_ms(self):
        return self.scaled_ms + self.fixed_ms

    def compute_ms(self, batch_per_gpu: int, work_ratio: Optional[float] = None,
                   share: Optional[float] = None) -> float:
        """Compute per rank at a batch per GPU, before core sharing. One point (no curve): its
        batch-proportional part scaled with the batch plus its fixed part. A curve of >= 2
        batches gives the shape, the calibration the level: step_ms x curve(b) / curve(b0).
        With a split (`share`, default the calibration's, of the batch-proportional part) and
        `work_ratio` (the slowest rank's embedding work at this point over the calibration's):
        that share scaled with the work ratio, the rest as above."""
        share = self.embedding_share if share is None else share
        emb = (share or 0.0) * self.scaled_ms if work_ratio is not None else 0.0
        pts = sorted({int(b): float(t) for b, t in self.curve}.items())
        if len(pts) < 2:
            dense = (self.scaled_ms - emb) * batch_per_gpu / self.batch_per_gpu + self.fixed_ms
        else:
            dense = (self.step_ms - emb) * curve_ms(pts, batch_per_gpu) / curve_ms(pts, self.batch_per_gpu)
        return dense + emb * (work_ratio or 0.0)


def affine_fit(points: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
    """(fixed ms, ms per sample) of a least-squares line through measured (batch, ms) points, the
    rule outside a curve's measured range: a negative fixed part becomes 0 (the line through the
    origin), a negative slope 0 (a flat step, the points' mean)."""
    n = len(points)
    mb = sum(b for b, _ in points) / n
    mt = sum(t for _, t in points) / n
    var = sum((b - mb) ** 2 for b, _ in points)
    slope = sum((b - mb) * (t - mt) for b, t in points) / var if var else 0.0
    fixed = mt - slope * mb
    if slope < 0:
        return mt, 0.0
    if fixed < 0:
        return 0.0, sum(b * t for b, t in points) / sum(b * b for b, _ in points)
    return fixed, slope


def curve_ms(points: Sequence[Tuple[int, float]], batch: float) -> float:
    """A measured compute curve at `batch`: log-log interpolation between the two measured
    batches around it; outside the measured range, the affine fit of the measured points."""
    pts = sorted(points)
    if pts[0][0] <= batch <= pts[-1][0]:
        for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
            if b0 <= batch <= b1:
                if batch == b0:
                    return t0
                w = math.log(batch / b0) / math.log(b1 / b0)
                return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0)))
    fixed, per_sample = affine_fit(pts)
    return fixed + per_sample * batch


@dataclass(frozen=True)
class Target:
    """What the projection needs of a profile: its node, its fabric, whether ranks share a host."""

    profile: str
    gpus_per_node: int
    gpu_memory_gb: Optional[float]
    fabric: Any                              # jobs.profiles.fabric.Fabric
    host_cores: Optional[int] = None         # shared_nodes: every rank of the job on these cores
    max_nodes: Optional[int] = None          # the profile's node limit (None: not stated)

    @classmethod
    def of(cls, profile):
        if profile.fabric is None:
            raise RequestError(f"--profile: profile {profile.name!r} has no fabric: section (docs/profiles.md, "
                               "\"Fabric\"); a projection needs the links' bandwidths and latencies")
        node = profile.node
        return cls(profile=profile.name, gpus_per_node=max(1, node.gpus), gpu_memory_gb=node.gpu_memory_gb,
                   fabric=profile.fabric,
                   host_cores=node.sockets * node.cores_per_socket if profile.shared_nodes else None,
                   max_nodes=getattr(profile, "max_nodes", None))

    def refusal(self, n: int) -> Optional[str]:
        """Why n GPUs cannot be projected on this target (one line), or None: more nodes than the
        profile has, or several nodes on a fabric without a between-nodes level."""
        g, nodes = _levels(n, self.gpus_per_node)
        if self.max_nodes and nodes > self.max_nodes:
            return (f"{n} GPUs need {nodes} nodes of {g}; profile {self.profile} has at most {self.max_nodes} "
                    f"node(s), {self.max_nodes * self.gpus_per_node} GPUs (its max_nodes)")
        if nodes > 1 and self.fabric.inter_node is None:
            return (f"{n} GPUs span {nodes} nodes and profile {self.profile}'s fabric has no inter_node level "
                    f"(docs/profiles.md, \"Fabric\"): describe fabric.inter_node, or project at most "
                    f"{self.gpus_per_node} GPUs")
        return None


def _planner(request, command=None, memory_gb=None) -> Dict[int, Dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (_repo_root(), os.environ.get("PYTHONPATH")) if p))
    if memory_gb:       # the target's per-rank budget, as a job there gets it (jobs.planning.plan), not this host's
        env["RECSYS_EMBEDDING_MEMORY_GB"] = f"{memory_gb:g}"
    command = command or PLANNER
    try:
        proc = subprocess.run(command, input=json.dumps(request), capture_output=True, text=True, env=env)
    except OSError as exc:      # e.g. an interpreter this user may not run: the section says so, one line
        raise RequestError(f"cannot run the engine's planner ({command[0]}): {exc.strerror}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RequestError(f"the engine refused the model: {last}")
    return {int(k): v for k, v in json.loads(proc.stdout).items()}


def layouts_of_argv(argv_by_gpus: Dict[int, List[str]], command=None,
                    memory_gb: Optional[float] = None) -> Dict[int, Dict[str, Any]]:
    """What recsys-train builds for each GPU count's command line (python -m recsys.plan_tables):
    tables with their hotness and id size, the model-parallel slices, the dense parameters.
    `memory_gb`: the per-rank embedding memory of the target (what a job there is given)."""
    return _planner({"points": [{"world_size": n, "argv": list(a)} for n, a in sorted(argv_by_gpus.items())]},
                    command, memory_gb)


def layouts_of_workload(workload: Workload, gpus: Sequence[int], command=None) -> Dict[int, Dict[str, Any]]:
    """The same for an explicit table list, placed by the engine's rule (one group)."""
    request = {"tables": [list(t) for t in workload.tables], "world_sizes": sorted(set(gpus)),
               "dense_params": workload.dense_params, "optimizer_slots": workload.optimizer_slots,
               "model_parallel": workload.model_parallel, "implementation": workload.implementation,
               "dp_input": workload.dp_input,
               "column_slice_threshold": workload.column_slice_threshold,
               "data_parallel_threshold": workload.data_parallel_threshold}
    return _planner(request, command)


def _repo_root():
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# the loss and the stop flag travel with the gradients (recsys.engine, the gradient exchange's extras)
GRADIENT_EXTRAS_BYTES = 8


def alltoall_bytes(layout: Dict[str, Any], n: int, batch_per_gpu: int) -> List[int]:
    """Bytes each rank sends to the other ranks per step in the model-parallel exchange: the ids
    of its batch for slices elsewhere, the vectors of its slices for every other rank's batch,
    the gradients of the vectors it received (the count of recsys.embeddings.alltoall.exchange_only)."""
    if n <= 1 or not layout["slices"]:
        return [0] * n
    tables = layout["tables"]
    width_on, hot_on = [0] * n, [0] * n
    ids_total, width_total = 0, 0
    for t, rank, c0, c1 in layout["slices"]:
        hot, id_bytes = tables[t][4], tables[t][5]
        width = (c1 - c0) * (tables[t][7] if len(tables[t]) > 7 else 1)    # a shared table: one vector per input
        width_on[rank] += width
        hot_on[rank] += hot * id_bytes
        ids_total += hot * id_bytes
        width_total += width
    b, f = batch_per_gpu, BYTES_PER_PARAM
    return [b * ((ids_total - hot_on[r]) + (width_total - width_on[r]) * f) + (n - 1) * b * width_on[r] * f
            for r in range(n)]


def embedding_work(layout: Dict[str, Any], n: int, batch_per_gpu: int) -> List[int]:
    """Each rank's embedding lookup (and table-gradient) work per step, in vector elements: for
    the model-parallel slices it holds, the global batch x hotness x the slice's width (a rank
    looks up its tables for every rank's samples); for the replicated tables, its own batch x
    hotness x width. Not yet a term of the compute model (docs/studies.md, "Not modelled yet"):
    the record carries the slowest rank's figure so a split can stand on it."""
    work = [0] * max(1, n)
    on_slices = set()
    for t, rank, c0, c1 in layout["slices"]:
        work[rank] += n * batch_per_gpu * layout["tables"][t][4] * (c1 - c0)
        on_slices.add(t)
    for t, table in enumerate(layout["tables"]):
        if t not in on_slices:
            work = [w + batch_per_gpu * table[4] * table[3] for w in work]
    return work


def gradient_bytes(layout: Dict[str, Any], batch_per_gpu: int):
    """(allreduced bytes, allgathered bytes per rank) of a step's gradient exchange: the dense
    parameters (and under --sparse-as-dense the replicated tables whole) allreduced; otherwise
    the replicated tables' looked-up rows and their ids allgathered (recsys.runtime.distributed.
    gradient_payload_bytes' count; model-parallel tables stay on their rank)."""
    reduce = layout["dense_params"] * BYTES_PER_PARAM + GRADIENT_EXTRAS_BYTES
    gather = 0
    for _, _, rows, width, hot, id_bytes, mp, *_ in layout["tables"]:
        if mp:
            continue
        if layout["sparse_as_dense"]:
            reduce += rows * width * BYTES_PER_PARAM
        else:
            gather += batch_per_gpu * hot * (width * BYTES_PER_PARAM + id_bytes)
    return reduce, gather


def _levels(n, gpn):
    """(GPUs per node used, nodes) of an n-rank job packed onto nodes of gpn GPUs."""
    g = min(n, gpn)
    return g, math.ceil(n / g)


def _shared_exchange(target: Target, collective: str, n: int, edge: Optional[str]):
    """(bus GB/s, latency us, k) of an n-rank collective among ranks that share a host's cores,
    measured at that sharing (the fabric's ``core_sharing.exchange``), or None: not a shared_nodes
    profile, or no figure measured."""
    if not target.host_cores:
        return None
    _, nodes = _levels(n, target.gpus_per_node)
    return target.fabric.sharing_exchange(n, "inter_node" if nodes > 1 else "intra_node", collective, edge)


def latency_ms(target: Target, collective: str, n: int, edge: Optional[str] = None) -> float:
    """One latency of a collective over n ranks: measured at the ranks' core sharing when the
    fabric has it, else the level's (between nodes when n spans several)."""
    shared = _shared_exchange(target, collective, n, edge)
    if shared:
        return shared[1] * 1e-3
    _, nodes = _levels(n, target.gpus_per_node)
    return target.fabric.latency_us("inter_node" if nodes > 1 else "intra_node", collective, edge) * 1e-3


def collective_ms(target: Target, collective: str, nbytes: float, n: int, edge: Optional[str] = None) -> float:
    """One collective of `nbytes` per rank (the nccl-tests `size`) over n ranks, hierarchical:
    latency + size x bus factor / bus bandwidth inside the node, then between the nodes. Ranks
    sharing a host's cores with an exchange measured at that sharing: one latency + size x bus
    factor(n) / the bandwidth measured there (the whole n-rank collective, both levels in it).
    `edge` ("fast" | "slow"): the fabric's figures at that end of their measured range."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    shared = _shared_exchange(target, collective, n, edge)
    if shared:
        return shared[1] * 1e-3 + nbytes * bus_factor(collective, n) / (shared[0] * 1e6)
    fab = target.fabric
    g, nodes = _levels(n, target.gpus_per_node)
    steps = max(1, math.ceil(math.log2(n)))
    t = 0.0
    if collective == "allreduce":
        # reduce-scatter + allreduce of 1/g between nodes + allgather (NCCL's hierarchical ring)
        if g > 1:
            t += fab.latency_us("intra_node", collective, edge) * 1e-3 * 2 * max(1, math.ceil(math.log2(g)))
            t += nbytes * bus_factor(collective, g) / (fab.bandwidth("intra_node", collective, g, edge) * 1e6)
        if nodes > 1:
            t += fab.latency_us("inter_node", collective, edge) * 1e-3 * 2 * max(1, math.ceil(math.log2(nodes)))
            t += (nbytes / g) * bus_factor(collective, nodes) / (fab.bandwidth("inter_node", collective, g, edge)
                                                                 * 1e6)
        return t
    # alltoall / allgather: the share of the size that crosses each level, the levels concurrent
    lat = latency_ms(target, collective, n, edge)
    lat *= steps if collective == "allgather" else 1
    intra = nbytes * (g - 1) / n / (fab.bandwidth("intra_node", collective, g, edge) * 1e6) if g > 1 else 0.0
    inter = nbytes * (n - g) / n / (fab.bandwidth("inter_node", collective, g, edge) * 1e6) if nodes > 1 else 0.0
    return lat + max(intra, inter)


@dataclass
class Projected:
    gpus: int
    nodes: int
    gpus_per_node: int
    batch_per_gpu: int
    phases_ms: Dict[str, float]
    step_ms_overlap: float                  # full overlap: the band's fast edge
    step_ms_serial: float                   # no overlap: its slow edge
    throughput_high: float
    throughput_low: float
    efficiency_high: float
    efficiency_low: float
    dominant: str
    embedding_bytes_slowest: int
    embedding_bytes_mean: float
    gradient_allreduce_bytes: int
    gradient_allgather_bytes: int
    memory_gb_per_rank: Optional[float]
    fits: Optional[bool]
    embedding_work_slowest: int = 0         # embedding_work's slowest rank (vector elements per step)
    embedding_work_ratio: Optional[float] = None    # that over the calibration point's (None: no split)
    compute_ms_range: Tuple[float, float] = (0.0, 0.0)     # compute over the split's range (the band's)
    exchange_ms_range: Tuple[float, float] = (0.0, 0.0)    # both exchanges at the fabric's fast, slow figures
    measured_throughput: Optional[float] = None
    published: List[Dict[str, Any]] = field(default_factory=list)


def core_share(target: Target, n: int, n0: int) -> float:
    """How much slower each rank computes at n ranks than at the calibration's n0 because ranks
    share a host's cores (profiles with `shared_nodes`: every rank on one host's cores): the
    fabric's measured `core_sharing` slowdown at n over that at n0 (jobs.profiles.fabric)."""
    if not target.host_cores:
        return 1.0
    fab = target.fabric
    return fab.sharing_slowdown(n, target.host_cores) / fab.sharing_slowdown(n0, target.host_cores)


def exchanges_ms(layout, target: Target, n: int, batch_per_gpu: int, edge: Optional[str] = None) -> Dict[str, Any]:
    """The exchanges of one step at n ranks: {"embedding_exchange", "gradient_exchange"} in ms and
    the bytes behind them ("sent": per rank, "reduce", "gather"); `edge`: at the fabric's fast or
    slow measured figures (collective_ms)."""
    sent = alltoall_bytes(layout, n, batch_per_gpu)
    slowest = max(sent) if sent else 0
    emb = 0.0
    if slowest:
        # three alltoalls (ids, vectors, vector gradients): three latencies; the slowest rank's
        # bytes are the part of an nccl-tests `size` that leaves the rank, size x (n-1)/n
        emb = collective_ms(target, "alltoall", slowest * n / (n - 1), n, edge) \
            + 2 * latency_ms(target, "alltoall", n, edge)
    reduce, gather = gradient_bytes(layout, batch_per_gpu)
    grad = collective_ms(target, "allreduce", reduce, n, edge) if n > 1 else 0.0
    if gather and n > 1:
        grad += collective_ms(target, "allgather", gather * n, n, edge)
    return {"embedding_exchange": emb, "gradient_exchange": grad, "sent": sent, "reduce": reduce, "gather": gather}


def project_point(layout, calibration, target, n, batch_per_gpu) -> Projected:
    g, nodes = _levels(n, target.gpus_per_node)
    work = max(embedding_work(layout, n, batch_per_gpu))
    ratio = work / calibration.embedding_work if calibration.embedding_work else None
    sharing = core_share(target, n, calibration.gpus)
    compute = calibration.compute_ms(batch_per_gpu, ratio) * sharing
    spans = [compute] + [calibration.compute_ms(batch_per_gpu, ratio, s) * sharing
                         for s in calibration.embedding_share_range]
    ex = exchanges_ms(layout, target, n, batch_per_gpu)
    emb, grad, sent, reduce, gather = (ex[k] for k in ("embedding_exchange", "gradient_exchange", "sent", "reduce",
                                                       "gather"))
    slowest = max(sent) if sent else 0
    phases = {"compute": compute, "embedding_exchange": emb, "gradient_exchange": grad}
    fast, slow = calibration.spread
    # the fabric's measured range: both exchanges at its fastest and its slowest figures
    ex_fast, ex_slow = (sum(exchanges_ms(layout, target, n, batch_per_gpu, edge)[k]
                            for k in ("embedding_exchange", "gradient_exchange")) for edge in EDGES)
    # the band's slow edge: no overlap, the slowest repeat, the split's slowest end, the fabric's
    # slowest figures; its fast edge: full overlap, the fastest repeat, the split's fastest end,
    # the fabric's fastest figures
    serial = max(spans) * slow + ex_slow
    overlap = max(min(spans) * fast, ex_fast)
    samples = n * batch_per_gpu
    per_gpu0 = calibration.batch_per_gpu / calibration.step_ms * 1000.0
    high, low = samples / overlap * 1000.0, samples / serial * 1000.0
    memory = max(layout["rank_bytes"]) / 1e9
    fits = memory <= target.gpu_memory_gb if target.gpu_memory_gb else None
    return Projected(gpus=n, nodes=nodes, gpus_per_node=g, batch_per_gpu=batch_per_gpu, phases_ms=phases,
                     step_ms_overlap=overlap, step_ms_serial=serial, throughput_high=high, throughput_low=low,
                     efficiency_high=high / n / per_gpu0, efficiency_low=low / n / per_gpu0,
                     dominant=max(phases, key=lambda name: phases[name]), embedding_bytes_slowest=int(slowest),
                     embedding_bytes_mean=(sum(sent) / len(sent)) if sent else 0.0,
                     gradient_allreduce_bytes=int(reduce) if n > 1 else 0,
                     gradient_allgather_bytes=int(gather) if n > 1 else 0,
                     memory_gb_per_rank=memory, fits=fits,
                     embedding_work_slowest=work, embedding_work_ratio=ratio,
                     compute_ms_range=(min(spans), max(spans)), exchange_ms_range=(ex_fast, ex_slow))


def project(layouts: Dict[int, Dict[str, Any]], calibration: Calibration, target: Target, scaling: str,
            batch: int, model: str, source: str = "") -> Dict[str, Any]:
    """The projection record: per GPU count (the layouts' keys) the band, the phases, the bytes
    and the memory. `batch`: the global batch (strong scaling) or the batch per GPU (weak)."""
    points = []
    for n in sorted(layouts):
        why = target.refusal(n)
        if why:
            raise RequestError(f"--gpus: {why}")
        if scaling == "strong" and batch % n:
            raise RequestError(f"--gpus: the global batch {batch} does not divide over {n} GPUs (strong scaling)")
        b = batch // n if scaling == "strong" else batch
        points.append(project_point(layouts[n], calibration, target, n, b))
    return {"version": PROJECTION_VERSION, "model": model, "profile": target.profile, "scaling": scaling,
            "batch": batch, "source": source, "calibration": asdict(calibration),
            "fabric": {"source": target.fabric.source, "measured": bool(target.fabric.measured),
                       "core_sharing": target.fabric.core_sharing.get("source") if target.host_cores else None,
                       "exchange_sharing": target.fabric.core_sharing.get("exchange_source")
                       if target.host_cores else None},
            "shared_host_cores": target.host_cores, "points": [asdict(p) for p in points]}


def within(measured: float, low: float, high: float, tolerance=0.2) -> Dict[str, Any]:
    """Where a measured or published throughput falls against a band: inside, or the error
    relative to the nearer edge, and whether that is within `tolerance` (the 20 % goal)."""
    if low <= measured <= high:
        return {"inside": True, "error": 0.0, "ok": True}
    edge = low if measured < low else high
    error = (measured - edge) / edge
    return {"inside": False, "error": error, "ok": abs(error) <= tolerance}
