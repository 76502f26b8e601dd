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
      measured:                      # optional; range / latency_range: over repeated measurements
        source: "nccl-tests 2.13 on 2 nodes, 2026-11-27"
        intra_node: {allreduce: {busbw_gb_per_s: 230, latency_us: 20, range: [221, 236]}}
      core_sharing:                  # optional: ranks sharing a host's cores (bench/bench_core_sharing.py)
        source: "measured: ..."
        cores: 2
        slowdown: {1: 1.0, 2: 1.1, 4: 2.9, 8: 6.0}
        exchange_source: "measured: ..."   # with exchange: collectives of k ranks on the cores
        exchange:                          # (bench/bench_collectives_ci.py --core-sharing)
          4: {inter_node: {alltoall: {busbw_gb_per_s: 0.05, latency_us: 4000, range: [0.04, 0.06]}}}
      gpu:                           # optional: one GPU's peak rates (the projection's compute split)
        source: "NVIDIA A100 datasheet"
        tflops: {fp32: 19.5, tf32: 156, amp: 312}
        memory_gb_per_s: 2039
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["Level", "Fabric", "FABRIC_KEYS", "LEVELS", "COLLECTIVES", "fabric_from_raw", "parse_nccl_tests",
           "bus_factor"]

LEVELS = ("intra_node", "inter_node")
COLLECTIVES = ("allreduce", "alltoall", "allgather")
INTRA_LINKS = ("nvlink", "nvswitch", "pcie", "shared_memory", "loopback")
INTER_LINKS = ("infiniband", "ethernet", "roce", "loopback")
FABRIC_KEYS = {"source", "intra_node", "inter_node", "measured", "core_sharing", "gpu"}
GPU_KEYS = {"source", "tflops", "memory_gb_per_s"}
PRECISIONS = ("fp32", "tf32", "amp")
CORE_SHARING_KEYS = {"source", "cores", "slowdown", "exchange", "exchange_source"}
LEVEL_KEYS = {"intra_node": {"link", "gb_per_s", "latency_us"},
              "inter_node": {"link", "nics", "nic_gb_per_s", "latency_us"}}
MEASURED_KEYS = {"busbw_gb_per_s", "latency_us", "range", "latency_range"}
EDGES = ("fast", "slow")       # a band's edges: the fastest measured figure, the slowest


def _at_edge(entry: Dict[str, Any], key: str, edge: Optional[str]):
    """A measured entry's bandwidth ("busbw_gb_per_s") or latency ("latency_us") at a band's edge:
    the fast edge takes the highest bandwidth and the lowest latency of the measured range, the
    slow edge the opposite; the figure itself without an edge or without a range."""
    ranged = entry.get("range" if key == "busbw_gb_per_s" else "latency_range")
    if edge is None or not ranged:
        return entry.get(key)
    high_is_fast = key == "busbw_gb_per_s"
    return float(ranged[1] if (edge == "fast") == high_is_fast else ranged[0])


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

    def bandwidth(self, level: str, collective: str, gpus_per_node: int, edge: Optional[str] = None) -> float:
        """GB/s per GPU of a collective at a level: the measured bus bandwidth (at a band's `edge`,
        "fast" | "slow", the top or bottom of its measured range), else nominal."""
        got = (self.measured.get(level) or {}).get(collective) or {}
        if got.get("busbw_gb_per_s"):
            return float(_at_edge(got, "busbw_gb_per_s", edge))
        lvl = self.level(level)
        return lvl.per_gpu_gb_per_s(gpus_per_node)

    def latency_us(self, level: str, collective: str, edge: Optional[str] = None) -> float:
        got = (self.measured.get(level) or {}).get(collective) or {}
        if got.get("latency_us") is not None:
            return float(_at_edge(got, "latency_us", edge))
        return float(self.level(level).latency_us)

    def sharing_exchange(self, ranks: int, level: str, collective: str,
                         edge: Optional[str] = None) -> Optional[Tuple[float, float, int]]:
        """(bus GB/s, latency us, k measured) of a collective among `ranks` ranks that share the
        host's cores, from ``core_sharing.exchange``: the nearest measured k at or above `ranks`
        (an exchange of fewer ranks on the same cores is not slower); beyond the largest k, its
        figures in proportion to ranks / k (bandwidth divided, latency multiplied: each rank's
        share of the cores shrinks so); `level` (the layout's) when measured at that k, else the
        level measured there. None without a table or a figure of that collective."""
        table = self.core_sharing.get("exchange") or {}
        usable = sorted(k for k, levels in table.items() if any(collective in c for c in levels.values()))
        if not usable or ranks <= 1:
            return None
        k = next((k for k in usable if k >= ranks), usable[-1])
        levels = table[k]
        entry = (levels.get(level) or {}).get(collective) or next(c[collective] for c in levels.values()
                                                                  if collective in c)
        scale = max(1.0, ranks / k)
        bw = float(_at_edge(entry, "busbw_gb_per_s", edge)) / scale
        lat = _at_edge(entry, "latency_us", edge)
        return bw, (float(lat) * scale if lat is not None else self.latency_us(level, collective, edge)), k

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
        out[level] = _collectives(ck, colls, p)
    return out


def _collectives(ck, colls, p: str) -> Dict[str, Any]:
    """The checked {collective: {busbw_gb_per_s, latency_us[, range][, latency_range]}} at `p`."""
    ck.no_unknown(colls, set(COLLECTIVES), f"{p}.")
    out: Dict[str, Any] = {}
    for coll in COLLECTIVES:
        if coll not in colls:
            continue
        entry = ck.collect(lambda: ck.mapping(colls[coll], f"{p}.{coll}"))
        if entry is None:
            continue
        ck.no_unknown(entry, MEASURED_KEYS, f"{p}.{coll}.")
        bw = ck.collect(lambda: _required_number(ck, entry, "busbw_gb_per_s", f"{p}.{coll}.busbw_gb_per_s"))
        lat = ck.collect(lambda: ck.number(entry, "latency_us", f"{p}.{coll}.latency_us"))
        out[coll] = {"busbw_gb_per_s": bw, "latency_us": lat}
        for key, figure in (("range", bw), ("latency_range", lat)):
            if entry.get(key) is not None:
                ranged = ck.collect(lambda: _range(ck, entry[key], figure, f"{p}.{coll}.{key}"))
                if ranged:
                    out[coll][key] = ranged
    return out


def _range(ck, value, figure, path) -> List[float]:
    """A measured range [min, max] of positive numbers holding its figure."""
    if not isinstance(value, list) or len(value) != 2 or \
            any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 for v in value):
        raise ck.fail(path, f"must be [min, max] of two positive numbers, got {value!r}")
    low, high = float(value[0]), float(value[1])
    if low > high or (figure is not None and not low <= figure <= high):
        raise ck.fail(path, f"[{low:g}, {high:g}] must be [min, max] and hold the figure {figure}")
    return [low, high]


def _exchange(ck, raw) -> Dict[int, Any]:
    """core_sharing.exchange: {k: {level: {collective: measured entry}}}."""
    p = "fabric.core_sharing.exchange"
    data = ck.mapping(raw, p)
    out: Dict[int, Any] = {}
    for k, levels in data.items():
        if not isinstance(k, int) or isinstance(k, bool) or k < 2:
            ck.record(f"{p}", f"{k!r} is not a rank count (2, 4, 8, ...)")
            continue
        levels = ck.collect(lambda: ck.mapping(levels, f"{p}.{k}"))
        if levels is None:
            continue
        ck.no_unknown(levels, set(LEVELS), f"{p}.{k}.")
        out[k] = {level: ck.collect(lambda: _collectives(ck, ck.mapping(levels[level], f"{p}.{k}.{level}"),
                                                         f"{p}.{k}.{level}"), {})
                  for level in LEVELS if level in levels}
    if not data:
        ck.record(p, "give the measured collectives per rank count, e.g. "
                     "{4: {inter_node: {alltoall: {busbw_gb_per_s: 0.05}}}}")
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
    out = {"source": source, "cores": cores, "slowdown": slowdown}
    if data.get("exchange") is not None:
        out["exchange_source"] = ck.collect(lambda: ck.string(data, "exchange_source", f"{p}.exchange_source",
                                                              required=True))
        out["exchange"] = ck.collect(lambda: _exchange(ck, data["exchange"]), {})
    elif "exchange_source" in data:
        ck.record(f"{p}.exchange_source", "the source of an exchange: table that is not there")
    return out


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
    `ck` (a slurm.common.checker.Problems), None when there are any."""
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


def _layout(record) -> str:
    return f"{record.get('ranks', '?')} ranks on {record.get('nodes', '?')} node(s)"


def _summary(records: List[Dict[str, Any]], level: str) -> Dict[str, Any]:
    """Each collective's figures over repeated files of one layout: the median bus bandwidth and
    latency, with their measured [min, max] when there are several files."""
    out: Dict[str, Any] = {}
    for coll in COLLECTIVES:
        got = [r["measured"][level][coll] for r in records if coll in r["measured"][level]]
        if not got:
            continue
        bws = sorted(float(g["busbw_gb_per_s"]) for g in got)
        lats = sorted(float(g["latency_us"]) for g in got)
        out[coll] = {"busbw_gb_per_s": float(f"{statistics.median(bws):.6g}"),
                     "latency_us": float(f"{statistics.median(lats):.6g}")}
        if len(got) > 1:
            out[coll].update(range=[bws[0], bws[-1]], latency_range=[lats[0], lats[-1]])
    return out


def _checked(record) -> str:
    if not isinstance(record, dict) or record.get("version") != 1 or record.get("level") not in LEVELS:
        raise ValueError("not a fabric file of python -m recsys.collectives (version 1, level intra_node "
                         "or inter_node)")
    level = record["level"]
    colls = (record.get("measured") or {}).get(level) or {}
    if not colls or any(c not in COLLECTIVES for c in colls):
        raise ValueError(f"{level}: no measured collectives ({', '.join(COLLECTIVES)}) in the file")
    return level


def fabric_from_measurements(records: List[Dict[str, Any]], gpus_per_node: int,
                             intra_link: str = "loopback", inter_link: str = "loopback",
                             core_sharing: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """A profile's ``fabric:`` mapping from the fabric files of `python -m recsys.collectives`
    (a 1-node job for intra_node, a job of one rank per node for inter_node; several files of one
    layout are repeats: the median, and the range over them): every figure measured. The nominal
    bandwidth of a level is its best collective's bus bandwidth and its latency the shortest (the
    schema wants both); ``measured`` keeps each collective's own, which a projection uses.
    `core_sharing` (the profile's own section, for ranks that share a host's cores): every file's
    layout also goes into its ``exchange`` table by rank count, and files of other layouts than
    those two are allowed. ValueError (one line) on a malformed record or mixed layouts."""
    groups: Dict[tuple, List[Dict[str, Any]]] = {}
    for record in records:
        level = _checked(record)
        groups.setdefault((level, record.get("ranks"), record.get("nodes")), []).append(record)
    measured: Dict[str, Any] = {}
    sources = []
    for level in LEVELS:
        layouts = [key for key in groups if key[0] == level]
        if core_sharing is not None:        # the level's own layout: 1 node; one rank per node
            layouts = [key for key in layouts if (key[2] == 1 if level == "intra_node" else key[1] == key[2])]
        if len(layouts) > 1:
            raise ValueError(f"{level}: files of different layouts ({', '.join(_layout(groups[k][0]) for k in layouts)}); "
                             "give one layout per level" + ("" if core_sharing is not None else
                                                            ", or --core-sharing for ranks that share cores"))
        if layouts:
            mine = groups[layouts[0]]
            measured[level] = _summary(mine, level)
            sources.append(f"{level}: {mine[0].get('source', 'python -m recsys.collectives')}"
                           + (f" and {len(mine) - 1} repeat(s) (median, range)" if len(mine) > 1 else ""))
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
    if core_sharing is not None:
        source = ("measured: python -m recsys.collectives at " + ", ".join(f"{_layout(g[0])} x {len(g)}"
                                                                           for g in groups.values())
                  + "; median and range over the repeats")
        exchange: Dict[int, Any] = {}
        for (level, ranks, _), mine in sorted(groups.items(), key=lambda kv: (kv[0][1] or 0, kv[0][0])):
            if not isinstance(ranks, int) or ranks < 2:
                raise ValueError(f"{_layout(mine[0])}: a fabric file without its rank count (>= 2)")
            if level in exchange.get(ranks, {}):
                raise ValueError(f"{level} at {ranks} ranks: files of two layouts; give one")
            exchange.setdefault(ranks, {})[level] = _summary(mine, level)
        out["core_sharing"] = {**core_sharing, "exchange_source": source, "exchange": exchange}
    return out
