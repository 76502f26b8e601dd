"""What a study report gathers beside the throughputs: where the points ran (node sets, hosts),
which frozen code and profile they ran, the software they recorded (provenance), the platform
NVIDIA published results for, the hardware during their timed steps, their TensorBoard files,
and the rule that flags a cell whose repeats spread too far."""

import glob
import json
import os
import statistics

from jobs.errors import RequestError
from jobs.runs import hwsamples
from jobs.runs import tensorboard as tb
from slurm.common.hostlist import expand as expand_hostlist

from ..running.record import DONE
from . import published


# a cell whose repeats spread more than this is flagged: its median hides a noisy measurement
SPREAD_CV, SPREAD_RATIO = 0.10, 1.25
# provenance keys that differ between points by nature (the nodes are shown as "ran on")
PER_POINT_PROVENANCE = ("nodes", "slurm_job_id")
# header order of the provenance keys the engine writes; others follow, sorted
PROVENANCE_ORDER = ("python", "tensorflow", "keras", "horovod", "horovod_build", "mpi", "numpy", "cuda", "cudnn",
                    "nccl", "gpu_model", "cpu_model", "slurm_version", "git_commit", "git_dirty", "profile",
                    "profile_sha256")


def engine_version():
    try:
        from importlib.metadata import version

        return version("recsys-submit")
    except Exception:       # not installed as a distribution (a bare checkout)
        return "unknown"


def nodes_of_run(run_dir):
    """Nodes a point ran on, from its batch script's record (logs/*.info nodelist=)."""
    out = set()
    for path in glob.glob(os.path.join(run_dir, "logs", "*.info")):
        try:
            with open(path) as handle:
                for line in handle:
                    if line.startswith("nodelist=") and line.strip() != "nodelist=":
                        out.add(line.strip().split("=", 1)[1])
        except OSError:
            pass
    return out


def node_sets(record, status):
    """{"points": {point id: the nodes its finished attempt ran on}, "shared": whether every
    point ran on the first nodes of one node set (a study in one allocation: jobs.study.running.allocation),
    "allocation": whether every finished point ran in a study allocation}."""
    points, in_allocation = {}, []
    by_id = {p.id: p for p in record.points}
    for st in status.points:
        if st.state == DONE and st.run_dir:
            found = sorted(nodes_of_run(st.run_dir))
            points[st.id] = ";".join(found)
            in_allocation.append(st.run_dir in by_id[st.id].allocation)
    widest = max(points.values(), key=lambda n: len(n.split(",")), default="").split(",")
    shared = bool(points) and all(n.split(",") == widest[:len(n.split(","))] for n in points.values())
    return {"points": points, "shared": shared, "allocation": bool(in_allocation) and all(in_allocation)}


def code_used(record, status):
    """{"points": {point id: sha256 of the frozen code its finished attempt ran, or None},
    "same": whether every finished point ran one copy, "profiles" and "profile_same": the same
    for the study's frozen profile, "changes": the study's refreshes}."""
    by_id = {p.id: p for p in record.points}
    finished = [st for st in status.points if st.state == DONE and st.run_dir]
    points = {st.id: by_id[st.id].code.get(st.run_dir) for st in finished}
    profiles = {st.id: by_id[st.id].profile.get(st.run_dir) for st in finished}
    hashes, profile_hashes = set(points.values()), set(profiles.values())
    source = record.code or {}
    return {"points": points, "same": len(hashes) == 1 and None not in hashes,
            "profiles": profiles, "profile_same": len(profile_hashes) == 1 and None not in profile_hashes,
            "changes": list(record.code_changes), "git_commit": source.get("git_commit"),
            "git_dirty": source.get("git_dirty")}


def hosts(nodelists):
    """Host names of Slurm node lists ("node1", "node[1-2]" -> node1, node2): each node once."""
    out = set()
    for nodelist in nodelists:
        try:
            out.update(expand_hostlist(nodelist))
        except ValueError:
            out.add(nodelist)           # not a host list this reader knows: shown as recorded
    return out


def size_text(gpus, nodes, gpus_per_node):
    return f"{gpus} GPU{'' if gpus == 1 else 's'} ({nodes} x {gpus_per_node})"


def spread_of(values):
    """(cv, max/min, warning or None) of a cell's throughputs; cv is the sample stdev over the
    mean, None for a single repeat (one value has no spread)."""
    cv = statistics.stdev(values) / statistics.mean(values) if len(values) >= 2 else None
    ratio = max(values) / min(values)
    noisy = (cv is not None and cv > SPREAD_CV) or ratio > SPREAD_RATIO
    return cv, ratio, noisy


def json_key(value):
    return json.dumps(value, sort_keys=True, default=str)


def provenance_of(points):
    """(majority dict, differences, ids without provenance) over [(point id, summary)]."""
    recorded, missing = [], []
    for point_id, summary in points:
        prov = summary.get("provenance") if isinstance(summary, dict) else None
        if isinstance(prov, dict) and prov:
            recorded.append((point_id, prov))
        else:
            missing.append(point_id)
    keys = sorted({k for _, prov in recorded for k in prov if k not in PER_POINT_PROVENANCE},
                  key=lambda k: (PROVENANCE_ORDER.index(k) if k in PROVENANCE_ORDER else len(PROVENANCE_ORDER), k))
    common, differences = {}, []
    for key in keys:
        counts = {}
        for _, prov in recorded:        # most points win; a tie goes to the first point's value
            counts.setdefault(json_key(prov.get(key)), [0, prov.get(key)])[0] += 1
        common[key] = max(counts.values(), key=lambda c: c[0])[1]
        for point_id, prov in recorded:
            if json_key(prov.get(key)) != json_key(common[key]):
                differences.append({"point": point_id, "key": key, "value": prov.get(key), "common": common[key]})
    differences.sort(key=lambda d: [p for p, _ in recorded].index(d["point"]))
    return (common if recorded else None), differences, missing


def study_platform(record):
    """(published platform or None, node type name or None) of the study's profile: the profile as
    recorded in a point's request.json (what ran), else the profile loaded again by path or name."""
    node = None
    for point in record.points:
        for run_dir in reversed(point.runs):
            try:
                with open(os.path.join(run_dir, "request.json")) as handle:
                    node = json.load(handle)["profile"]["node"]["name"]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            break
        if node:
            break
    if not node:
        from jobs.profiles import ProfileError, load_profile

        try:
            node = load_profile(record.profile_path or record.profile).node.name
        except (ProfileError, RequestError, OSError):
            node = None
    return (published.platform_of_node(node) if node else None), node


def _profile_default(record, key):
    """A profile default (defaults.<key>) as a point's request.json recorded it, or None."""
    for point in record.points:
        for run_dir in reversed(point.runs):
            try:
                with open(os.path.join(run_dir, "request.json")) as handle:
                    value = (json.load(handle)["profile"].get("defaults") or {}).get(key)
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return value
    return None


def hardware_medians(record, status):
    """({point id: hardware medians of its timed steps}, [warning lines]) of the finished points
    (jobs.runs.hwsamples; points without samples are left out)."""
    out, lines, limits = {}, [], None
    for st in status.points:
        if st.state == DONE and st.run_dir:
            hw = hwsamples.medians(st.run_dir)
            if hw is not None:
                if limits is None:
                    limits = (_profile_default(record, "gpu_min_utilization") or hwsamples.DEFAULT_GPU_MIN_UTILIZATION,
                              _profile_default(record, "gpu_base_clock_mhz"))
                out[st.id] = hw
                lines += hwsamples.warnings(st.id, hw, *limits)
    return out, lines


def code_labels(record, status):
    """({point id: its column}, warning or None): the variant label, with the frozen copy the point
    ran (`@ code <hash>`) when the points ran more than one (`study run --refresh-code` between
    repeats): repeats of two copies are kept apart as variants are, never pooled (issue 47, 11).
    A point not run yet will run the study's current copy."""
    ran = {}
    by_id = {p.id: p for p in record.points}
    for st in status.points:
        if st.id in by_id and st.run_dir and by_id[st.id].code.get(st.run_dir):
            ran[st.id] = by_id[st.id].code[st.run_dir]
    copies = sorted(set(ran.values()))
    if len(copies) < 2:
        return {p.id: p.variant_label for p in record.points}, None
    current = (record.code or {}).get("sha256") or "not frozen"
    labels = {p.id: f"{p.variant_label} @ code {ran.get(p.id, current)[:12]}" for p in record.points}
    return labels, (f"code: the points ran {len(copies)} frozen copies ({', '.join(c[:12] for c in copies)}; "
                    "refreshed with --refresh-code): each copy's repeats have their own column, never pooled")


def tensorboard_files(status):
    """Each point's event directories and profiler traces (jobs.runs.tensorboard), of its latest
    attempt, and the command that shows every point side by side (`recsys-submit tensorboard`)."""
    points, named = [], []
    for st in status.points:
        dirs = tb.point_logdirs(st.id, st.run_dir) if st.run_dir else []
        if not dirs:
            continue
        traces = {}
        for _, path in dirs:
            for rank, found in tb.traces(path).items():
                traces.setdefault(str(rank), []).extend(found)
        points.append({"point": st.id, "logdirs": [{"name": n, "path": p} for n, p in dirs],
                       "events": any(tb.has_events(p) for _, p in dirs), "traces": traces})
        named += dirs
    try:
        command = tb.shell_line(tb.command(named)) if named else None
    except RequestError:         # a path TensorBoard's --logdir_spec cannot carry (a comma)
        command = None
    profile = tb.profile_command(named) if named else None
    return {"points": points, "command": command, "profile_command": profile and tb.shell_line(profile)}
