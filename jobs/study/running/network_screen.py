"""The network half of a node screen (`recsys-submit study screen --network`): the fabric
micro-benchmark (`python -m recsys.collectives`, the payload a profile's `fabric:` is measured
with: Horovod allreduce and alltoall, NCCL on GPUs) between every pair of the allocation's nodes,
then across the whole set, in the screen's one allocation after the one-node benchmarks.

Why pairs: the one-node benchmark never leaves a node, so a bad cable, HCA port or switch port
is invisible to it, and a job spanning that node runs every collective at the slow link's speed.
Every pair runs once; pairs on disjoint nodes run at once (a round: the circle method gives
N-1 rounds for N nodes, N for an odd N), so a 64-node pod takes 63 rounds, not 2016 jobs.

The reference a pair is judged against is the median over the nodes of each node's fastest pair:
one node whose every link is slow is in half the pairs of a 4-node screen, and would drag a plain
median of the pairs down with it. A pair more than the margin below the reference is slow; a node
slow (or failed) with more than half of its partners, and at least two, is its own link: it is
flagged, and goes into the screen's one `--exclude=` line with the nodes the benchmark flagged. A
slow pair whose two nodes are fine with everyone else is a link between them (a cable, or the
switch path): listed, not excluded, since which end is at fault cannot be told. The whole set's
bus bandwidth is shown against the same reference: far below it with no node flagged points at
the switches' uplinks rather than at a node.
"""

from __future__ import annotations

import dataclasses
import os
import re
import statistics
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from jobs import states
from jobs.errors import RequestError
from jobs.planning.plan import plan
from jobs.planning.request import JobRequest, slug
from jobs.runs import enginelog

from . import allocation

KEY = "main"
SIZES, ITERS, WARMUP, MINUTES = "4M,64M", 10, 3, 3
COLLECTIVES = ("allreduce", "alltoall")
FABRIC_FILE = "fabric.yaml"
OK, SLOW, FAILED, UNKNOWN = "ok", "slow", "failed", "unknown"
_SIZE = re.compile(r"[1-9][0-9]*[KMG]?")


def pair_rounds(count: int) -> List[List[Tuple[int, int]]]:
    """Every pair of `count` nodes exactly once, in rounds of pairs on disjoint nodes (the circle
    method: a round-robin tournament's schedule)."""
    ids: List[Optional[int]] = list(range(count)) + ([None] if count % 2 else [])
    n = len(ids)
    rounds = []
    for _ in range(n - 1):
        pairs = [(ids[i], ids[n - 1 - i]) for i in range(n // 2)]
        rounds.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None))
        ids = [ids[0], ids[-1]] + ids[1:-1]
    return rounds


@dataclasses.dataclass(frozen=True)
class NetworkPlan:
    """The network checks of a screen, checked before anything is submitted."""

    count: int                      # nodes
    gpus: int                       # ranks per node (the node benchmark's GPUs)
    sizes: str
    iters: int
    minutes: int                    # each pair's (and the whole set's) own step limit
    rounds: Tuple[Tuple[Tuple[int, int], ...], ...]

    @property
    def seconds(self) -> int:
        """What the pair rounds and the whole set add to the allocation's time at most."""
        return (len(self.rounds) + 1) * self.minutes * 60


def check(count: int, gpus: int, sizes: Optional[str] = None, iters: Optional[int] = None,
          minutes: Optional[int] = None) -> NetworkPlan:
    """A NetworkPlan; RequestError (one line naming the flag) on bad input."""
    if count < 3:
        raise RequestError(f"--network: pairs are judged against the other pairs: give 3 or more nodes, got {count}")
    sizes = SIZES if sizes is None else sizes
    parts = [s.strip().upper() for s in str(sizes).split(",")]
    if not parts or not all(_SIZE.fullmatch(p) for p in parts):
        raise RequestError(f"--network-sizes: comma-separated buffer sizes such as 4M,64M, got {sizes!r}")
    iters = ITERS if iters is None else iters
    minutes = MINUTES if minutes is None else minutes
    for flag, value in (("--network-iters", iters), ("--network-time", minutes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RequestError(f"{flag}: a whole number of at least 1, got {value!r}")
    return NetworkPlan(count=count, gpus=gpus, sizes=",".join(parts), iters=iters, minutes=minutes,
                       rounds=tuple(tuple(r) for r in pair_rounds(count)))


def _request(profile, net: NetworkPlan, nodes: int, out: str, name: str) -> JobRequest:
    return JobRequest(kind="benchmark", profile=profile.name, payload="collectives", nodes=nodes,
                      gpus_per_node=net.gpus, time=str(net.minutes), name=slug(name),
                      engine_args=["--out", out, "--sizes", net.sizes, "--iters", str(net.iters),
                                   "--warmup", str(WARMUP), "--collectives", ",".join(COLLECTIVES)])


def slots(profile, net: NetworkPlan, screen_dir: str) -> List[Dict[str, Any]]:
    """Each pair's job and the whole set's: {spec, dir, nodes (allocation indices), round}; the
    directories are named by the indices, since which nodes Slurm gives is known only inside."""
    out: List[Dict[str, Any]] = []
    for number, pairs in enumerate(net.rounds):
        for a, b in pairs:
            out.append({"dir": os.path.join(screen_dir, "network", f"pair-{a + 1}-{b + 1}"), "nodes": [a, b],
                        "round": number, "name": f"net-{a + 1}-{b + 1}"})
    out.append({"dir": os.path.join(screen_dir, "network", "all"), "nodes": list(range(net.count)),
                "round": len(net.rounds), "name": "net-all"})
    for slot in out:
        request = _request(profile, net, len(slot["nodes"]), os.path.join(slot["dir"], FABRIC_FILE), slot["name"])
        resolved, specs = plan([request], profile, submitting=True)
        slot["spec"] = dataclasses.replace(specs[0], requeue=False)
        slot["requests"] = [r.request.to_dict() for r in resolved]
    return out


def schedule(first_index: int, slot_list: Sequence[Dict[str, Any]]) -> List[List[Tuple[int, List[int]]]]:
    """The allocation's rounds for the network slots, their points numbered from `first_index`."""
    rounds: List[List[Tuple[int, List[int]]]] = [[] for _ in range(1 + max(s["round"] for s in slot_list))]
    for i, slot in enumerate(slot_list):
        rounds[slot["round"]].append((first_index + i, list(slot["nodes"])))
    return rounds


def request_record(net: NetworkPlan, slot_list: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """What screen-request.json keeps of the network checks."""
    return {"sizes": net.sizes, "iters": net.iters, "minutes": net.minutes, "gpus_per_node": net.gpus,
            "rounds": len(net.rounds), "slots": [{"dir": s["dir"], "nodes": s["nodes"]} for s in slot_list]}


def _figures(path: str) -> Dict[str, float]:
    with open(path) as handle:
        record = yaml.safe_load(handle) or {}
    measured = (record.get("measured") or {}).get(record.get("level"), {}) if isinstance(record, dict) else {}
    return {c: float(measured[c]["busbw_gb_per_s"]) for c in COLLECTIVES
            if isinstance(measured.get(c), dict) and isinstance(measured[c].get("busbw_gb_per_s"), (int, float))}


def _row(slot: Dict[str, Any], job) -> Dict[str, Any]:
    """One pair's (or the whole set's) row from its run dir: nodes, state, bus bandwidths."""
    run_dir = slot["dir"]
    seen = allocation.progress(run_dir, KEY, job.job_id)
    row: Dict[str, Any] = {"run_dir": run_dir, "indices": slot["nodes"],
                           "nodes": [n for n in seen.get("nodelist", "").strip().split(",") if n] or None,
                           "state": UNKNOWN, "reason": None, "allreduce_gb_per_s": None, "alltoall_gb_per_s": None,
                           "vs_reference": None}
    code = seen.get("exit_code", "").strip()
    if code == "0":
        try:
            figures = _figures(os.path.join(run_dir, FABRIC_FILE))
        except (OSError, yaml.YAMLError) as exc:
            figures, why = {}, f"exited 0 but its {FABRIC_FILE} cannot be read ({exc.__class__.__name__})"
        else:
            why = f"exited 0 but its {FABRIC_FILE} has no allreduce bus bandwidth"
        if figures.get("allreduce", 0) > 0:
            row.update(state=OK, **{f"{c}_gb_per_s": figures.get(c) for c in COLLECTIVES})
        else:
            row.update(state=FAILED, reason=why)
    elif code:
        if seen.get("timed_out"):
            row.update(state=FAILED, reason=allocation.timeout_reason(run_dir, KEY, job.job_id, seen))
        else:
            row.update(state=FAILED, reason=enginelog.failure_reason(run_dir, KEY, f"{states.FAILED} (exit {code})"))
    else:
        row["reason"] = f"did not run to its end in allocation job {job.job_id} ({job.state})"
    return row


def build(request: Dict[str, Any], job, margin: float) -> Dict[str, Any]:
    """The network checks as plain data: the pair rows, the reference, the nodes a bad link
    flags, the slow links between two fine nodes, the whole set's row."""
    rows = [_row(s, job) for s in request["slots"]]
    pairs, whole = rows[:-1], rows[-1]
    best: Dict[str, float] = {}
    for row in pairs:
        if row["state"] == OK and row["nodes"]:
            for node in row["nodes"]:
                best[node] = max(best.get(node, 0.0), row["allreduce_gb_per_s"])
    reference = statistics.median(best.values()) if best else None
    for row in rows:
        if row["state"] == OK and reference:
            row["vs_reference"] = row["allreduce_gb_per_s"] / reference
            if row is not whole and row["vs_reference"] < 1.0 - margin:
                row["state"] = SLOW
                row["reason"] = f"{(1.0 - row['vs_reference']) * 100:.0f}% below the reference"
    nodes: Dict[str, Dict[str, Any]] = {}
    for row in pairs:
        for node in row["nodes"] or []:
            entry = nodes.setdefault(node, {"pairs": 0, "bad": 0, "flagged": False, "reason": None})
            if row["state"] != UNKNOWN:
                entry["pairs"] += 1
                entry["bad"] += row["state"] in (SLOW, FAILED)
    for node, entry in nodes.items():
        if entry["pairs"] >= 2 and entry["bad"] * 2 > entry["pairs"]:
            entry.update(flagged=True, reason=f"slow or failed with {entry['bad']} of its {entry['pairs']} "
                                              "partners: its own link")
    flagged = [n for n in sorted(nodes) if nodes[n]["flagged"]]
    links = [row["nodes"] for row in pairs if row["state"] in (SLOW, FAILED) and row["nodes"]
             and not any(nodes[n]["flagged"] for n in row["nodes"])]
    if whole["state"] == OK and whole["vs_reference"] is not None and whole["vs_reference"] < 1.0 - margin:
        whole["reason"] = (f"{(1.0 - whole['vs_reference']) * 100:.0f}% below the pairs' reference"
                           + (" (it spans the flagged nodes)" if flagged else
                              ": no node is to blame; look at the switches' uplinks"))
    return {"sizes": request["sizes"], "iters": request["iters"], "gpus_per_node": request["gpus_per_node"],
            "rounds": request["rounds"], "reference_gb_per_s": reference, "pairs": pairs, "whole": whole,
            "nodes": nodes, "flagged": flagged, "slow_links": links}


def _gb(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.3g}"


def markdown(net: Dict[str, Any], margin: float) -> List[str]:
    """The network section of screen.md."""
    lines = ["", f"## Network: every node pair, then the whole set ({net['rounds']} round(s) of pairs at once)", "",
             f"- `python -m recsys.collectives`, {net['gpus_per_node']} rank(s) per node, sizes {net['sizes']}, "
             f"{net['iters']} timed iterations; peak bus bandwidth (GB/s, nccl-tests' definition)",
             f"- reference: the median over the nodes of each node's fastest pair, "
             f"{_gb(net['reference_gb_per_s'])} GB/s allreduce; a pair more than {margin * 100:g}% below it is slow",
             "", "| nodes | state | allreduce (GB/s) | alltoall (GB/s) | vs reference | note |",
             "|---|---|---:|---:|---:|---|"]
    for row in net["pairs"] + [net["whole"]]:
        label = ("all: " if row is net["whole"] else "") + ",".join(row["nodes"] or [f"#{i + 1}" for i in row["indices"]])
        vs = "-" if row["vs_reference"] is None else f"{row['vs_reference']:.2f}"
        lines.append(f"| {label} | {row['state']} | {_gb(row['allreduce_gb_per_s'])} | {_gb(row['alltoall_gb_per_s'])} "
                     f"| {vs} | {row['reason'] or ''} |")
    lines.append("")
    for node in net["flagged"]:
        lines.append(f"- {node}: {net['nodes'][node]['reason']}")
    for a, b in net["slow_links"]:
        lines.append(f"- the link between {a} and {b} is slow, both are fine with their other partners: check the "
                     "cable and switch ports between them (not excluded: either end may be at fault)")
    if not net["flagged"] and not net["slow_links"]:
        lines.append("- no slow link")
    return lines
