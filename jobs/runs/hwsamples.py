"""The hardware samples of a job read back (slurm/hwsample.py writes logs/<key>-<tag>.hw/<node>.json)
and reduced to medians over the job's timed steps, for a study report's hardware columns.

The window is the engine log's own: from its `first_step` start-up record (the timed steps follow)
to its `summary` record; without them, every sample. A file a reader cannot parse, or of a later
version, is skipped (nothing is guessed); a job without samples has no hardware medians (None).

A sick node's samples (issue 47, item 3) carry the sampler's record of it: `gpu_error` of a sample
whose nvidia-smi call failed, hung or named a sick GPU, and `error` in a GPU's row ("[GPU requires
reset]"). They are counted over all the job's samples, per node and per GPU (a GPU missing from a
sample in which other GPUs of its node answered counts too), and the report warns of each.
"""

import glob
import json
import os
import statistics
from collections import Counter

from .enginelog import job_logs, records

VERSION = 1
DEFAULT_GPU_MIN_UTILIZATION = 50        # % : a study report warns of a GPU busy less than this


def files(run_dir, key="main"):
    """The per-node sample files of job `key` (every attempt)."""
    return sorted(glob.glob(os.path.join(run_dir, "logs", f"{glob.escape(key)}-*.hw", "*.json")))


def load(path):
    """A node's sample document, or None (unreadable, not this format, a later version)."""
    try:
        with open(path) as handle:
            doc = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("samples"), list):
        return None
    return doc


def timed_window(run_dir, key="main"):
    """(start, end) epoch seconds of the timed steps from the engine log, or (None, None)."""
    start = end = None
    for path in job_logs(run_dir, key):
        for rec in records(path):
            if rec.get("type") == "startup" and rec.get("phase") == "first_step":
                start, end = rec.get("time"), None
            elif rec.get("type") == "summary":
                end = rec.get("time")
    return start, end


def _faults(host, samples):
    """[{node, index, samples, of, error}] of one node's samples: index None for the nvidia-smi
    calls that failed as a whole, else one entry per GPU that had no healthy row in some samples."""
    rows = [s for s in samples if isinstance(s, dict)]
    asked = [s for s in rows if "gpus" in s or s.get("gpu_error")]
    out = []
    calls = [s["gpu_error"] for s in asked if s.get("gpu_error") and not s.get("gpus")]
    if calls:
        out.append({"node": host, "index": None, "samples": len(calls), "of": len(asked),
                    "error": Counter(calls).most_common(1)[0][0]})
    known = {g.get("index") for s in asked for g in s.get("gpus") or [] if isinstance(g, dict)}
    for index in sorted(known, key=str):
        missed = []
        for s in asked:
            mine = [g for g in s.get("gpus") or [] if isinstance(g, dict) and g.get("index") == index]
            if mine and mine[0].get("error"):
                missed.append(str(mine[0]["error"]))
            elif not mine and s.get("gpus"):
                missed.append("no row")
        if missed:
            out.append({"node": host, "index": index, "samples": len(missed), "of": len(asked),
                        "error": Counter(missed).most_common(1)[0][0]})
    return out


def _median(values):
    values = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return round(statistics.median(values), 1) if values else None


def medians(run_dir, key="main"):
    """{nodes, samples, cpu_busy_pct, rank_cpu_busy_pct_min, mem_used_gib, net_rx_mb_s, net_tx_mb_s,
    net_source, gpus: [{node, index, name, util_pct, mem_used_mib, power_w, sm_mhz, base_mhz}],
    gpu_faults: [{node, index, samples, of, error}]}: each the median over the samples inside the
    timed steps (node values: the median of the per-node medians; faults: over all the job's
    samples), or None when the job has no samples there."""
    start, end = timed_window(run_dir, key)
    nodes, gpus, faults = [], [], []
    for path in files(run_dir, key):
        doc = load(path)
        if doc is None:
            continue
        faults += _faults(doc.get("host"), doc["samples"])
        rows = [s for s in doc["samples"] if isinstance(s, dict) and isinstance(s.get("t"), (int, float))
                and (start is None or s["t"] >= start) and (end is None or s["t"] <= end)]
        if not rows:
            continue
        ranks = [min(s["rank_cpu_busy_pct"]) for s in rows if s.get("rank_cpu_busy_pct")]
        nodes.append({"host": doc.get("host"), "samples": len(rows),
                      "cpu_busy_pct": _median([s.get("cpu_busy_pct") for s in rows]),
                      "rank_cpu_busy_pct_min": _median(ranks),
                      "mem_used_gib": _median([s.get("mem_used_gib") for s in rows]),
                      "net_rx_mb_s": _median([(s.get("net_rx_bytes_per_s") or 0) / 1e6 for s in rows]),
                      "net_tx_mb_s": _median([(s.get("net_tx_bytes_per_s") or 0) / 1e6 for s in rows]),
                      "net_source": rows[-1].get("net_source")})
        by_index = {}
        for s in rows:
            for g in s.get("gpus") or []:
                if not isinstance(g, dict) or g.get("error"):
                    continue
                by_index.setdefault(g.get("index"), []).append(g)
        for index, seen in sorted(by_index.items(), key=lambda kv: str(kv[0])):
            gpus.append({"node": doc.get("host"), "index": index, "name": seen[-1].get("name"),
                         **{k: _median([g.get(k) for g in seen])
                            for k in ("util_pct", "mem_used_mib", "power_w", "sm_mhz", "base_mhz")}})
    if not nodes:
        return None
    out = {"nodes": len(nodes), "samples": sum(n["samples"] for n in nodes),
           "net_source": nodes[0]["net_source"], "gpus": gpus, "gpu_faults": faults}
    for k in ("cpu_busy_pct", "rank_cpu_busy_pct_min", "mem_used_gib", "net_rx_mb_s", "net_tx_mb_s"):
        out[k] = _median([n[k] for n in nodes])
    return out


def warnings(point, hw, min_utilization=DEFAULT_GPU_MIN_UTILIZATION, base_mhz=None):
    """Lines for a point's GPUs: nvidia-smi calls that failed on a node and GPUs without a reading
    (a sick GPU), busy less than `min_utilization` %, or an SM clock below the base
    (`base_mhz`, the profile's; else the GPU's default application clock) in the medians of the
    timed steps."""
    out = []
    for f in (hw or {}).get("gpu_faults", []):
        if f.get("index") is None:
            out.append(f"{point}: nvidia-smi on {f['node']} failed in {f['samples']} of {f['of']} samples: {f['error']}")
        else:
            out.append(f"{point}: GPU {f['index']} on {f['node']} had no reading in {f['samples']} of {f['of']} "
                       f"samples ({f['error']})")
    for g in (hw or {}).get("gpus", []):
        where = f"{point}: GPU {g['index']} on {g['node']}"
        if g.get("util_pct") is not None and g["util_pct"] < min_utilization:
            out.append(f"{where} was {g['util_pct']:.0f} % busy (median of the timed steps; below {min_utilization} %)")
        base = base_mhz or g.get("base_mhz")
        if g.get("sm_mhz") is not None and base and g["sm_mhz"] < base:
            out.append(f"{where} ran its SM clock at {g['sm_mhz']:.0f} MHz, below its base {base:.0f} MHz "
                       "(throttled: power, temperature or a clock limit)")
    return out
