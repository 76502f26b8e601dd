"""The report of a study: the scaling table (markdown, CSV, JSON) and the plot (PNG).

Rows follow NVIDIA's published scaling tables: one row per size (GPUs, nodes, batch per GPU,
global batch) and, per variant, the throughput (median of the repeats, with min-max), step
time, speedup over the smallest size of that variant and parallel efficiency = speedup /
(GPUs / smallest GPUs). Numbers come only from the points' engine `summary` records
(jobs.runs.enginelog); a failed point shows as failed with its reason, never as a missing row.
matplotlib is imported only for the plot (an optional extra: `recsys-submit[plot]`).
"""

import csv
import glob
import io
import os
import statistics
import time

from jobs.errors import RequestError
from jobs.runs.atomic import write_json, write_text
from jobs.runs.enginelog import STEP_TIME, THROUGHPUT, WORLD_SIZE, job_logs, number, startup

from .run import DONE, FAILED, StudyRecord, poll

REPORT_VERSION = 1


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


def build(record, status):
    """The report as plain data: header facts and one row per size."""
    spec = record.spec
    by_id = {p.id: p for p in status.points}
    variants = []
    for point in record.points:
        if point.variant_label not in variants:
            variants.append(point.variant_label)
    sizes = sorted({(p.gpus, p.nodes, p.gpus_per_node, p.batch_per_gpu, p.global_batch) for p in record.points})
    cells = {}
    failures, pending = [], []
    nodes_used = set()
    for point in record.points:
        st = by_id[point.id]
        key = ((point.gpus, point.nodes, point.gpus_per_node, point.batch_per_gpu, point.global_batch),
               point.variant_label)
        cell = cells.setdefault(key, {"throughputs": [], "step_times": [], "world_sizes": [], "points": [],
                                      "failed": [], "pending": [], "startups": []})
        cell["points"].append(point.id)
        if st.state == DONE:
            value = number(st.summary, THROUGHPUT)
            if value is None:
                cell["failed"].append(f"{point.id}: summary has no {THROUGHPUT}")
                failures.append({"point": point.id, "state": "COMPLETED",
                                 "reason": f"summary has no {THROUGHPUT}", "run_dir": st.run_dir})
                continue
            cell["throughputs"].append(value)
            step = number(st.summary, STEP_TIME)
            if step is not None:
                cell["step_times"].append(step)
            cell["world_sizes"].append(st.summary.get(WORLD_SIZE))
            first = [number(r, "since_start_s") for r in startup(job_logs(st.run_dir, "main"))
                     if r.get("phase") == "first_step"]
            if first and first[-1] is not None:
                cell["startups"].append(first[-1])
            nodes_used |= _nodelist(st.run_dir)
        elif st.state == FAILED:
            cell["failed"].append(f"{point.id}: {st.reason}")
            failures.append({"point": point.id, "state": st.job_state, "reason": st.reason, "run_dir": st.run_dir})
        else:
            cell["pending"].append(point.id)
            pending.append({"point": point.id, "state": st.state})
    base = {}
    for variant in variants:
        for size in sizes:
            cell = cells.get((size, variant))
            if cell and cell["throughputs"]:
                base[variant] = (size[0], statistics.median(cell["throughputs"]))
                break
    rows = []
    for size in sizes:
        gpus, nodes, gpn, per_gpu, global_batch = size
        row = {"gpus": gpus, "nodes": nodes, "gpus_per_node": gpn, "batch_per_gpu": per_gpu,
               "global_batch": global_batch, "variants": {}}
        for variant in variants:
            cell = cells.get((size, variant))
            if cell is None:
                continue
            out = {"points": cell["points"], "repeats": len(cell["throughputs"]),
                   "failed": cell["failed"], "pending": cell["pending"], "world_sizes": cell["world_sizes"]}
            if cell["throughputs"]:
                median = statistics.median(cell["throughputs"])
                out.update(throughput=median, throughput_min=min(cell["throughputs"]),
                           throughput_max=max(cell["throughputs"]),
                           step_time_ms=statistics.median(cell["step_times"]) if cell["step_times"] else None,
                           startup_s=statistics.median(cell["startups"]) if cell["startups"] else None)
                base_gpus, base_tp = base[variant]
                out["speedup"] = median / base_tp
                out["efficiency"] = out["speedup"] / (gpus / base_gpus)
            else:
                out.update(throughput=None, throughput_min=None, throughput_max=None, step_time_ms=None,
                           startup_s=None, speedup=None, efficiency=None)
            row["variants"][variant] = out
        rows.append(row)
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
        "baseline": {v: {"gpus": g, "throughput": t} for v, (g, t) in base.items()},
        "rows": rows,
        "failures": failures,
        "pending": pending,
    }


def _fmt(value, digits=0):
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _cell_text(cell):
    if cell is None:
        return "-"
    if cell["throughput"] is None:
        if cell["failed"]:
            return "FAILED"
        return "pending"
    text = _fmt(cell["throughput"])
    if cell["repeats"] > 1:
        text += f" ({_fmt(cell['throughput_min'])}-{_fmt(cell['throughput_max'])})"
    if cell["failed"]:
        text += f" [{len(cell['failed'])} failed]"
    return text


def markdown(report):
    """The table in NVIDIA's layout, with a header saying what was measured where."""
    strong = report["scaling"] == "strong"
    lines = [f"# Scaling study `{report['study']}`: {report['model']}, {report['scaling']} scaling", "",
             f"- profile: {report['profile']}; up to {report['max_nodes']} node(s) per point; ran on: "
             f"{', '.join(report['nodes_used']) or '-'}",
             f"- date: {report['date']}; engine: recsys-submit {report['engine_version']}",
             f"- benchmark mode: {report['warmup_steps']} warm-up + {report['steps']} timed steps per point; "
             "throughput = median of the repeats (min-max)",
             "- start-up = seconds from process start to the end of the first step (Horovod init, "
             "data, model build, first step), kept out of the throughput",
             "- speedup = throughput / throughput at the smallest GPU count of the variant; "
             "efficiency = speedup / (GPUs / smallest GPUs)" +
             ("" if strong else " (weak scaling: the batch per GPU is fixed, so efficiency is the "
                                "weak-scaling efficiency)"),
             ""]
    head = ["GPUs", "nodes", "batch size / GPU", "global batch"]
    for v in report["variants"]:
        tag = "" if v == "default" else f" {v}"
        head += [f"throughput{tag} (samples/s)", f"step time{tag} (ms)", f"start-up{tag} (s)",
                 f"{'strong' if strong else 'weak'} scaling speedup{tag}", f"efficiency{tag}"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "|".join("---:" for _ in head) + "|")
    for row in report["rows"]:
        cells = [str(row["gpus"]), f"{row['nodes']} x {row['gpus_per_node']}", str(row["batch_per_gpu"]),
                 str(row["global_batch"])]
        for v in report["variants"]:
            cell = row["variants"].get(v)
            cells += [_cell_text(cell), _fmt(cell and cell["step_time_ms"], 1), _fmt(cell and cell["startup_s"], 1),
                      _fmt(cell and cell["speedup"], 2), _fmt(cell and cell["efficiency"], 2)]
        lines.append("| " + " | ".join(cells) + " |")
    if report["failures"]:
        lines += ["", "Failed points (resubmitted by `recsys-submit study run`):", ""]
        lines += [f"- `{f['point']}` {f['state'] or ''}: {f['reason']} ({f['run_dir']})" for f in report["failures"]]
    if report["pending"]:
        lines += ["", f"Not finished yet: {', '.join(p['point'] + ' (' + p['state'] + ')' for p in report['pending'])}"]
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("throughput", "throughput_min", "throughput_max", "step_time_ms", "startup_s", "speedup", "efficiency",
              "repeats", "failed")


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


def plot(report, path):
    """throughput vs GPUs (ideal line, min-max band) and efficiency vs GPUs, one line per
    variant, log2 x axis. Needs matplotlib (RequestError naming --plot when it is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RequestError("--plot: matplotlib is not installed; pip install 'recsys-submit[plot]' "
                           "(or pass --no-plot)") from None
    fig, (ax_tp, ax_eff) = plt.subplots(1, 2, figsize=(11, 4.2))
    for v in report["variants"]:
        pts = [(row["gpus"], row["variants"][v]) for row in report["rows"]
               if v in row["variants"] and row["variants"][v]["throughput"] is not None]
        if not pts:
            continue
        gpus = [g for g, _ in pts]
        line, = ax_tp.plot(gpus, [c["throughput"] for _, c in pts], marker="o", label=v)
        ax_tp.fill_between(gpus, [c["throughput_min"] for _, c in pts], [c["throughput_max"] for _, c in pts],
                           color=line.get_color(), alpha=0.2)
        base_gpus, base_tp = report["baseline"][v]["gpus"], report["baseline"][v]["throughput"]
        ax_tp.plot(gpus, [base_tp * g / base_gpus for g in gpus], linestyle="--", color=line.get_color(),
                   alpha=0.6, label=f"{v} ideal")
        ax_eff.plot(gpus, [c["efficiency"] for _, c in pts], marker="o", color=line.get_color(), label=v)
    ticks = sorted({row["gpus"] for row in report["rows"]})
    for ax in (ax_tp, ax_eff):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("GPUs")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    ax_tp.set_ylabel("throughput (samples/s, higher is better)")
    ax_eff.set_ylabel("parallel efficiency (1 = ideal)")
    ax_eff.axhline(1.0, linestyle="--", color="grey", alpha=0.6)
    fig.suptitle(f"{report['study']}: {report['model']} {report['scaling']} scaling on {report['profile']}")
    fig.tight_layout()
    tmp = f"{path}.tmp.{os.getpid()}.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def write(study_dir, out_dir=None, want_plot=None):
    """Poll the study and write scaling.{md,csv,json} (and scaling.png) to `out_dir` (default
    <study>/report). `want_plot`: True needs matplotlib, None plots when it is installed.
    Returns (report dict, {kind: path})."""
    record = StudyRecord.load(study_dir)
    if want_plot:
        try:
            import matplotlib  # noqa: F401  (refuse before writing anything)
        except ImportError:
            raise RequestError("--plot: matplotlib is not installed; pip install 'recsys-submit[plot]' "
                               "(or pass --no-plot)") from None
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
