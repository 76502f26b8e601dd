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
"""

import csv
import glob
import io
import json
import os
import statistics
import time

from jobs.errors import RequestError
from jobs.runs.atomic import write_json, write_text
from jobs.runs.enginelog import THROUGHPUT, WORLD_SIZE, job_logs, number, startup

from .run import DONE, FAILED, MISSING, UNKNOWN, StudyRecord, poll

REPORT_VERSION = 2
# a cell whose repeats spread more than this is flagged: its median hides a noisy measurement
SPREAD_CV, SPREAD_RATIO = 0.10, 1.25
# provenance keys that differ between points by nature (the nodes are shown as "ran on")
PER_POINT_PROVENANCE = ("nodes", "slurm_job_id")
# header order of the provenance keys the engine writes; others follow, sorted
PROVENANCE_ORDER = ("python", "tensorflow", "keras", "horovod", "horovod_build", "mpi", "numpy", "cuda", "cudnn",
                    "nccl", "gpu_model", "cpu_model", "slurm_version", "git_commit", "git_dirty", "profile",
                    "profile_sha256")
WARN = "\u26a0"


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
    if st.state == MISSING:
        return f"{point_id} was never submitted"
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


def build(record, status):
    """The report as plain data: header facts, one row per size, and the warnings to print."""
    spec = record.spec
    by_id = {p.id: p for p in status.points}
    variants = []
    for point in record.points:
        if point.variant_label not in variants:
            variants.append(point.variant_label)
    size_of = {p.id: (p.gpus, p.nodes, p.gpus_per_node, p.batch_per_gpu, p.global_batch) for p in record.points}
    sizes = sorted(set(size_of.values()))
    grouped = {}
    for point in record.points:
        grouped.setdefault((size_of[point.id], point.variant_label), []).append(point)
    failures, pending, nodes_used, measured = [], [], set(), []
    cells = {}
    for key, points in grouped.items():
        cell = {"points": [], "measured": [], "throughputs": [], "world_sizes": [], "failed": [], "pending": [],
                "startups": [], "missing": []}
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
                cell["world_sizes"].append(st.summary.get(WORLD_SIZE))
                measured.append((point.id, st.summary))
                if st.run_dir:
                    first = [number(r, "since_start_s") for r in startup(job_logs(st.run_dir, "main"))
                             if r.get("phase") == "first_step"]
                    if first and first[-1] is not None:
                        cell["startups"].append(first[-1])
                    nodes_used |= _nodelist(st.run_dir)
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
    rows, spread_warnings = [], []
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
                   "startup_s": None, "speedup": None, "efficiency": None, "spread_warning": None}
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
                if noisy:
                    out["spread_warning"] = (
                        f"{_size_text(gpus, nodes, gpn)} {variant}: repeats {', '.join(cell['measured'])} gave "
                        f"{', '.join(_fmt(t) for t in tps)} samples/s (max/min {ratio:.2f}, cv "
                        f"{'-' if cv is None else f'{cv:.2f}'}; flagged above cv {SPREAD_CV:.2f} or max/min "
                        f"{SPREAD_RATIO:.2f}): the median {_fmt(median)} hides a noisy measurement")
                    spread_warnings.append(out["spread_warning"])
            row["variants"][variant] = out
        rows.append(row)
    provenance, differences, no_provenance = _provenance(measured)
    warnings = list(baseline_problems) + spread_warnings + [
        f"provenance: point {d['point']} has {d['key']}={_show(d['value'])}, the other points "
        f"{_show(d['common'])}" for d in differences]
    return {
        "version": REPORT_VERSION,
        "study": record.name,
        "model": spec.get("model"),
        "scaling": spec.get("scaling"),
        "profile": record.profile,
        "nodes_used": sorted(nodes_used),
        "max_nodes": max((p.nodes for p in record.points), default=0),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "engine_version": _engine_version(),
        "warmup_steps": spec.get("warmup_steps"),
        "steps": spec.get("steps"),
        "variants": variants,
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


def _fmt(value, digits=0):
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
    text = _fmt(cell["throughput"])
    if cell["n"] > 1:
        text += (f" ({_fmt(cell['throughput_min'])}-{_fmt(cell['throughput_max'])}, n={cell['n']}, "
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
    if report["provenance"] is not None:
        lines.append("- provenance: " + ", ".join(f"{k} {_show(v)}" for k, v in report["provenance"].items()) +
                     ("" if not report["provenance_differences"] else " (points that differ: below)"))
    else:
        lines.append("- provenance: none recorded (summaries of an older engine)")
    lines.append("")
    head = ["GPUs", "nodes", "batch size / GPU", "global batch"]
    for v in report["variants"]:
        tag = "" if v == "default" else f" {v}"
        head += [f"throughput{tag} (samples/s)", f"step time{tag} (ms)", f"start-up{tag} (s)",
                 f"{'strong' if strong else 'weak'} scaling speedup{tag}", f"efficiency{tag}"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---:" for _ in head) + "|")
    spread = []
    for row in report["rows"]:
        cells = [str(row["gpus"]), f"{row['nodes']} x {row['gpus_per_node']}", str(row["batch_per_gpu"]),
                 str(row["global_batch"])]
        for v in report["variants"]:
            cell = row["variants"].get(v)
            cells += [_cell_text(cell), _fmt(cell and cell["step_time_ms"], 1), _fmt(cell and cell["startup_s"], 1),
                      _fmt(cell and cell["speedup"], 2), _fmt(cell and cell["efficiency"], 2)]
            if cell and cell["spread_warning"]:
                spread.append(cell["spread_warning"])
        lines.append("| " + " | ".join(cells) + " |")
    if spread:
        lines += [""] + [f"{WARN} {text}" for text in spread]
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
        lines += [f"- `{f['point']}` {f['state'] or ''}: {f['reason']} ({f['run_dir']})" for f in report["failures"]]
    if report["pending"]:
        lines += ["", f"Not finished yet: {', '.join(p['point'] + ' (' + p['state'] + ')' for p in report['pending'])}"]
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("throughput", "throughput_min", "throughput_max", "n", "cv", "step_time_ms", "startup_s", "speedup",
              "efficiency", "failed", "spread_warning")


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
                values.append("" if value is None else value)
        writer.writerow(values)
    return out.getvalue()


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RequestError("--plot: matplotlib is not installed; pip install 'recsys-submit[plot]' "
                           "(or pass --no-plot)") from None
    return plt


def figure(report):
    """The plot's figure: throughput vs GPUs (median with min-max error bars, the ideal line from
    the baseline when there is one) and efficiency vs GPUs, one colour per variant, log2 x axis."""
    plt = _pyplot()
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
    ticks = sorted({row["gpus"] for row in report["rows"]})
    for ax in (ax_tp, ax_eff):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("GPUs")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    ax_tp.set_ylabel("throughput (samples/s, higher is better)")
    ax_eff.set_ylabel("parallel efficiency (1 = ideal)")
    ax_eff.axhline(1.0, linestyle="--", color="grey", alpha=0.6)
    fig.suptitle(f"{report['study']}: {report['model']} {report['scaling']} scaling on {report['profile']}")
    fig.tight_layout()
    return fig


def plot(report, path):
    """Write figure(report) as a PNG (atomically). Needs matplotlib (RequestError naming --plot
    when it is missing)."""
    plt = _pyplot()
    fig = figure(report)
    tmp = f"{path}.tmp.{os.getpid()}.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def write(study_dir, out_dir=None, want_plot=None):
    """Poll the study and write scaling.{md,csv,json} (and scaling.png) to `out_dir` (default
    <study>/report). `want_plot`: True needs matplotlib, None plots when it is installed.
    Returns (report dict, {kind: path}); the caller prints report["warnings"]."""
    record = StudyRecord.load(study_dir)
    if want_plot:
        _pyplot()       # refuse before writing anything
    status = poll(record)
    report = build(record, status)
    out_dir = out_dir or os.path.join(record.study_dir, "report")
    os.makedirs(out_dir, exist_ok=True)
    paths = {"markdown": os.path.join(out_dir, "scaling.md"), "csv": os.path.join(out_dir, "scaling.csv"),
             "json": os.path.join(out_dir, "scaling.json")}
    write_text(paths["markdown"], markdown(report))
    write_text(paths["csv"], csv_text(report))
    write_json(paths["json"], report)
    if want_plot is not False:
        try:
            plot(report, os.path.join(out_dir, "scaling.png"))
            paths["plot"] = os.path.join(out_dir, "scaling.png")
        except RequestError:
            if want_plot:
                raise
    return report, paths
