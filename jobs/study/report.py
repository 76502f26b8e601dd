"""The report of a study: the scaling table (markdown, CSV, JSON) and the plot (PNG).

Rows follow NVIDIA's published scaling tables: one row per size (GPUs, nodes, batch per GPU,
global batch) and, per variant, one cell. Each repeat of a point gives one throughput; a cell
shows their median (with min-max, n and the coefficient of variation), and every other figure of
the cell is derived from that one median, so the columns never contradict each other: step time
= global batch / median throughput, speedup = median / baseline median, efficiency = speedup /
(GPUs / baseline GPUs). The baseline of a variant is its smallest size in the spec; when that
cell has no throughput, speedup and efficiency stay empty rather than being rebased onto another
size. Numbers come only from the points' engine `summary` records (jobs.runs.enginelog); a failed
point shows as failed with its reason, never as a missing row. matplotlib is imported only for
the plot (an optional extra: `recsys-submit[plot]`).

Next to the scaling figures (report version 3): every cell whose point matches a row NVIDIA
published (jobs.study.published: model, the platform of the study's profile, GPUs, batch per GPU,
precision, XLA) carries the published throughput and measured / published; an AMP cell whose
study also ran the same size at full precision carries the speedup to mixed precision (NVIDIA's
"throughput speedup (full precision to mixed precision)"); and a point whose engine summary has
a `step_breakdown` gets the table of where its step time goes (ms and % per phase, over the mean
of the ranks and the slowest rank, and each exchange's achieved bandwidth), from its median
repeat, with a stacked-bar plot per variant.
"""

import csv
import glob
import io
import json
import os
import statistics
import time

from jobs.errors import RequestError
from jobs.planning.request import slug
from jobs.runs.atomic import storage_error, write_bytes, write_group
from jobs.runs import tensorboard as tb
from jobs.runs.enginelog import THROUGHPUT, WORLD_SIZE, job_logs, number, startup, with_state
from jobs.runs import hwsamples
from slurm.common.hostlist import expand as expand_hostlist, natural_key

from . import published
from .plots import gpu_axes, load_pyplot, make_out_dir, plot_wanted, png
from .run import DONE, FAILED, MISSING, UNKNOWN, StudyRecord, poll

REPORT_VERSION = 3
# a cell whose repeats spread more than this is flagged: its median hides a noisy measurement
SPREAD_CV, SPREAD_RATIO = 0.10, 1.25
# provenance keys that differ between points by nature (the nodes are shown as "ran on")
PER_POINT_PROVENANCE = ("nodes", "slurm_job_id")
# header order of the provenance keys the engine writes; others follow, sorted
PROVENANCE_ORDER = ("python", "tensorflow", "keras", "horovod", "horovod_build", "mpi", "numpy", "cuda", "cudnn",
                    "nccl", "gpu_model", "cpu_model", "slurm_version", "git_commit", "git_dirty", "profile",
                    "profile_sha256")
WARN = "\u26a0"
# the engine summary's step breakdown (docs/studies.md, "Where the step time goes")
BREAKDOWN = "step_breakdown"
BREAKDOWN_PHASES = ("input_wait", "compute", "embedding_exchange", "gradient_exchange", "optimizer", "remainder")
EXCHANGES = ("embedding_exchange", "gradient_exchange")


def _engine_version():
    try:
        from importlib.metadata import version

        return version("recsys-submit")
    except Exception:       # not installed as a distribution (a bare checkout)
        return "unknown"


def _nodelist(run_dir):
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
    point ran on the first nodes of one node set (a study in one allocation: jobs.study.allocation),
    "allocation": whether every finished point ran in a study allocation}."""
    points, in_allocation = {}, []
    by_id = {p.id: p for p in record.points}
    for st in status.points:
        if st.state == DONE and st.run_dir:
            found = sorted(_nodelist(st.run_dir))
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


def _code_text(code):
    """The report's line on the code the points ran."""
    if not code or not code["points"]:
        return None
    hashes = sorted({h or "not frozen" for h in code["points"].values()})
    profiles = code.get("profiles") or {}
    if not profiles or not any(profiles.values()):      # a study from before frozen profiles
        profile = ""
    elif code.get("profile_same"):
        profile = f"; every point ran with the study's frozen profile {next(iter(profiles.values()))[:16]}"
    else:
        profile = "; profile NOT one copy: " + ", ".join(f"{p} {(h or 'not frozen')[:16]}"
                                                          for p, h in sorted(profiles.items()))
    if code["same"]:
        commit = code.get("git_commit")
        origin = (f", copied from commit {commit[:12]}{' with local changes' if code.get('git_dirty') else ''}"
                  if commit else "")
        return f"- code: every point ran the study's frozen copy {hashes[0][:16]} (study-dir code/{origin}){profile}"
    listed = ", ".join(f"{p} {(h or 'not frozen')[:16]}" for p, h in sorted(code["points"].items()))
    return f"- code: NOT one copy ({len(code['changes'])} refresh(es) recorded): {listed}{profile}"


def _node_sets_text(sets):
    """The report's line on where the points ran."""
    if not sets or not sets["points"]:
        return None
    if sets["shared"]:
        widest = max(sets["points"].values(), key=lambda n: len(n.split(",")))
        how = "in study allocations" if sets["allocation"] else "as separate jobs"
        return (f"- node sets: one node set: every point ran on the first nodes of {widest} ({how}; "
                "node set of each point in scaling.json)")
    listed = ", ".join(f"{p} on {n}" for p, n in sorted(sets["points"].items()))
    return f"- node sets: NOT one node set (points differ by their nodes as well as their size): {listed}"


def _hosts(nodelists):
    """Host names of Slurm node lists ("node1", "node[1-2]" -> node1, node2): each node once."""
    out = set()
    for nodelist in nodelists:
        try:
            out.update(expand_hostlist(nodelist))
        except ValueError:
            out.add(nodelist)           # not a host list this reader knows: shown as recorded
    return out


def _size_text(gpus, nodes, gpus_per_node):
    return f"{gpus} GPU{'' if gpus == 1 else 's'} ({nodes} x {gpus_per_node})"


def _not_measured(point_id, st):
    """Why a point gives no throughput, in the words of a baseline problem."""
    if st.state == FAILED:
        return f"{point_id} failed: {st.reason or st.job_state}"
    if st.state == DONE:
        return f"{point_id} finished but its summary has no positive {THROUGHPUT}"
    if st.state == UNKNOWN:
        return f"{point_id} is unknown (Slurm has not reported its job yet)"
    if st.state == MISSING:     # never submitted, or not reached before its allocation's end of time
        return f"{point_id} {st.reason}" if st.reason else f"{point_id} was never submitted"
    return f"{point_id} is {st.state} (not finished yet)"


def _spread(values):
    """(cv, max/min, warning or None) of a cell's throughputs; cv is the sample stdev over the
    mean, None for a single repeat (one value has no spread)."""
    cv = statistics.stdev(values) / statistics.mean(values) if len(values) >= 2 else None
    ratio = max(values) / min(values)
    noisy = (cv is not None and cv > SPREAD_CV) or ratio > SPREAD_RATIO
    return cv, ratio, noisy


def _key(value):
    return json.dumps(value, sort_keys=True, default=str)


def _provenance(points):
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
            counts.setdefault(_key(prov.get(key)), [0, prov.get(key)])[0] += 1
        common[key] = max(counts.values(), key=lambda c: c[0])[1]
        for point_id, prov in recorded:
            if _key(prov.get(key)) != _key(common[key]):
                differences.append({"point": point_id, "key": key, "value": prov.get(key), "common": common[key]})
    differences.sort(key=lambda d: [p for p, _ in recorded].index(d["point"]))
    return (common if recorded else None), differences, missing


def _platform(record):
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


def _hardware(record, status):
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


def _median_repeat(entries):
    """The entry [(throughput, point id, summary)] whose throughput is the median (the lower of
    the two middle ones for an even count)."""
    ranked = sorted(entries, key=lambda e: e[0])
    return ranked[(len(ranked) - 1) // 2]


def _breakdown(point_id, data):
    """A cell's step breakdown from one summary's `step_breakdown`: per phase ms and % of the step
    (mean over ranks, slowest rank), each exchange's bytes per step and achieved GB/s; None when
    absent or malformed."""
    if not isinstance(data, dict) or not isinstance(data.get("mean"), dict):
        return None
    step = number(data["mean"], "step_ms")
    if step is None or step <= 0:
        return None
    phases = [p for p in data.get("phases") or BREAKDOWN_PHASES if isinstance(p, str)]

    def side(values):
        if not isinstance(values, dict):
            return None
        step_ms = number(values, "step_ms")
        if step_ms is None or step_ms <= 0:
            return None
        out = {"step_ms": step_ms, "phases": {}}
        for phase in phases:
            ms = number(values, f"{phase}_ms")
            out["phases"][phase] = {"ms": ms, "pct": None if ms is None else 100.0 * ms / step_ms}
        out["phase_sum_ms"] = sum(v["ms"] for v in out["phases"].values() if v["ms"] is not None)
        if "rank" in values:
            out["rank"] = values["rank"]
        return out

    mean, slowest = side(data["mean"]), side(data.get("slowest_rank"))
    sent = data.get("bytes_per_step") if isinstance(data.get("bytes_per_step"), dict) else {}
    exchanges = {}
    for name in EXCHANGES:
        size = number(sent, name)

        def gbps(over):
            ms = over and over["phases"].get(name, {}).get("ms")
            return size / (ms / 1000.0) / 1e9 if size is not None and ms else None

        exchanges[name] = {"bytes": size, "gbps_mean": gbps(mean), "gbps_slowest": gbps(slowest)}
    # version 2 records the same run's timed step and split / timed (version 1: absent, None)
    return {"point": point_id, "version": data.get("version"), "steps": data.get("steps"),
            "method": data.get("method"), "phases": phases, "mean": mean, "slowest_rank": slowest,
            "exchanges": exchanges, "timed_step_ms": number(data, "timed_step_ms"),
            "split_over_timed": number(data, "split_over_timed")}


def _code_labels(record, status):
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


def build(record, status):
    """The report as plain data: header facts, one row per size, and the warnings to print."""
    spec = record.spec
    by_id = {p.id: p for p in status.points}
    label, code_warning = _code_labels(record, status)
    variants = []
    for point in record.points:
        if label[point.id] not in variants:
            variants.append(label[point.id])
    size_of = {p.id: (p.gpus, p.nodes, p.gpus_per_node, p.batch_per_gpu, p.global_batch) for p in record.points}
    sizes = sorted(set(size_of.values()))
    grouped = {}
    for point in record.points:
        grouped.setdefault((size_of[point.id], label[point.id]), []).append(point)
    failures, pending, nodes_used, measured = [], [], set(), []
    cells = {}
    for key, points in grouped.items():
        cell = {"points": [], "measured": [], "throughputs": [], "world_sizes": [], "failed": [], "pending": [],
                "startups": [], "missing": [], "summaries": []}
        for point in sorted(points, key=lambda p: p.repeat):
            st = by_id[point.id]
            cell["points"].append(point.id)
            if st.state == DONE:
                value = number(st.summary, THROUGHPUT)
                if value is None or value <= 0:
                    reason = f"summary has no positive {THROUGHPUT}"
                    cell["failed"].append(f"{point.id}: {reason}")
                    cell["missing"].append(_not_measured(point.id, st))
                    failures.append({"point": point.id, "state": "COMPLETED", "reason": reason,
                                     "run_dir": st.run_dir})
                    continue
                cell["throughputs"].append(value)
                cell["measured"].append(point.id)
                cell["summaries"].append((value, point.id, st.summary))
                cell["world_sizes"].append(st.summary.get(WORLD_SIZE))
                measured.append((point.id, st.summary))
                if st.run_dir:
                    first = [number(r, "since_start_s") for r in startup(job_logs(st.run_dir, "main"))
                             if r.get("phase") == "first_step"]
                    if first and first[-1] is not None:
                        cell["startups"].append(first[-1])
                    nodes_used |= _hosts(_nodelist(st.run_dir))
            elif st.state == FAILED:
                cell["failed"].append(f"{point.id}: {st.reason}")
                cell["missing"].append(_not_measured(point.id, st))
                failures.append({"point": point.id, "state": st.job_state, "reason": st.reason,
                                 "run_dir": st.run_dir})
            else:                       # running, pending, unknown (not reported yet), missing
                cell["pending"].append(point.id)
                cell["missing"].append(_not_measured(point.id, st))
                pending.append({"point": point.id, "state": st.state})
        cells[key] = cell
    # the baseline of a variant: its smallest size in the spec, measured or not
    baseline, baseline_problems = {}, []
    for variant in variants:
        size = min(s for s, v in grouped if v == variant)
        cell = cells[(size, variant)]
        tps = cell["throughputs"]
        baseline[variant] = {"gpus": size[0], "nodes": size[1], "gpus_per_node": size[2], "points": cell["points"],
                             "throughput": statistics.median(tps) if tps else None}
        if not tps:
            baseline_problems.append(
                f"variant {variant}: baseline point{'s' if len(cell['missing']) > 1 else ''} "
                f"{'; '.join(cell['missing'])}; speedup and efficiency of "
                f"{variant} left empty")
    platform, node = _platform(record)
    variant_of = {label[p.id]: p.variant for p in record.points}
    settings = {v: published.settings_of(spec.get("engine_args"), variant_of[v], platform) for v in variants}
    rows, spread_warnings, breakdown_problems = [], [], []
    for size in sizes:
        gpus, nodes, gpn, per_gpu, global_batch = size
        row = {"gpus": gpus, "nodes": nodes, "gpus_per_node": gpn, "batch_per_gpu": per_gpu,
               "global_batch": global_batch, "variants": {}}
        for variant in variants:
            cell = cells.get((size, variant))
            if cell is None:
                continue
            tps = cell["throughputs"]
            out = {"points": cell["points"], "throughputs": tps, "n": len(tps), "failed": cell["failed"],
                   "pending": cell["pending"], "world_sizes": cell["world_sizes"], "throughput": None,
                   "throughput_min": None, "throughput_max": None, "cv": None, "step_time_ms": None,
                   "startup_s": None, "speedup": None, "efficiency": None, "spread_warning": None,
                   "precision": settings[variant][0], "xla": settings[variant][1], "published": None,
                   "measured_vs_published": None, "published_amp_speedup": None, "amp_speedup": None,
                   "amp_speedup_vs": None, "breakdown": None}
            row_match = published.match(spec.get("model"), platform, gpus, per_gpu, *settings[variant])
            if row_match is not None:
                out["published"] = {"throughput": row_match.throughput[out["precision"]], "table": row_match.table,
                                    "model_size": row_match.model_size, "xla": row_match.xla,
                                    "platform": row_match.platform, "source": row_match.source}
                out["published_amp_speedup"] = row_match.amp_speedup()
            with_breakdown = [e for e in cell["summaries"] if isinstance(e[2], dict) and BREAKDOWN in e[2]]
            if with_breakdown:
                _, point_id, summary = _median_repeat(with_breakdown)
                out["breakdown"] = _breakdown(point_id, summary[BREAKDOWN])
                if out["breakdown"] is None:
                    breakdown_problems.append(f"{point_id}: its {BREAKDOWN} is malformed (no mean step_ms); "
                                              "left out of the breakdown")
            if tps:
                median = statistics.median(tps)
                cv, ratio, noisy = _spread(tps)
                out.update(throughput=median, throughput_min=min(tps), throughput_max=max(tps), cv=cv,
                           step_time_ms=global_batch * 1000.0 / median,
                           startup_s=statistics.median(cell["startups"]) if cell["startups"] else None)
                base = baseline[variant]
                if base["throughput"] is not None:
                    out["speedup"] = median / base["throughput"]
                    out["efficiency"] = out["speedup"] / (gpus / base["gpus"])
                if out["published"] is not None:
                    out["measured_vs_published"] = median / out["published"]["throughput"]
                if noisy:
                    out["spread_warning"] = (
                        f"{_size_text(gpus, nodes, gpn)} {variant}: repeats {', '.join(cell['measured'])} gave "
                        f"{', '.join(fmt_number(t) for t in tps)} samples/s (max/min {ratio:.2f}, cv "
                        f"{'-' if cv is None else f'{cv:.2f}'}; flagged above cv {SPREAD_CV:.2f} or max/min "
                        f"{SPREAD_RATIO:.2f}): the median {fmt_number(median)} hides a noisy measurement")
                    spread_warnings.append(out["spread_warning"])
            row["variants"][variant] = out
        rows.append(row)
    _amp_speedups(rows, variants, variant_of, settings, published.load().full_precision(platform))
    provenance, differences, no_provenance = _provenance(measured)
    hardware, hardware_warnings = _hardware(record, status)
    warnings = [code_warning] * bool(code_warning) + list(baseline_problems) + spread_warnings + breakdown_problems + hardware_warnings + [
        f"provenance: point {d['point']} has {d['key']}={_show(d['value'])}, the other points "
        f"{_show(d['common'])}" for d in differences]
    return {
        "version": REPORT_VERSION,
        "study": record.name,
        "model": spec.get("model"),
        "scaling": spec.get("scaling"),
        "profile": record.profile,
        "nodes_used": sorted(nodes_used, key=natural_key),
        "node_sets": node_sets(record, status),
        "code": code_used(record, status),
        "max_nodes": max((p.nodes for p in record.points), default=0),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "engine_version": _engine_version(),
        "warmup_steps": spec.get("warmup_steps"),
        "steps": spec.get("steps"),
        "variants": variants,
        "platform": platform,
        "node_type": node,
        "published_matches": sum(1 for r in rows for c in r["variants"].values() if c["published"]),
        "breakdown_measured": any(c["breakdown"] for r in rows for c in r["variants"].values()),
        "hardware": hardware,
        "hardware_warnings": hardware_warnings,
        "tensorboard": _tensorboard(status),
        "baseline": baseline,
        "baseline_problems": baseline_problems,
        "provenance": provenance,
        "provenance_differences": differences,
        "no_provenance": no_provenance,
        "rows": rows,
        "failures": failures,
        "pending": pending,
        "warnings": warnings,
    }


def _amp_speedups(rows, variants, variant_of, settings, full):
    """NVIDIA's "throughput speedup (full precision to mixed precision)": each AMP cell's median /
    the median of the same size at full precision (the platform's: tf32 on A100, fp32 on V100;
    tf32 first on another platform) whose other variant settings are the same."""
    def others(v):
        return _key({k: x for k, x in variant_of[v].items() if k not in ("amp", "precision")}), settings[v][1]

    order = [full] if full else ["tf32", "fp32"]
    for amp in (v for v in variants if settings[v][0] == "amp"):
        partners = [v for v in variants if settings[v][0] != "amp" and others(v) == others(amp)]
        partners.sort(key=lambda v: order.index(settings[v][0]) if settings[v][0] in order else len(order))
        if not partners:
            continue
        for row in rows:
            cell, base = row["variants"].get(amp), row["variants"].get(partners[0])
            if cell is None or base is None:
                continue
            cell["amp_speedup_vs"] = partners[0]
            if cell["throughput"] is not None and base["throughput"] is not None:
                cell["amp_speedup"] = cell["throughput"] / base["throughput"]


def fmt_number(value, digits=0):
    """A figure as the report and compare print it: thousands separated, "-" for none."""
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _show(value):
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return _key(value)
    return str(value)


def _cell_text(cell):
    if cell is None:
        return "-"
    if cell["throughput"] is None:
        if cell["failed"]:
            return "FAILED"
        return "pending"
    text = fmt_number(cell["throughput"])
    if cell["n"] > 1:
        text += (f" ({fmt_number(cell['throughput_min'])}-{fmt_number(cell['throughput_max'])}, n={cell['n']}, "
                 f"cv {cell['cv']:.2f})")
    if cell["spread_warning"]:
        text += f" {WARN}"
    if cell["failed"]:
        text += f" [{len(cell['failed'])} failed]"
    return text


def _baseline_text(report):
    parts = []
    for v in report["variants"]:
        base = report["baseline"][v]
        text = _size_text(base["gpus"], base["nodes"], base["gpus_per_node"])
        if base["throughput"] is None:
            text += " (no throughput: speedup and efficiency left empty)"
        parts.append(text if report["variants"] == ["default"] else f"{v}: {text}")
    return "; ".join(parts)


def markdown(report):
    """The table in NVIDIA's layout, with a header saying what was measured where, and how."""
    strong = report["scaling"] == "strong"
    lines = [f"# Scaling study `{report['study']}`: {report['model']}, {report['scaling']} scaling", "",
             f"- profile: {report['profile']}; up to {report['max_nodes']} node(s) per point; ran on: "
             f"{', '.join(report['nodes_used']) or '-'}",
             f"- date: {report['date']}; engine: recsys-submit {report['engine_version']}",
             f"- benchmark mode: {report['warmup_steps']} warm-up + {report['steps']} timed steps per point; "
             "throughput = median of the n repeats (min-max); spread cv = sample stdev / mean of the repeats "
             f"(n >= 2); {WARN} marks a cell with cv > {SPREAD_CV:.2f} or max/min > {SPREAD_RATIO:.2f}",
             "- step time = global batch / median throughput (the same figure as the throughput column)",
             "- start-up = seconds from process start to the end of the first step (Horovod init, "
             "data, model build, first step), kept out of the throughput",
             "- speedup = median throughput / the baseline's median; efficiency = speedup / (GPUs / baseline "
             "GPUs)" + ("" if strong else " (weak scaling: the batch per GPU is fixed, so efficiency is the "
                                          "weak-scaling efficiency)"),
             f"- baseline: {_baseline_text(report)}"]
    if _node_sets_text(report.get("node_sets")):
        lines.append(_node_sets_text(report.get("node_sets")))
    if _code_text(report.get("code")):
        lines.append(_code_text(report.get("code")))
    if report["provenance"] is not None:
        lines.append("- provenance: " + ", ".join(f"{k} {_show(v)}" for k, v in report["provenance"].items()) +
                     ("" if not report["provenance_differences"] else " (points that differ: below)"))
    else:
        lines.append("- provenance: none recorded (summaries of an older engine)")
    amp_columns = [v for v in report["variants"] if any(r["variants"].get(v, {}).get("amp_speedup_vs")
                                                        for r in report["rows"])]
    if amp_columns:
        pairs = {v: next(r["variants"][v]["amp_speedup_vs"] for r in report["rows"]
                         if r["variants"].get(v, {}).get("amp_speedup_vs")) for v in amp_columns}
        lines.append("- speedup to mixed precision = the AMP cell's median / the median of the same size at full "
                     "precision (NVIDIA's \"throughput speedup (full precision to mixed precision)\"): "
                     + "; ".join(f"{v} vs {pairs[v]}" for v in amp_columns))
    lines.append("")
    head = ["GPUs", "nodes", "batch size / GPU", "global batch"]
    for v in report["variants"]:
        tag = "" if v == "default" else f" {v}"
        head += [f"throughput{tag} (samples/s)", f"step time{tag} (ms)", f"start-up{tag} (s)",
                 f"{'strong' if strong else 'weak'} scaling speedup{tag}", f"efficiency{tag}"]
        if v in amp_columns:
            head.append(f"speedup to mixed precision{tag}")
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---:" for _ in head) + "|")
    spread = []
    for row in report["rows"]:
        cells = [str(row["gpus"]), f"{row['nodes']} x {row['gpus_per_node']}", str(row["batch_per_gpu"]),
                 str(row["global_batch"])]
        for v in report["variants"]:
            cell = row["variants"].get(v)
            cells += [_cell_text(cell), fmt_number(cell and cell["step_time_ms"], 1), fmt_number(cell and cell["startup_s"], 1),
                      fmt_number(cell and cell["speedup"], 2), fmt_number(cell and cell["efficiency"], 2)]
            if v in amp_columns:
                cells.append(fmt_number(cell and cell["amp_speedup"], 2))
            if cell and cell["spread_warning"]:
                spread.append(cell["spread_warning"])
        lines.append("| " + " | ".join(cells) + " |")
    if spread:
        lines += [""] + [f"{WARN} {text}" for text in spread]
    lines += _published_lines(report)
    lines += _breakdown_lines(report)
    lines += _projection_lines(report)       # with a fabric: the bands of the next sizes up
    lines += _hardware_lines(report)
    lines += _tensorboard_lines(report)
    if report["baseline_problems"]:
        lines += ["", "Baseline problems:", ""] + [f"- {text}" for text in report["baseline_problems"]]
    if report["provenance_differences"]:
        lines += ["", "Provenance differences (value of the point vs the other points):", ""]
        lines += [f"- `{d['point']}` {d['key']}: {_show(d['value'])} vs {_show(d['common'])}"
                  for d in report["provenance_differences"]]
    if report["no_provenance"]:
        lines += ["", f"No provenance recorded (an older engine): {', '.join(report['no_provenance'])}"]
    if report["failures"]:
        lines += ["", "Failed points (resubmitted by `recsys-submit study run`):", ""]
        lines += [f"- `{f['point']}` {with_state(f['state'], f['reason'])} ({f['run_dir']})" for f in report["failures"]]
    if report["pending"]:
        lines += ["", f"Not finished yet: {', '.join(p['point'] + ' (' + p['state'] + ')' for p in report['pending'])}"]
    return "\n".join(lines) + "\n"


def _projection_lines(report):
    """The "Projection" section (jobs.study.projection.for_report's data; nothing without it): the
    measured points with their projected bands and the bands of the next sizes up."""
    proj = report.get("projection")
    if not proj:
        return []
    head = ["", f"## Projection on {report.get('profile')}", ""]
    if "error" in proj:
        return head + [f"Not made: {proj['error']}"]
    c = proj["calibration"]
    lines = head + [f"Calibrated on {c['source']}; fabric: {proj['fabric']['source']}. The band runs from no "
                    "overlap of compute and exchanges to full overlap (`recsys-submit study project`, "
                    "docs/studies.md).", "",
                    "| GPUs | measured samples/s | projected samples/s (no overlap - full overlap) | vs band | dominant |",
                    "|---:|---:|---|---:|---|"]
    for p in proj["points"]:
        meas = p.get("measured_throughput")
        where = p.get("measured_vs_band")
        vs = "-" if not where else ("inside" if where["inside"] else f"{100 * where['error']:+.1f} %")
        lines.append(f"| {p['gpus']} | {'-' if not meas else f'{meas:,.0f}'} | {p['throughput_low']:,.0f} - "
                     f"{p['throughput_high']:,.0f} | {vs} | {p['dominant']}"
                     + ("" if p["fits"] in (None, True) else ", DOES NOT FIT") + " |")
    if proj.get("next_sizes"):
        lines += ["", f"Next sizes up: {', '.join(str(n) for n in proj['next_sizes'])} GPUs (2x, 4x, 8x the largest "
                      "measured)."]
    return lines


def _published_lines(report):
    """The "Measured vs published" section: every cell that matches a row NVIDIA published."""
    lines = ["", "## Measured vs published", ""]
    platforms = ", ".join(sorted({r.platform for r in published.rows()}))
    if report["platform"] is None:
        return lines + [f"Profile {report['profile']} (node type {report['node_type'] or 'unknown'}) is not a "
                        f"platform NVIDIA published results for ({platforms}): nothing to compare."]
    matched = [(row, v, row["variants"][v]) for row in report["rows"] for v in report["variants"]
               if v in row["variants"] and row["variants"][v]["published"]]
    if not matched:
        return lines + [f"No point matches a row NVIDIA published for {report['model']} on {report['platform']} "
                        "(GPUs, batch per GPU, precision, XLA): `recsys-submit study reference --model "
                        f"{report['model']} --profile {report['profile']}` writes the study that does, "
                        "`--list` shows what is published."]
    lines += [f"Platform {report['platform']} (the profile's node type). Published = NVIDIA's training throughput "
              "for the same model, GPUs, batch per GPU, precision and XLA (XLA where the row states it); "
              "measured / published uses the cell's median.", "",
              "| GPUs | batch size / GPU | variant | precision | XLA | measured (samples/s) | published (samples/s) | "
              "measured / published | speedup to mixed precision, measured | published | published row |",
              "|---:|---:|---|---|---|---:|---:|---:|---:|---:|---|"]
    sources = []
    for row, v, cell in matched:
        pub = cell["published"]
        what = pub["table"] + (f" ({pub['model_size']})" if pub["model_size"] else "") + \
            ("" if pub["xla"] is not None else ", XLA not stated")
        lines.append(f"| {row['gpus']} | {row['batch_per_gpu']} | {v} | {cell['precision']} | "
                     f"{'on' if cell['xla'] else 'off'} | {fmt_number(cell['throughput'])} | {fmt_number(pub['throughput'])} | "
                     f"{fmt_number(cell['measured_vs_published'], 2)} | {fmt_number(cell['amp_speedup'], 2)} | "
                     f"{fmt_number(cell['published_amp_speedup'], 2)} | {what} |")
        if f"{pub['table']}: {pub['source']}" not in sources:
            sources.append(f"{pub['table']}: {pub['source']}")
    return lines + [""] + [f"Source {s}." for s in sources]


def _phase_text(over, phase):
    value = over["phases"].get(phase) if over else None
    if not value or value["ms"] is None:
        return "-"
    return f"{value['ms']:,.2f} ({value['pct']:.1f}%)"


def _breakdown_lines(report):
    """The "Where the step time goes" section: one table per variant, two rows per point (the mean
    over the ranks and the slowest rank)."""
    lines = ["", "## Where the step time goes", ""]
    if not report["breakdown_measured"]:
        return lines + ["Not measured: no point's engine summary has a `step_breakdown` (study spec "
                        "`breakdown_steps: 0`, or an engine older than the breakdown)."]
    lines.append("Per point, the split steps of its median repeat: each phase in ms and % of the step, over the "
                 "mean of the ranks and over the slowest rank; compute and the embedding exchange are each timed "
                 "alone, so remainder = step - the timed phases is measured: what the step's forward+backward "
                 "took beyond them (waits for other ranks, overlap, noise), of either sign (breakdowns of "
                 "version 1 derived compute from it and show 0); exchange bandwidth = bytes per step / the "
                 "phase's time. The split step calls and waits for each phase on its own, so it differs from the "
                 "timed step of the throughput column (shown next to it, and split / timed: the same run's "
                 "timed step where recorded): the difference is the cost of splitting, not of the model. "
                 "`study project` calibrates on the timed step; the breakdown only apportions it (its parts "
                 "scaled by timed / split step).")
    head = ["GPUs", "nodes", "ranks", "split step (ms)", "timed step (ms)", "split / timed"] \
        + [p.replace("_", " ") for p in BREAKDOWN_PHASES] + [f"{e.replace('_', ' ')} GB/s" for e in EXCHANGES]
    for v in report["variants"]:
        cells = [(row, row["variants"].get(v)) for row in report["rows"] if row["variants"].get(v)]
        if not any(c["breakdown"] for _, c in cells):
            lines += ["", f"{v}: not measured."]
            continue
        lines += ["", f"### {v}" if v != "default" else "### all points", "",
                  "| " + " | ".join(head) + " |", "|" + "|".join("---:" if i != 2 else "---" for i in range(len(head))) + "|"]
        for row, cell in cells:
            size = [str(row["gpus"]), f"{row['nodes']} x {row['gpus_per_node']}"]
            b = cell["breakdown"]
            if b is None:
                lines.append("| " + " | ".join(size + ["not measured"] + ["-"] * (len(head) - 3)) + " |")
                continue
            for label, over, key in (("mean", b["mean"], "gbps_mean"), ("slowest", b["slowest_rank"], "gbps_slowest")):
                if over is None:
                    continue
                if label == "slowest":
                    label = f"slowest (rank {over.get('rank', '?')})"
                timed = b.get("timed_step_ms") or cell["step_time_ms"]
                ratio = over["step_ms"] / timed if timed else None
                lines.append("| " + " | ".join(size + [label, fmt_number(over["step_ms"], 2), fmt_number(cell["step_time_ms"], 2),
                                                       fmt_number(ratio, 2)]
                                               + [_phase_text(over, p) for p in BREAKDOWN_PHASES]
                                               + [fmt_number(b["exchanges"][e][key], 2) for e in EXCHANGES]) + " |")
    methods = sorted({f"{c['breakdown']['steps']} step(s), {c['breakdown']['method']}" for r in report["rows"]
                      for c in r["variants"].values() if c["breakdown"]})
    return lines + ["", "Measured over: " + "; ".join(methods) + "."] + _slowest_trace_lines(report)


def _hardware_lines(report):
    """The hardware during each point's timed steps (slurm/hwsample.py): medians of ~1 Hz samples."""
    hardware = report.get("hardware") or {}
    if not hardware:
        return []
    lines = ["", "## The hardware during the timed steps", "",
             "Medians of the samples (about 1 a second, every node: slurm/hwsample.py) between each point's "
             "first step and its summary; a value over nodes is the median of the nodes' medians. CPU: the "
             "job's CPUs on the node (lowest rank: the least busy rank's cores of the binding table); "
             "network: InfiniBand port counters, else the interfaces' bytes without loopback.", "",
             "| point | nodes | samples | CPU busy % | lowest rank CPU % | memory (GiB) | net rx / tx (MB/s) "
             "| GPU busy % (min-max) | GPU memory (MiB) | power (W) | SM clock (MHz, base) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def span(gpus, key, digits=0):
        values = [g[key] for g in gpus if g.get(key) is not None]
        if not values:
            return "-"
        return fmt_number(min(values), digits) if min(values) == max(values) else \
            f"{fmt_number(min(values), digits)}-{fmt_number(max(values), digits)}"

    for point, hw in sorted(hardware.items()):
        gpus = hw.get("gpus") or []
        base = sorted({g["base_mhz"] for g in gpus if g.get("base_mhz")})
        lines.append(f"| `{point}` | {hw['nodes']} | {hw['samples']} | {fmt_number(hw['cpu_busy_pct'])} | "
                     f"{fmt_number(hw['rank_cpu_busy_pct_min'])} | {fmt_number(hw['mem_used_gib'], 1)} | "
                     f"{fmt_number(hw['net_rx_mb_s'], 1)} / {fmt_number(hw['net_tx_mb_s'], 1)} | "
                     f"{span(gpus, 'util_pct')} | {span(gpus, 'mem_used_mib')} | {span(gpus, 'power_w')} | "
                     f"{span(gpus, 'sm_mhz')}{' (' + ', '.join(fmt_number(b) for b in base) + ')' if base else ''} |")
    if report.get("hardware_warnings"):
        lines += [""] + [f"{WARN} {text}" for text in report["hardware_warnings"]]
    return lines


def _tensorboard(status):
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


def _tensorboard_lines(report):
    """The "TensorBoard" section: the command for every point side by side, each point's event
    directories and traces."""
    lines = ["", "## TensorBoard", ""]
    found = (report.get("tensorboard") or {}).get("points") or []
    if not found:
        return lines + ["No point wrote event files or traces (logs/tensorboard/<job> in its run directory)."]
    lines += ["Each point's event files (loss, learning rate, throughput, step time, evaluation, breakdown "
              "phases) and tf.profiler traces (spec `profile_steps`), of its latest attempt; TensorBoard names "
              "each point by its id, each rank `<point>/rank<k>`. `recsys-submit tensorboard <study>` prints this "
              "command and the ssh tunnel line; a trace opens in the Profile tab.", ""]
    if report["tensorboard"]["command"]:
        lines += ["```", report["tensorboard"]["command"], "```", ""]
    if report["tensorboard"].get("profile_command"):
        lines += ["The traces, in the Profile tab (TensorBoard 2.15's profile plugin reads only `--logdir`; its "
                  "runs are the paths below that directory):", "", "```", report["tensorboard"]["profile_command"],
                  "```", ""]
    lines += ["| point | event directory | traces (rank: file) |", "|---|---|---|"]
    for p in found:
        traces = "; ".join(f"{rank}: `{os.path.relpath(f, p['logdirs'][0]['path'])}`"
                           for rank, files in sorted(p["traces"].items(), key=lambda kv: int(kv[0])) for f in files)
        where = ", ".join(f"`{d['path']}`" for d in p["logdirs"])
        lines.append(f"| `{p['point']}` | {where}{'' if p['events'] else ' (no event file)'} | {traces or '-'} |")
    return lines


def _slowest_trace_lines(report):
    """Per point with a breakdown: the trace of its slowest rank to open (or how to get one)."""
    traced = {p["point"]: p for p in (report.get("tensorboard") or {}).get("points") or []}
    lines = []
    for row in report["rows"]:
        for v, cell in row["variants"].items():
            b = cell and cell["breakdown"]
            rank = b and b["slowest_rank"] and b["slowest_rank"].get("rank")
            if rank is None:
                continue
            point = traced.get(b["point"])
            files = (point or {}).get("traces", {}).get(str(rank))
            if files:
                run = point["logdirs"][0]["name"]
                lines.append(f"- `{b['point']}`: slowest rank {rank} (TensorBoard run `{run}/rank{rank}`): trace "
                             f"`{files[-1]}`, in the Profile tab (section TensorBoard)")
            else:
                lines.append(f"- `{b['point']}`: slowest rank {rank}: no trace of it; spec `profile_steps: "
                             "START-END` traces every rank of every point")
    return ["", "The slowest rank's trace, per point:", ""] + lines if lines else []


CSV_FIELDS = ("throughput", "throughput_min", "throughput_max", "n", "cv", "step_time_ms", "startup_s", "speedup",
              "efficiency", "failed", "spread_warning", "precision", "xla", "published", "measured_vs_published",
              "amp_speedup", "published_amp_speedup")


def csv_text(report):
    """The same rows as CSV: size columns, then `<variant> <field>` columns."""
    head = ["gpus", "nodes", "gpus_per_node", "batch_per_gpu", "global_batch"]
    for v in report["variants"]:
        head += [f"{v} {f}" for f in CSV_FIELDS]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(head)
    for row in report["rows"]:
        values = [row[k] for k in head[:5]]
        for v in report["variants"]:
            cell = row["variants"].get(v) or {}
            for f in CSV_FIELDS:
                value = cell.get(f)
                if f == "failed":
                    value = len(value or [])
                elif f == "published":
                    value = value and value["throughput"]
                values.append("" if value is None else value)
        writer.writerow(values)
    return out.getvalue()


BREAKDOWN_CSV_HEAD = (["variant", "gpus", "nodes", "gpus_per_node", "batch_per_gpu", "point", "ranks", "rank", "steps",
                      "method", "step_ms"] + [f"{p}_{u}" for p in BREAKDOWN_PHASES for u in ("ms", "pct")]
                     + [f"{e}_{u}" for e in EXCHANGES for u in ("bytes", "gbps")])


def breakdown_csv_text(report):
    """breakdown.csv: two rows per point with a breakdown (ranks = mean | slowest_rank); only the
    header when no point has one."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(BREAKDOWN_CSV_HEAD)
    for v in report["variants"]:
        for row in report["rows"]:
            cell = row["variants"].get(v)
            b = cell and cell["breakdown"]
            if not b:
                continue
            for ranks, over, key in (("mean", b["mean"], "gbps_mean"), ("slowest_rank", b["slowest_rank"],
                                                                         "gbps_slowest")):
                if over is None:
                    continue
                values = [v, row["gpus"], row["nodes"], row["gpus_per_node"], row["batch_per_gpu"], b["point"], ranks,
                          over.get("rank"), b["steps"], b["method"], over["step_ms"]]
                for phase in BREAKDOWN_PHASES:
                    value = over["phases"].get(phase) or {}
                    values += [value.get("ms"), value.get("pct")]
                for name in EXCHANGES:
                    values += [b["exchanges"][name]["bytes"], b["exchanges"][name][key]]
                writer.writerow(["" if x is None else x for x in values])
    return out.getvalue()






def figure(report):
    """The plot's figure: throughput vs GPUs on log-log axes (median with min-max error bars, the
    ideal line from the baseline when there is one, a straight line there; NVIDIA's published
    throughput as crosses where a cell matches one) and efficiency vs GPUs on a linear axis, one
    colour per variant, log2 GPU axes."""
    plt = load_pyplot()
    fig, (ax_tp, ax_eff) = plt.subplots(1, 2, figsize=(11, 4.2))
    for v in report["variants"]:
        pts = [(row["gpus"], row["variants"][v]) for row in report["rows"]
               if v in row["variants"] and row["variants"][v]["throughput"] is not None]
        if not pts:
            continue
        gpus = [g for g, _ in pts]
        med = [c["throughput"] for _, c in pts]
        bars = ax_tp.errorbar(gpus, med, yerr=[[m - c["throughput_min"] for m, (_, c) in zip(med, pts)],
                                               [c["throughput_max"] - m for m, (_, c) in zip(med, pts)]],
                              marker="o", capsize=4, label=f"{v} (median, min-max)")
        color = bars.lines[0].get_color()
        base = report["baseline"][v]
        if base["throughput"] is not None:
            ax_tp.plot(gpus, [base["throughput"] * g / base["gpus"] for g in gpus], linestyle="--", color=color,
                       alpha=0.6, label=f"{v} ideal")
            eff = [(g, c["efficiency"]) for g, c in pts if c["efficiency"] is not None]
            ax_eff.plot([g for g, _ in eff], [e for _, e in eff], marker="o", color=color, label=v)
        pub = [(g, c["published"]["throughput"]) for g, c in pts if c["published"]]
        if pub:
            ax_tp.plot([g for g, _ in pub], [t for _, t in pub], linestyle="none", marker="x", markersize=8,
                       color=color, label=f"{v} NVIDIA published")
    ticks = {row["gpus"] for row in report["rows"]}
    for ax, log_y in ((ax_tp, True), (ax_eff, False)):
        gpu_axes(ax, ticks, log_y=log_y)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    ax_eff.set_ylim(bottom=0)
    ax_tp.set_ylabel("throughput (samples/s, log scale, higher is better)")
    ax_eff.set_ylabel("parallel efficiency (1 = ideal)")
    ax_eff.axhline(1.0, linestyle="--", color="grey", alpha=0.6)
    fig.suptitle(f"{report['study']}: {report['model']} {report['scaling']} scaling on {report['profile']}")
    fig.tight_layout()
    return fig


def breakdown_figure(report, variant):
    """Stacked bars of one variant: one bar per point (the mean over ranks of its median repeat),
    one colour per phase, remainder included; a negative phase (a remainder below zero, when timed
    phases overlap) is drawn below zero; a dot marks the slowest rank's step time."""
    plt = load_pyplot()
    cells = [(row, row["variants"][variant]["breakdown"]) for row in report["rows"]
             if row["variants"].get(variant) and row["variants"][variant]["breakdown"]]
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(cells) + 3), 4.2))
    colors = plt.get_cmap("tab10")
    xs = list(range(len(cells)))
    up, down = [0.0] * len(cells), [0.0] * len(cells)
    for i, phase in enumerate(BREAKDOWN_PHASES):
        values = [(b["mean"]["phases"].get(phase) or {}).get("ms") or 0.0 for _, b in cells]
        bottoms = [u if value >= 0 else d for value, u, d in zip(values, up, down)]
        ax.bar(xs, values, bottom=bottoms, color=colors(i), label=phase.replace("_", " "), width=0.6)
        up = [u + value if value >= 0 else u for value, u in zip(values, up)]
        down = [d + value if value < 0 else d for value, d in zip(values, down)]
    slow = [(x, b["slowest_rank"]["step_ms"]) for x, (_, b) in zip(xs, cells) if b["slowest_rank"]]
    if slow:
        ax.plot([x for x, _ in slow], [y for _, y in slow], linestyle="none", marker="o", color="black",
                label="slowest rank's step")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xticks(xs, [f"{row['gpus']} GPU{'s' if row['gpus'] > 1 else ''}\n({row['nodes']} x {row['gpus_per_node']})"
                       for row, _ in cells])
    ax.set_ylabel("ms per step (mean over ranks)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"{report['study']}: where the step time goes"
                 + ("" if variant == "default" else f" ({variant})"))
    fig.tight_layout()
    return fig


def breakdown_plot_name(variant):
    return f"breakdown-{slug(variant.replace(',', '_').replace('=', '-'))}.png"




def breakdown_pngs(report, out_dir):
    """{variant: (path of breakdown-<variant>.png, its bytes)} of every variant with a measured
    breakdown."""
    out = {}
    for v in report["variants"]:
        if any(row["variants"].get(v) and row["variants"][v]["breakdown"] for row in report["rows"]):
            out[v] = (os.path.join(out_dir, breakdown_plot_name(v)), png(breakdown_figure(report, v)))
    return out


def plot(report, path):
    """Write figure(report) as a PNG (atomically). Needs matplotlib (RequestError naming --plot
    when it is missing)."""
    write_bytes(path, png(figure(report)))




def write(study_dir, out_dir=None, want_plot=None, project=None, on_written=None):
    """Poll the study and write scaling.{md,csv,json}, breakdown.csv (and scaling.png, one
    breakdown-<variant>.png per variant with a step breakdown) to `out_dir` (default <study>/report). `want_plot`: True needs matplotlib, None plots when it is installed.
    The files are written as one group (jobs.runs.atomic.write_group): all of them or, on a full
    disk, none, the previous report left whole (StorageError). Returns (report dict, {kind: path});
    the caller prints report["warnings"]. `project(record, report)`: the "Projection" section's data
    (`study report` passes jobs.study.projection.for_report, which sits above this module);
    `on_written(record, report)` once the files are written (`study report`: the history's)."""
    record = StudyRecord.load(study_dir)
    draw = plot_wanted(want_plot)       # refuse before writing anything
    status = poll(record)
    report = build(record, status)
    if project is not None:     # jobs.study.projection.for_report: None without a profile fabric
        report["projection"] = project(record, report)
    out_dir = out_dir or os.path.join(record.study_dir, "report")
    make_out_dir(out_dir)
    paths = {"markdown": os.path.join(out_dir, "scaling.md"), "csv": os.path.join(out_dir, "scaling.csv"),
             "json": os.path.join(out_dir, "scaling.json"), "breakdown csv": os.path.join(out_dir, "breakdown.csv")}
    files = {paths["markdown"]: markdown(report), paths["csv"]: csv_text(report),
             paths["breakdown csv"]: breakdown_csv_text(report),
             paths["json"]: json.dumps(report, indent=2) + "\n"}
    if draw:
        paths["plot"] = os.path.join(out_dir, "scaling.png")
        files[paths["plot"]] = png(figure(report))
        for v, (path, data) in breakdown_pngs(report, out_dir).items():
            paths[f"breakdown plot {v}"] = path
            files[path] = data
    write_group(files)      # all or nothing: never a new table beside an old plot
    if on_written is not None:      # jobs.study.history.on_report: the runs dir's history, above this module
        on_written(record, report)
    return report, paths
