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
published (jobs.study.analysis.published: model, the platform of the study's profile, GPUs, batch
per GPU, precision, XLA) carries the published throughput and measured / published; an AMP cell
whose study also ran the same size at full precision carries the speedup to mixed precision
(NVIDIA's "throughput speedup (full precision to mixed precision)"); and a point whose engine
summary has a `step_breakdown` gets the table of where its step time goes (ms and % per phase,
over the mean of the ranks and the slowest rank, and each exchange's achieved bandwidth), from
its median repeat, with a stacked-bar plot per variant (jobs.study.analysis.breakdown).

This module builds the report's data and writes its files; the text is report_table's, the
figures report_figure's and breakdown's, the facts beside the throughputs report_facts'.
"""

import json
import os
import statistics
import time

from jobs.runs.atomic import write_group
from jobs.runs.enginelog import THROUGHPUT, WORLD_SIZE, job_logs, number, startup
from slurm.common.hostlist import natural_key

from ..measures import BREAKDOWN, fmt_number, read_breakdown
from ..running.record import DONE, FAILED, MISSING, UNKNOWN, StudyRecord, poll
from . import published
from .breakdown import breakdown_csv_text, breakdown_pngs
from .plots import make_out_dir, plot_wanted, png
from .report_facts import (SPREAD_CV, SPREAD_RATIO, code_labels, code_used, engine_version, hardware_medians, hosts,
                           json_key, node_sets, nodes_of_run, provenance_of, size_text, spread_of, study_platform,
                           tensorboard_files)
from .report_figure import figure
from .report_table import csv_text, markdown, show_value


REPORT_VERSION = 3


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


def _median_repeat(entries):
    """The entry [(throughput, point id, summary)] whose throughput is the median (the lower of
    the two middle ones for an even count)."""
    ranked = sorted(entries, key=lambda e: e[0])
    return ranked[(len(ranked) - 1) // 2]


def build(record, status):
    """The report as plain data: header facts, one row per size, and the warnings to print."""
    spec = record.spec
    by_id = {p.id: p for p in status.points}
    label, code_warning = code_labels(record, status)
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
                    nodes_used |= hosts(nodes_of_run(st.run_dir))
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
    platform, node = study_platform(record)
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
                out["breakdown"] = read_breakdown(point_id, summary[BREAKDOWN])
                if out["breakdown"] is None:
                    breakdown_problems.append(f"{point_id}: its {BREAKDOWN} is malformed (no mean step_ms); "
                                              "left out of the breakdown")
            if tps:
                median = statistics.median(tps)
                cv, ratio, noisy = spread_of(tps)
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
                        f"{size_text(gpus, nodes, gpn)} {variant}: repeats {', '.join(cell['measured'])} gave "
                        f"{', '.join(fmt_number(t) for t in tps)} samples/s (max/min {ratio:.2f}, cv "
                        f"{'-' if cv is None else f'{cv:.2f}'}; flagged above cv {SPREAD_CV:.2f} or max/min "
                        f"{SPREAD_RATIO:.2f}): the median {fmt_number(median)} hides a noisy measurement")
                    spread_warnings.append(out["spread_warning"])
            row["variants"][variant] = out
        rows.append(row)
    _amp_speedups(rows, variants, variant_of, settings, published.load().full_precision(platform))
    provenance, differences, no_provenance = provenance_of(measured)
    hardware, hardware_warnings = hardware_medians(record, status)
    warnings = [code_warning] * bool(code_warning) + list(baseline_problems) + spread_warnings + breakdown_problems + hardware_warnings + [
        f"provenance: point {d['point']} has {d['key']}={show_value(d['value'])}, the other points "
        f"{show_value(d['common'])}" for d in differences]
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
        "engine_version": engine_version(),
        "warmup_steps": spec.get("warmup_steps"),
        "steps": spec.get("steps"),
        "variants": variants,
        "platform": platform,
        "node_type": node,
        "published_matches": sum(1 for r in rows for c in r["variants"].values() if c["published"]),
        "breakdown_measured": any(c["breakdown"] for r in rows for c in r["variants"].values()),
        "hardware": hardware,
        "hardware_warnings": hardware_warnings,
        "tensorboard": tensorboard_files(status),
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
        return json_key({k: x for k, x in variant_of[v].items() if k not in ("amp", "precision")}), settings[v][1]

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


def write(study_dir, out_dir=None, want_plot=None, project=None, on_written=None):
    """Poll the study and write scaling.{md,csv,json}, breakdown.csv (and scaling.png, one
    breakdown-<variant>.png per variant with a step breakdown) to `out_dir` (default <study>/report). `want_plot`: True needs matplotlib, None plots when it is installed.
    The files are written as one group (jobs.runs.atomic.write_group): all of them or, on a full
    disk, none, the previous report left whole (StorageError). Returns (report dict, {kind: path});
    the caller prints report["warnings"]. `project(record, report)`: the "Projection" section's data
    (`study report` passes jobs.study.analysis.projection.for_report, which sits above this module);
    `on_written(record, report)` once the files are written (`study report`: the history's)."""
    record = StudyRecord.load(study_dir)
    draw = plot_wanted(want_plot)       # refuse before writing anything
    status = poll(record)
    report = build(record, status)
    if project is not None:     # jobs.study.analysis.projection.for_report: None without a profile fabric
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
    if on_written is not None:      # jobs.study.analysis.history.on_report: the runs dir's history, above this module
        on_written(record, report)
    return report, paths
