"""`recsys-submit study project`: what N GPUs of a profile would deliver, from one measured (or
published, or given) step time, the model's sizes and the profile's fabric.

A phase-level alpha-beta model (docs/studies.md, "Projecting a study" states every formula):

- compute per rank = the calibration's batch-proportional time x (per-GPU batch / calibration's)
  + its fixed time (the optimizer), or with a measured compute curve (one GPU at several
  batches) the calibration's step x curve(b) / curve(b0); x the core-sharing factor (profiles
  with `shared_nodes`: N ranks on one host's C cores; above C the fabric's measured slowdown,
  else N/C), relative to the calibration's;
- the embedding placement is the engine's own (``python -m recsys.plan_tables``: the planner
  recsys-train uses), and the slowest rank's tables set the alltoall bytes: ids and vector
  gradients it sends for the other ranks' tables, and its tables' vectors for every other rank;
- the dense gradient allreduce is a constant payload; the replicated tables' sparse gradients
  are allgathered (grow with the ranks);
- a collective over a level costs latency + bytes x nccl-tests' bus factor / the level's bus
  bandwidth (fabric: nominal, or measured); inside a node and between nodes hierarchically;
- the band runs from no overlap (compute + exchanges) to full overlap (the larger of the two).

No constant here is fitted: bandwidths and latencies are the profile's fabric (with its
source), compute is the calibration's (and a measured curve's), the core-sharing slowdown the
fabric's measured one. Standard library only (login nodes), PyYAML for a compute-curve file as
for the profiles; the plot uses matplotlib when installed (jobs.study.report.load_pyplot).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from jobs.errors import RequestError
from jobs.profiles.fabric import bus_factor

PHASES = ("compute", "embedding_exchange", "gradient_exchange")
BYTES_PER_PARAM = 4
PLANNER = [sys.executable, "-m", "recsys.plan_tables"]
PROJECTION_VERSION = 2     # 2: calibration.curve, fabric.core_sharing


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

    @property
    def step_ms(self):
        return self.scaled_ms + self.fixed_ms

    def compute_ms(self, batch_per_gpu: int) -> float:
        """Compute per rank at a batch per GPU, before core sharing. One point (no curve): its
        batch-proportional part scaled with the batch plus its fixed part. A curve of >= 2
        batches gives the shape, the calibration the level: step_ms x curve(b) / curve(b0)."""
        pts = sorted({int(b): float(t) for b, t in self.curve}.items())
        if len(pts) < 2:
            return self.scaled_ms * batch_per_gpu / self.batch_per_gpu + self.fixed_ms
        return self.step_ms * curve_ms(pts, batch_per_gpu) / curve_ms(pts, self.batch_per_gpu)


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

    @classmethod
    def of(cls, profile):
        if profile.fabric is None:
            raise RequestError(f"--profile: profile {profile.name!r} has no fabric: section (docs/profiles.md, "
                               "\"Fabric\"); a projection needs the links' bandwidths and latencies")
        node = profile.node
        return cls(profile=profile.name, gpus_per_node=max(1, node.gpus), gpu_memory_gb=node.gpu_memory_gb,
                   fabric=profile.fabric,
                   host_cores=node.sockets * node.cores_per_socket if profile.shared_nodes else None)


def _planner(request, command=None) -> Dict[int, Dict[str, Any]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (_repo_root(), os.environ.get("PYTHONPATH")) if p))
    command = command or PLANNER
    try:
        proc = subprocess.run(command, input=json.dumps(request), capture_output=True, text=True, env=env)
    except OSError as exc:      # e.g. an interpreter this user may not run: the section says so, one line
        raise RequestError(f"cannot run the engine's planner ({command[0]}): {exc.strerror}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RequestError(f"the engine refused the model: {last}")
    return {int(k): v for k, v in json.loads(proc.stdout).items()}


def layouts_of_argv(argv_by_gpus: Dict[int, List[str]], command=None) -> Dict[int, Dict[str, Any]]:
    """What recsys-train builds for each GPU count's command line (python -m recsys.plan_tables):
    tables with their hotness and id size, the model-parallel slices, the dense parameters."""
    return _planner({"points": [{"world_size": n, "argv": list(a)} for n, a in sorted(argv_by_gpus.items())]},
                    command)


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


def gradient_bytes(layout: Dict[str, Any], batch_per_gpu: int):
    """(allreduced bytes, allgathered bytes per rank) of a step's gradient exchange: the dense
    parameters (and under --sparse-as-dense the replicated tables whole) allreduced; otherwise
    the replicated tables' looked-up rows and their ids allgathered (recsys.distributed.
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


def collective_ms(target: Target, collective: str, nbytes: float, n: int) -> float:
    """One collective of `nbytes` per rank (the nccl-tests `size`) over n ranks, hierarchical:
    latency + size x bus factor / bus bandwidth inside the node, then between the nodes."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    fab = target.fabric
    g, nodes = _levels(n, target.gpus_per_node)
    steps = max(1, math.ceil(math.log2(n)))
    t = 0.0
    if collective == "allreduce":
        # reduce-scatter + allreduce of 1/g between nodes + allgather (NCCL's hierarchical ring)
        if g > 1:
            t += fab.latency_us("intra_node", collective) * 1e-3 * 2 * max(1, math.ceil(math.log2(g)))
            t += nbytes * bus_factor(collective, g) / (fab.bandwidth("intra_node", collective, g) * 1e6)
        if nodes > 1:
            t += fab.latency_us("inter_node", collective) * 1e-3 * 2 * max(1, math.ceil(math.log2(nodes)))
            t += (nbytes / g) * bus_factor(collective, nodes) / (fab.bandwidth("inter_node", collective, g) * 1e6)
        return t
    # alltoall / allgather: the share of the size that crosses each level, the levels concurrent
    lat = fab.latency_us("inter_node" if nodes > 1 else "intra_node", collective) * 1e-3
    lat *= steps if collective == "allgather" else 1
    intra = nbytes * (g - 1) / n / (fab.bandwidth("intra_node", collective, g) * 1e6) if g > 1 else 0.0
    inter = nbytes * (n - g) / n / (fab.bandwidth("inter_node", collective, g) * 1e6) if nodes > 1 else 0.0
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


def project_point(layout, calibration, target, n, batch_per_gpu) -> Projected:
    g, nodes = _levels(n, target.gpus_per_node)
    compute = calibration.compute_ms(batch_per_gpu) * core_share(target, n, calibration.gpus)
    sent = alltoall_bytes(layout, n, batch_per_gpu)
    slowest = max(sent) if sent else 0
    emb = 0.0
    if slowest:
        # three alltoalls (ids, vectors, vector gradients): three latencies; the slowest rank's
        # bytes are the part of an nccl-tests `size` that leaves the rank, size x (n-1)/n
        level = "inter_node" if nodes > 1 else "intra_node"
        emb = collective_ms(target, "alltoall", slowest * n / (n - 1), n) \
            + 2 * target.fabric.latency_us(level, "alltoall") * 1e-3
    reduce, gather = gradient_bytes(layout, batch_per_gpu)
    grad = collective_ms(target, "allreduce", reduce, n) if n > 1 else 0.0
    if gather and n > 1:
        grad += collective_ms(target, "allgather", gather * n, n)
    phases = {"compute": compute, "embedding_exchange": emb, "gradient_exchange": grad}
    serial = sum(phases.values())
    overlap = max(compute, emb + grad)
    samples = n * batch_per_gpu
    per_gpu0 = calibration.batch_per_gpu / calibration.step_ms * 1000.0
    high, low = samples / overlap * 1000.0, samples / serial * 1000.0
    memory = max(layout["rank_bytes"]) / 1e9
    fits = memory <= target.gpu_memory_gb if target.gpu_memory_gb else None
    return Projected(gpus=n, nodes=nodes, gpus_per_node=g, batch_per_gpu=batch_per_gpu, phases_ms=phases,
                     step_ms_overlap=overlap, step_ms_serial=serial, throughput_high=high, throughput_low=low,
                     efficiency_high=high / n / per_gpu0, efficiency_low=low / n / per_gpu0,
                     dominant=max(phases, key=phases.get), embedding_bytes_slowest=int(slowest),
                     embedding_bytes_mean=(sum(sent) / len(sent)) if sent else 0.0,
                     gradient_allreduce_bytes=int(reduce) if n > 1 else 0,
                     gradient_allgather_bytes=int(gather) if n > 1 else 0,
                     memory_gb_per_rank=memory, fits=fits)


def project(layouts: Dict[int, Dict[str, Any]], calibration: Calibration, target: Target, scaling: str,
            batch: int, model: str, source: str = "") -> Dict[str, Any]:
    """The projection record: per GPU count (the layouts' keys) the band, the phases, the bytes
    and the memory. `batch`: the global batch (strong scaling) or the batch per GPU (weak)."""
    points = []
    for n in sorted(layouts):
        if scaling == "strong" and batch % n:
            raise RequestError(f"--gpus: the global batch {batch} does not divide over {n} GPUs (strong scaling)")
        b = batch // n if scaling == "strong" else batch
        points.append(project_point(layouts[n], calibration, target, n, b))
    return {"version": PROJECTION_VERSION, "model": model, "profile": target.profile, "scaling": scaling,
            "batch": batch, "source": source, "calibration": asdict(calibration),
            "fabric": {"source": target.fabric.source, "measured": bool(target.fabric.measured),
                       "core_sharing": target.fabric.core_sharing.get("source") if target.host_cores else None},
            "shared_host_cores": target.host_cores, "points": [asdict(p) for p in points]}


def within(measured: float, low: float, high: float, tolerance=0.2) -> Dict[str, Any]:
    """Where a measured or published throughput falls against a band: inside, or the error
    relative to the nearer edge, and whether that is within `tolerance` (the 20 % goal)."""
    if low <= measured <= high:
        return {"inside": True, "error": 0.0, "ok": True}
    edge = low if measured < low else high
    error = (measured - edge) / edge
    return {"inside": False, "error": error, "ok": abs(error) <= tolerance}


# ------------------------------------------------------------------ from a study's report


def calibration_of_report(report: Dict[str, Any], variant: Optional[str] = None):
    """(Calibration, {gpus: measured throughput}, variant) of a study report (jobs.study.report.build,
    scaling.json): calibrated on the smallest measured point's timed step. With a step breakdown
    there, its exchanges are taken out and its optimizer kept fixed, the parts scaled by timed /
    split step (the split step waits after each unit; the timed step is what a run delivers)."""
    variant = variant or report["variants"][0]
    if variant not in report["variants"]:
        raise RequestError(f"--variant: {variant!r} is not a variant of study {report.get('study')} "
                           f"({', '.join(report['variants'])})")
    rows = [r for r in report["rows"] if (r["variants"].get(variant) or {}).get("throughput")]
    if not rows:
        raise RequestError(f"study {report.get('study')}: no measured point of variant {variant!r} to calibrate on")
    measured = {r["gpus"]: r["variants"][variant]["throughput"] for r in rows}
    base = min(rows, key=lambda r: r["gpus"])
    cell = base["variants"][variant]
    timed = cell["step_time_ms"]
    bd = cell.get("breakdown")
    scaled, fixed, how = timed, 0.0, f"timed step {timed:.3f} ms"
    if bd and bd.get("mean", {}).get("step_ms"):
        ph = {k: v["ms"] for k, v in bd["mean"]["phases"].items()}
        k = timed / bd["mean"]["step_ms"]
        exchanges = (ph.get("embedding_exchange", 0.0) + ph.get("gradient_exchange", 0.0)) * k
        fixed = ph.get("optimizer", 0.0) * k
        scaled = max(0.0, timed - exchanges - fixed)
        how += f", its breakdown's exchanges out and optimizer fixed (parts x timed/split step {k:.2f})"
    calib = Calibration(gpus=base["gpus"], batch_per_gpu=base["batch_per_gpu"], scaled_ms=scaled, fixed_ms=fixed,
                        source=f"study {report.get('study')}, {base['gpus']} GPU(s): {how}")
    return calib, measured, variant


# ------------------------------------------------------------------ a measured compute curve

CURVE_VERSION = 1


def _curve_file(path) -> List[Tuple[int, float]]:
    """(batch per GPU, step ms) points of a compute-curve file (YAML or JSON): version 1,
    source, points: [{batch_per_gpu, step_ms}, ...] of one GPU."""
    import yaml
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise RequestError(f"--compute-curve: {path}: not readable ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or data.get("version") != CURVE_VERSION or not isinstance(data.get("points"), list):
        raise RequestError(f"--compute-curve: {path}: not a compute curve (version: {CURVE_VERSION}, source, "
                           "points: [{batch_per_gpu, step_ms}, ...])")
    out = []
    for i, pt in enumerate(data["points"]):
        b = pt.get("batch_per_gpu") if isinstance(pt, dict) else None
        t = pt.get("step_ms") if isinstance(pt, dict) else None
        if isinstance(b, bool) or not isinstance(b, int) or b < 1 or isinstance(t, bool) \
                or not isinstance(t, (int, float)) or not t > 0:
            raise RequestError(f"--compute-curve: {path}: points[{i}]: give batch_per_gpu (a positive integer) "
                               "and step_ms (a positive time)")
        out.append((b, float(t)))
    return out


def compute_curve(paths) -> Tuple[List[Tuple[int, float]], str]:
    """A measured compute curve of one GPU, (points, source), from compute-curve files and/or
    study directories (each: its 1-GPU point's calibration step, exchanges out): at least two
    batches per GPU. RequestError (one line naming the path) otherwise."""
    if isinstance(paths, str):
        paths = [p for p in paths.split(",") if p.strip()]
    points: Dict[int, float] = {}
    for path in paths:
        path = path.strip()
        if os.path.isdir(path) and os.path.isfile(os.path.join(path, "study.json")):
            calib, _, _ = calibration_of_report(_study_report(path))
            if calib.gpus != 1:
                raise RequestError(f"--compute-curve: {path}: its smallest measured point has {calib.gpus} GPUs; "
                                   "a compute curve is one GPU's step at several batches")
            got = [(calib.batch_per_gpu, calib.step_ms)]
        elif os.path.isfile(path):
            got = _curve_file(path)
        else:
            raise RequestError(f"--compute-curve: {path!r} is neither a compute-curve file nor a study directory")
        for b, t in got:
            if b in points and points[b] != t:
                raise RequestError(f"--compute-curve: {path}: batch {b} per GPU is measured twice")
            points[b] = t
    if len(points) < 2:
        raise RequestError("--compute-curve: give one GPU's step at two batch sizes or more "
                           f"(got {len(points)})")
    pts = sorted(points.items())
    return pts, "measured compute curve: " + ", ".join(str(p) for p in paths) + \
        " (batches " + ", ".join(str(b) for b, _ in pts) + " per GPU)"


def with_curve(calibration: Optional[Calibration], paths, batch_per_gpu: int) -> Calibration:
    """The calibration with a measured compute curve: the curve gives the shape of compute vs
    batch per GPU, the calibration (when there is one) its level; without one, the curve's own
    value at `batch_per_gpu` on 1 GPU is the calibration."""
    pts, source = compute_curve(paths)
    if calibration is None:
        return Calibration(gpus=1, batch_per_gpu=batch_per_gpu, scaled_ms=curve_ms(pts, batch_per_gpu),
                           source=source, curve=tuple(pts), curve_source=source)
    return replace(calibration, curve=tuple(pts), curve_source=source)


# ------------------------------------------------------------------ output


def markdown(record: Dict[str, Any]) -> str:
    c = record["calibration"]
    lines = [f"# Projection: {record['model']} on {record['profile']} ({record['scaling']} scaling, "
             f"{'global' if record['scaling'] == 'strong' else 'per-GPU'} batch {record['batch']})", "",
             f"Calibration: {c['source']} ({c['gpus']} GPU(s), batch {c['batch_per_gpu']} per GPU, "
             f"{c['scaled_ms']:.3f} ms scaled + {c['fixed_ms']:.3f} ms fixed).",
             f"Fabric: {record['fabric']['source']}" + (" (measured bus bandwidths)" if record['fabric']['measured']
                                                        else ""), ""]
    if c.get("curve"):
        lines[-1:-1] = [f"Compute vs batch per GPU: {c['curve_source']}, log-log between the measured batches, "
                        "their affine fit outside."]
    if record.get("shared_host_cores"):
        lines[-1:-1] = [f"Ranks share the host's {record['shared_host_cores']} cores: "
                        + (record["fabric"].get("core_sharing") or "an even share of the cores (not measured)") + "."]
    lines += [
             "| GPUs | nodes | batch/GPU | step ms (overlap - serial) | samples/s (low - high) | efficiency | "
             "compute ms | embedding exchange ms | gradient exchange ms | dominant | GB per rank | measured |",
             "|---:|---:|---:|---|---|---|---:|---:|---:|---|---:|---|"]
    for p in record["points"]:
        ph = p["phases_ms"]
        mem = "-" if p["memory_gb_per_rank"] is None else f"{p['memory_gb_per_rank']:.3f}" + \
            ("" if p["fits"] in (None, True) else " DOES NOT FIT")
        meas = "-" if p.get("measured_throughput") is None else f"{p['measured_throughput']:,.0f}"
        for pub in p.get("published", []):
            meas += f"; published {pub['throughput']:,.0f} ({pub['table']})"
        lines.append(f"| {p['gpus']} | {p['nodes']} | {p['batch_per_gpu']} | {p['step_ms_overlap']:.3f} - "
                     f"{p['step_ms_serial']:.3f} | {p['throughput_low']:,.0f} - {p['throughput_high']:,.0f} | "
                     f"{p['efficiency_low']:.2f} - {p['efficiency_high']:.2f} | {ph['compute']:.3f} | "
                     f"{ph['embedding_exchange']:.3f} | {ph['gradient_exchange']:.3f} | {p['dominant']} | {mem} | "
                     f"{meas} |")
    lines += ["", "The band runs from no overlap of compute and exchanges (low) to full overlap (high); "
              "docs/studies.md, \"Projecting a study\", gives every formula."]
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ("gpus", "nodes", "gpus_per_node", "batch_per_gpu", "step_ms_overlap", "step_ms_serial",
               "throughput_low", "throughput_high", "efficiency_low", "efficiency_high", "compute_ms",
               "embedding_exchange_ms", "gradient_exchange_ms", "dominant", "embedding_bytes_slowest",
               "memory_gb_per_rank", "fits", "measured_throughput")


def csv_text(record: Dict[str, Any]) -> str:
    import csv
    import io
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for p in record["points"]:
        flat = dict(p, **{f"{k}_ms": v for k, v in p["phases_ms"].items()})
        w.writerow(["" if flat.get(k) is None else flat[k] for k in CSV_COLUMNS])
    return out.getvalue()


def figure(record: Dict[str, Any]):
    """Log-log throughput vs GPUs: the band, the measured points, the published rows."""
    from .report import load_pyplot
    plt = load_pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    pts = record["points"]
    xs = [p["gpus"] for p in pts]
    ax.fill_between(xs, [p["throughput_low"] for p in pts], [p["throughput_high"] for p in pts], alpha=0.3,
                    label="projected band (no overlap - full overlap)")
    ax.plot(xs, [p["throughput_high"] for p in pts], lw=1)
    ax.plot(xs, [p["throughput_low"] for p in pts], lw=1)
    meas = [(p["gpus"], p["measured_throughput"]) for p in pts if p.get("measured_throughput")]
    if meas:
        ax.plot(*zip(*meas), "ko", label="measured (this study)")
    pub = [(p["gpus"], q["throughput"]) for p in pts for q in p.get("published", [])]
    if pub:
        ax.plot(*zip(*pub), "r^", ms=8, label="published")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("samples/s")
    ax.set_title(f"{record['model']} on {record['profile']}: projected throughput")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write(record: Dict[str, Any], out_dir: str, want_plot=None) -> Dict[str, str]:
    """projection.{md,csv,json} (+ projection.png) in out_dir, written as one group."""
    from jobs.runs.atomic import write_group

    from .report import make_out_dir, plot_wanted, png
    draw = plot_wanted(want_plot)
    make_out_dir(out_dir)
    paths = {k: os.path.join(out_dir, f"projection.{k}") for k in ("md", "csv", "json")}
    files = {paths["md"]: markdown(record), paths["csv"]: csv_text(record),
             paths["json"]: json.dumps(record, indent=2) + "\n"}
    if draw:
        paths["png"] = os.path.join(out_dir, "projection.png")
        files[paths["png"]] = png(figure(record))
    write_group(files)
    return paths


# ------------------------------------------------------------------ the command


def parse_gpus(text) -> List[int]:
    """--gpus 8,16,64: positive GPU counts (one line naming the flag otherwise)."""
    out = []
    for field_ in str(text).split(","):
        try:
            n = int(field_.strip())
        except ValueError:
            raise RequestError(f"--gpus: {field_.strip()!r} is not a GPU count (give e.g. 8,16,64)") from None
        if n < 1:
            raise RequestError(f"--gpus: {n} is not a positive GPU count")
        out.append(n)
    if not out:
        raise RequestError("--gpus: give at least one GPU count, e.g. 8,16,64")
    return sorted(set(out))


def _variant(spec, label):
    """(variant dict, label) of the spec: the one named, else the first combination."""
    import itertools

    from .spec import _variant_label
    combos = [dict(zip(spec.variants, c)) for c in itertools.product(*spec.variants.values())] \
        if spec.variants else [{}]
    for combo in combos:
        if label is None or _variant_label(combo) == label:
            return combo, _variant_label(combo)
    raise RequestError(f"--variant: {label!r} is not a variant of the spec "
                       f"({', '.join(_variant_label(c) for c in combos)})")


def _study_report(study_dir):
    """The report of a study directory: the one `study report` wrote, else built now."""
    path = os.path.join(study_dir, "report", "scaling.json")
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    from .report import build
    from .run import StudyRecord, poll
    record = StudyRecord.load(study_dir)
    return build(record, poll(record))


def _published_rows(spec, variant, profile, counts):
    """Published rows of the spec's model on the profile's platform at the spec's batch, precision
    and XLA, whose GPU count is projected: {gpus: [row entries]}."""
    from . import published
    platform = published.platform_of(profile)
    if platform is None:
        return {}
    precision, xla = published.settings_of(spec.engine_args, variant, platform)
    out: Dict[int, List[Dict[str, Any]]] = {}
    for row in published.rows(spec.model, platform):
        same_batch = (row.gpus * row.batch_per_gpu == spec.batch_size) if spec.scaling == "strong" \
            else row.batch_per_gpu == spec.batch_size
        if same_batch and precision in row.throughput and (row.xla is None or row.xla == xla) and row.gpus in counts:
            out.setdefault(row.gpus, []).append({"throughput": row.throughput[precision], "table": row.table,
                                                 "model_size": row.model_size, "version": row.version})
    return out


def published_calibration(spec, combo, profile) -> Calibration:
    """The calibration a published 1-GPU row gives: NVIDIA's row of the spec's model on the
    profile's platform at the spec's 1-GPU batch, precision and XLA (batch / samples per second).
    RequestError (one line) when there is none."""
    from . import published
    platform = published.platform_of(profile)
    if platform is None:
        raise RequestError(f"--published: profile {profile.name!r} is not a platform NVIDIA published for")
    precision, xla = published.settings_of(spec.engine_args, combo, platform)
    for row in published.rows(spec.model, platform):
        if row.gpus == 1 and row.batch_per_gpu == spec.batch_size and precision in row.throughput \
                and (row.xla is None or row.xla == xla):
            step = row.batch_per_gpu / row.throughput[precision] * 1000.0
            return Calibration(gpus=1, batch_per_gpu=row.batch_per_gpu, scaled_ms=step,
                               source=f"published {row.table} ({row.version}), {platform} 1 GPU {precision}"
                                      + ("" if row.xla is None else f", xla {str(row.xla).lower()}")
                                      + f": {row.throughput[precision]:,.0f} samples/s")
    raise RequestError(f"--published: NVIDIA published no 1-GPU {spec.model} row on {platform} at batch "
                       f"{spec.batch_size}, {precision}" + (", xla" if xla else "")
                       + " (`recsys-submit study reference --list`)")


def run(source, profile, gpus, variant=None, step_ms=None, planner=None, report=None,
        use_published=False, compute_curve=None) -> Dict[str, Any]:
    """The projection of a study directory (calibrated on its smallest measured point) or of a
    spec file (calibrated on `step_ms`, a 1-GPU step time the user gives, or with `use_published`
    on NVIDIA's published 1-GPU row of the same model, batch and precision) onto `gpus` GPU counts
    of a loaded profile. The measured points of the study are projected too and overlaid; the
    published rows of the same model, platform, batch and precision are marked. `report`: a study
    report (dict, or the path of a scaling.json) to calibrate a spec file on (a recorded study).
    `compute_curve`: compute-curve files or 1-GPU study directories (see `compute_curve`), one GPU
    measured at several batches, replacing the proportional scaling of compute with the batch."""
    from .spec import load_spec
    target = Target.of(profile)
    counts = parse_gpus(gpus) if not isinstance(gpus, (list, tuple)) else sorted(set(int(n) for n in gpus))
    if use_published and step_ms is not None:
        raise RequestError("--published/--step-ms: give one calibration, not both")
    if os.path.isdir(source) and os.path.isfile(os.path.join(source, "study.json")):
        from .spec import StudySpec
        from .run import StudyRecord
        record = StudyRecord.load(source)
        spec = StudySpec.from_dict(record.spec, source=os.path.join(source, "study.yaml"))
        report = _study_report(source)
        what = f"study {spec.name}"
    elif os.path.isfile(source):
        spec = load_spec(source)
        what = f"spec {source}"
        if isinstance(report, str):
            with open(report) as f:
                report = json.load(f)
    else:
        raise RequestError(f"SPEC | STUDY_DIR: {source!r} is neither a study spec file nor a study directory")
    combo, label = _variant(spec, variant)
    calibration, measured = None, {}
    if report is not None:
        try:
            calibration, measured, _ = calibration_of_report(report, label)
        except RequestError:
            if not (use_published or step_ms is not None or compute_curve):
                raise
    if use_published:
        calibration = published_calibration(spec, combo, profile)
    elif step_ms is not None:
        if not step_ms > 0:
            raise RequestError(f"--step-ms: {step_ms:g} is not a positive time")
        per_gpu = spec.batch_size
        calibration = Calibration(gpus=1, batch_per_gpu=per_gpu, scaled_ms=float(step_ms),
                                  source=f"--step-ms {step_ms:g}: one GPU's step at batch {per_gpu}")
    if compute_curve:
        calibration = with_curve(calibration, compute_curve, spec.batch_size)
    elif calibration is None:
        raise RequestError(f"{what}: nothing measured to calibrate on; give --step-ms (a 1-GPU step time "
                           "at the spec's batch) or --published (NVIDIA's 1-GPU row), or run the study's "
                           "smallest point first")
    return _project_spec(spec, combo, label, profile, target, counts, calibration, measured, what, planner)


def _project_spec(spec, combo, label, profile, target, counts, calibration, measured, what, planner=None):
    """The projection record of a spec's variant at `counts` (and the measured and published
    counts), with the measured points and published rows beside their bands."""
    from .published import check_data_path
    from .spec import point_args
    check_data_path(spec)
    published = _published_rows(spec, combo, profile, set(counts) | set(measured) | set(spec.gpus or []))
    counts = sorted(set(counts) | set(measured) | set(published) | {calibration.gpus})
    argv = {}
    for n in counts:
        if spec.scaling == "strong" and spec.batch_size % n:
            raise RequestError(f"--gpus: the spec's global batch {spec.batch_size} does not divide over {n} GPUs")
        global_batch = spec.batch_size if spec.scaling == "strong" else spec.batch_size * n
        argv[n] = ["--model", spec.model, "--run-mode", "benchmark"] + point_args(spec, global_batch, combo)
    layouts = layouts_of_argv(argv, planner)
    record = project(layouts, calibration, target, spec.scaling, spec.batch_size, spec.model,
                     source=f"{what}, variant {label}")
    for p in record["points"]:
        p["measured_throughput"] = measured.get(p["gpus"])
        p["published"] = published.get(p["gpus"], [])
        if p["measured_throughput"]:
            p["measured_vs_band"] = within(p["measured_throughput"], p["throughput_low"], p["throughput_high"])
        for q in p["published"]:
            q["vs_band"] = within(q["throughput"], p["throughput_low"], p["throughput_high"])
    return record


# ------------------------------------------------------------------ the report's section


def for_report(record, report) -> Optional[Dict[str, Any]]:
    """The "Projection" section's data of `study report` (None when the study's profile has no
    fabric or nothing is measured): the measured points of the first variant with their bands,
    and the bands of the next sizes up (2x, 4x, 8x the largest measured). A projection the
    engine's planning refuses (a dataset not readable here) is {"error": one line}."""
    from jobs.profiles import load_profile

    from .spec import StudySpec
    try:
        profile = load_profile(record.profile_path or record.profile)
    except (ValueError, OSError):
        return None
    if profile.fabric is None:
        return None
    try:
        spec = StudySpec.from_dict(record.spec, source=os.path.join(record.study_dir, "study.yaml"))
        combo, label = _variant(spec, report["variants"][0] if report.get("variants") else None)
        calibration, measured, _ = calibration_of_report(report, label)
    except RequestError:
        return None         # nothing measured yet
    top = max(measured)
    counts = [k * top for k in (2, 4, 8) if spec.scaling != "strong" or spec.batch_size % (k * top) == 0]
    try:
        out = _project_spec(spec, combo, label, profile, Target.of(profile), counts, calibration, measured,
                            f"study {spec.name}")
    except RequestError as exc:
        return {"error": str(exc).splitlines()[0]}
    out["next_sizes"] = counts
    return out
