"""A profile's fabric: how fast its GPUs talk inside a node and between nodes.

The ``fabric:`` section of a profile gives, per level, the link, the bandwidth per GPU and per
direction (GB/s, 1e9 bytes) and a latency per collective (microseconds), with the source of the
figures; ``measured`` bus bandwidths per collective and level (nccl-tests or the toolkit's own
collective micro-benchmark, ``python -m bench.collectives``) override the nominal bandwidth of
that collective. ``jobs.study.analysis.projection`` is its only reader. Standard library only.

    fabric:
      source: "NVIDIA DGX A100 datasheet; NCCL src/graph/tuning.cc latencies"
      intra_node: {link: nvswitch, gb_per_s: 300, latency_us: 11.8}
      inter_node: {link: infiniband, nics: 8, nic_gb_per_s: 25, latency_us: 22.4}
      measured:                      # optional
        source: "nccl-tests 2.13 on 2 nodes, 2026-11-27"
        intra_node: {allreduce: {busbw_gb_per_s: 230, latency_us: 20}}
      core_sharing:                  # optional: ranks sharing a host's cores (bench/bench_core_sharing.py)
        source: "measured: ..."
        cores: 2
        slowdown: {1: 1.0, 2: 1.1, 4: 2.9, 8: 6.0}
      gpu:                           # optional: one GPU's peak rates (the projection's compute split)
        source: "NVIDIA A100 datasheet"
        tflops: {fp32: 19.5, tf32: 156, amp: 312}
        memory_gb_per_s: 2039
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

__all__ = ["Level", "Fabric", "FABRIC_KEYS", "LEVELS", "COLLECTIVES", "fabric_from_raw", "parse_nccl_tests",
           "bus_factor"]

LEVELS = ("intra_node", "inter_node")
COLLECTIVES = ("allreduce", "alltoall", "allgather")
INTRA_LINKS = ("nvlink", "nvswitch", "pcie", "shared_memory", "loopback")
INTER_LINKS = ("infiniband", "ethernet", "roce", "loopback")
FABRIC_KEYS = {"source", "intra_node", "inter_node", "measured", "core_sharing", "gpu"}
GPU_KEYS = {"source", "tflops", "memory_gb_per_s"}
PRECISIONS = ("fp32", "tf32", "amp")
CORE_SHARING_KEYS = {"source", "cores", "slowdown"}
LEVEL_KEYS = {"intra_node": {"link", "gb_per_s", "latency_us"},
              "inter_node": {"link", "nics", "nic_gb_per_s", "latency_us"}}
MEASURED_KEYS = {"busbw_gb_per_s", "latency_us"}


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor (doc/PERFORMANCE.md): bus bw = algorithm bw x factor,
    so a collective of `size` bytes takes size x factor / bus bw."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n if collective == "allreduce" else (n - 1) / n


@dataclass(frozen=True)
class Level:
    """One level of the fabric. Inside a node `gb_per_s` is per GPU; between nodes a node has
    `nics` NICs of `nic_gb_per_s` each (a GPU's share: nics x rate / GPUs per node)."""

    link: str
    latency_us: float
    gb_per_s: Optional[float] = None
    nics: Optional[int] = None
    nic_gb_per_s: Optional[float] = None

    def per_gpu_gb_per_s(self, gpus_per_node: int) -> float:
        if self.gb_per_s is not None:
            return float(self.gb_per_s)
        assert self.nics is not None and self.nic_gb_per_s is not None    # checked when the fabric was read
        return float(self.nics) * float(self.nic_gb_per_s) / max(1, gpus_per_node)


@dataclass(frozen=True)
class Fabric:
    """The checked ``fabric:`` section (plain data in the file format: asdict loads back)."""

    source: str
    intra_node: Level
    inter_node: Optional[Level] = None
    # {"source": str, level: {collective: {"busbw_gb_per_s": x, "latency_us": y}}}
    measured: Dict[str, Any] = field(default_factory=dict)
    # {"source": str, "cores": C, "slowdown": {k: one rank's step with k ranks on the C cores / alone}}
    core_sharing: Dict[str, Any] = field(default_factory=dict)
    # {"source": str, "tflops": {precision: peak}, "memory_gb_per_s": x}: one GPU's peak rates
    gpu: Dict[str, Any] = field(default_factory=dict)

    def gpu_rates(self, precision: str):
        """(peak FLOP/s, memory bytes/s) of one GPU at a precision (tf32 | fp32 | amp), or None
        when the fabric states no `gpu:` rates for it."""
        tflops = (self.gpu.get("tflops") or {}).get(precision)
        if not tflops or not self.gpu.get("memory_gb_per_s"):
            return None
        return float(tflops) * 1e12, float(self.gpu["memory_gb_per_s"]) * 1e9

    def sharing_slowdown(self, ranks: int, cores: int) -> float:
        """How much slower a rank's compute runs with `ranks` ranks on a host's `cores` cores
        than alone: 1 while ranks <= cores; above, the measured slowdown (``core_sharing``:
        linear between the measured k, beyond the largest in proportion to k), else ranks / cores
        (an even share of the cores, not measured)."""
        if ranks <= cores:
            return 1.0
        table = {int(k): float(v) for k, v in (self.core_sharing.get("slowdown") or {}).items()}
        if not table:
            return ranks / cores
        ks = sorted(table)
        if ranks >= ks[-1]:
            return table[ks[-1]] * ranks / ks[-1]
        if ranks <= ks[0]:
            return table[ks[0]]
        for k0, k1 in zip(ks, ks[1:]):
            if k0 <= ranks <= k1:
                return table[k0] + (table[k1] - table[k0]) * (ranks - k0) / (k1 - k0)
        return ranks / cores        # not reached

    def bandwidth(self, level: str, collective: str, gpus_per_node: int) -> float:
        """GB/s per GPU of a collective at a level: the measured bus bandwidth, else nominal."""
        got = (self.measured.get(level) or {}).get(collective) or {}
        if got.get("busbw_gb_per_s"):
            return float(got["busbw_gb_per_s"])
        lvl = self.level(level)
        return lvl.per_gpu_gb_per_s(gpus_per_node)

    def latency_us(self, level: str, collective: str) -> float:
        got = (self.measured.get(level) or {}).get(collective) or {}
        if got.get("latency_us") is not None:
            return float(got["latency_us"])
        return float(self.level(level).latency_us)

    def level(self, level: str) -> Level:
        lvl = getattr(self, level)
        if lvl is None:
            raise ValueError(f"fabric.{level}: not described (a projection over several nodes needs it)")
        return lvl

    def source_of(self, level: str, collective: str) -> str:
        got = (self.measured.get(level) or {}).get(collective) or {}
        return ("measured: " + str(self.measured.get("source", ""))) if got else self.source


def _positive(ck, data, key, path, integer=False):
    value = ck.integer(data, key, path, minimum=1) if integer else ck.number(data, key, path)
    return value


def _level(ck, raw, level: str) -> Optional[Level]:
    p = f"fabric.{level}"
    data = ck.mapping(raw, p)
    ck.no_unknown(data, LEVEL_KEYS[level], f"{p}.")
    links = INTRA_LINKS if level == "intra_node" else INTER_LINKS
    link = ck.collect(lambda: ck.string(data, "link", f"{p}.link", required=True, choices=links))
    latency = ck.collect(lambda: _required_number(ck, data, "latency_us", f"{p}.latency_us"))
    if level == "intra_node":
        bw = ck.collect(lambda: _required_number(ck, data, "gb_per_s", f"{p}.gb_per_s"))
        return None if None in (link, latency, bw) else Level(link=link, latency_us=latency, gb_per_s=bw)
    nics = ck.collect(lambda: ck.integer(data, "nics", f"{p}.nics", required=True, minimum=1))
    rate = ck.collect(lambda: _required_number(ck, data, "nic_gb_per_s", f"{p}.nic_gb_per_s"))
    return None if None in (link, latency, nics, rate) else \
        Level(link=link, latency_us=latency, nics=nics, nic_gb_per_s=rate)


def _required_number(ck, data, key, path):
    if data.get(key) is None:
        ck.fail(path, "required key is missing")
    return ck.number(data, key, path)


def _measured(ck, raw) -> Dict[str, Any]:
    if raw is None:
        return {}
    data = ck.mapping(raw, "fabric.measured")
    ck.no_unknown(data, {"source", *LEVELS}, "fabric.measured.")
    out: Dict[str, Any] = {"source": ck.collect(lambda: ck.string(data, "source", "fabric.measured.source",
                                                                  required=True))}
    for level in LEVELS:
        if data.get(level) is None:
            continue
        p = f"fabric.measured.{level}"
        colls = ck.collect(lambda: ck.mapping(data[level], p))
        if colls is None:
            continue
        ck.no_unknown(colls, set(COLLECTIVES), f"{p}.")
        out[level] = {}
        for coll in COLLECTIVES:
            if coll not in colls:
                continue
            entry = ck.collect(lambda: ck.mapping(colls[coll], f"{p}.{coll}"))
            if entry is None:
                continue
            ck.no_unknown(entry, MEASURED_KEYS, f"{p}.{coll}.")
            bw = ck.collect(lambda: _required_number(ck, entry, "busbw_gb_per_s", f"{p}.{coll}.busbw_gb_per_s"))
            lat = ck.collect(lambda: ck.number(entry, "latency_us", f"{p}.{coll}.latency_us"))
            out[level][coll] = {"busbw_gb_per_s": bw, "latency_us": lat}
    return out


def _sourced(ck, raw, p: str, keys):
    """(mapping, its source) of an optional fabric subsection: known keys only, a source required."""
    data = ck.mapping(raw, p)
    ck.no_unknown(data, keys, f"{p}.")
    return data, ck.collect(lambda: ck.string(data, "source", f"{p}.source", required=True))


def _core_sharing(ck, raw) -> Dict[str, Any]:
    if raw is None:
        return {}
    p = "fabric.core_sharing"
    data, source = _sourced(ck, raw, p, CORE_SHARING_KEYS)
    cores = ck.collect(lambda: ck.integer(data, "cores", f"{p}.cores", required=True, minimum=1))
    table = ck.collect(lambda: ck.mapping(data.get("slowdown"), f"{p}.slowdown"))
    slowdown = {}
    for k, v in (table or {}).items():
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            ck.record(f"{p}.slowdown", f"{k!r} is not a rank count (1, 2, 4, ...)")
        elif isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            ck.record(f"{p}.slowdown.{k}", f"{v!r} is not a positive factor")
        else:
            slowdown[k] = float(v)
    if table is not None and not slowdown:
        ck.record(f"{p}.slowdown", "give the measured factor per rank count, e.g. {1: 1.0, 4: 3.2}")
    return {"source": source, "cores": cores, "slowdown": slowdown}


def _gpu(ck, raw) -> Dict[str, Any]:
    if raw is None:
        return {}
    p = "fabric.gpu"
    data, source = _sourced(ck, raw, p, GPU_KEYS)
    memory = ck.collect(lambda: _required_number(ck, data, "memory_gb_per_s", f"{p}.memory_gb_per_s"))
    table = ck.collect(lambda: ck.mapping(data.get("tflops"), f"{p}.tflops")) or {}
    ck.no_unknown(table, set(PRECISIONS), f"{p}.tflops.")
    tflops = {k: ck.collect(lambda k=k: ck.number(table, k, f"{p}.tflops.{k}")) for k in PRECISIONS if k in table}
    if not tflops:
        ck.record(f"{p}.tflops",
                  "give the peak per precision, e.g. {fp32: 19.5, tf32: 156, amp: 312}")
    return {"source": source, "tflops": tflops, "memory_gb_per_s": memory}


def fabric_from_raw(ck, raw: Any) -> Optional[Fabric]:
    """The Fabric of a profile's ``fabric:`` mapping (None when absent); problems recorded in
    `ck` (a jobs.profiles.schema.Checker), None when there are any."""
    if raw is None:
        return None
    before = len(ck.lines)
    data = ck.mapping(raw, "fabric")
    ck.no_unknown(data, FABRIC_KEYS, "fabric.")
    source = ck.collect(lambda: ck.string(data, "source", "fabric.source", required=True))
    if data.get("intra_node") is None:
        ck.record("fabric.intra_node", "required key is missing")
    intra = ck.collect(lambda: _level(ck, data["intra_node"], "intra_node")) if data.get("intra_node") else None
    inter = ck.collect(lambda: _level(ck, data["inter_node"], "inter_node")) if data.get("inter_node") else None
    measured = ck.collect(lambda: _measured(ck, data.get("measured")), {})
    sharing = ck.collect(lambda: _core_sharing(ck, data.get("core_sharing")), {})
    gpu = ck.collect(lambda: _gpu(ck, data.get("gpu")), {})
    if len(ck.lines) > before or intra is None:
        return None
    return Fabric(source=source, intra_node=intra, inter_node=inter, measured=measured, core_sharing=sharing,
                  gpu=gpu)


# nccl-tests prints one row per size: size count type redop [root] | out-of-place: time algbw
# busbw #wrong | in-place: the same four (all_reduce_perf, alltoall_perf, all_gather_perf; the
# root column came in nccl-tests 2.10, older versions print 12 columns)
_LAYOUTS = {13: 5, 12: 4, 9: 5, 8: 4}     # columns of a result row -> index of the out-of-place time


def _number(text):
    try:
        return float(text)
    except ValueError:
        return None


def parse_nccl_tests(text: str) -> Dict[str, float]:
    """{"busbw_gb_per_s", "latency_us"} of an nccl-tests run (all_reduce_perf, alltoall_perf,
    all_gather_perf output): the peak out-of-place bus bandwidth over the sizes and the smallest
    size's out-of-place time. ValueError (one line) when no result row is found."""
    rows: List[tuple] = []
    for line in text.splitlines():
        tokens = line.split()
        if not tokens or tokens[0].startswith("#") or len(tokens) not in _LAYOUTS or not tokens[0].isdigit():
            continue
        at = _LAYOUTS[len(tokens)]
        time_us, busbw = _number(tokens[at]), _number(tokens[at + 2])
        if time_us is None or busbw is None or not tokens[1].isdigit():
            continue
        rows.append((int(tokens[0]), time_us, busbw))
    if not rows:
        raise ValueError("no nccl-tests result rows (size count type redop [root] time algbw busbw ...) found")
    rows.sort()
    return {"busbw_gb_per_s": max(r[2] for r in rows), "latency_us": rows[0][1]}


def fabric_from_measurements(records: List[Dict[str, Any]], gpus_per_node: int,
                             intra_link: str = "loopback", inter_link: str = "loopback") -> Dict[str, Any]:
    """A profile's ``fabric:`` mapping from the fabric files of `python -m recsys.collectives`
    (one per level: a 1-node job for intra_node, a job of one rank per node for inter_node):
    every figure measured. The nominal bandwidth of a level is its best collective's bus
    bandwidth and its latency the shortest (the schema wants both); ``measured`` keeps each
    collective's own, which a projection uses. ValueError (one line) on a malformed record."""
    measured: Dict[str, Any] = {}
    sources = []
    for record in records:
        if not isinstance(record, dict) or record.get("version") != 1 or record.get("level") not in LEVELS:
            raise ValueError("not a fabric file of python -m recsys.collectives (version 1, level intra_node "
                             "or inter_node)")
        level = record["level"]
        colls = (record.get("measured") or {}).get(level) or {}
        if not colls or any(c not in COLLECTIVES for c in colls):
            raise ValueError(f"{level}: no measured collectives ({', '.join(COLLECTIVES)}) in the file")
        measured[level] = {c: {"busbw_gb_per_s": float(v["busbw_gb_per_s"]), "latency_us": float(v["latency_us"])}
                           for c, v in colls.items()}
        sources.append(f"{level}: {record.get('source', 'python -m recsys.collectives')}")
    if "intra_node" not in measured:
        raise ValueError("no intra_node file (a 1-node job of python -m recsys.collectives)")
    out: Dict[str, Any] = {"source": "measured: " + "; ".join(sources)}
    for level in LEVELS:
        if level not in measured:
            continue
        best = max(v["busbw_gb_per_s"] for v in measured[level].values())
        latency = min(v["latency_us"] for v in measured[level].values())
        if level == "intra_node":
            out[level] = {"link": intra_link, "gb_per_s": best, "latency_us": latency}
        else:       # one NIC whose per-GPU share (rate / GPUs per node) is what one rank per node got
            out[level] = {"link": inter_link, "nics": 1, "nic_gb_per_s": best * gpus_per_node, "latency_us": latency}
    out["measured"] = {"source": "python -m recsys.collectives (Horovod over MPI, the engine's path)", **measured}
    return out
