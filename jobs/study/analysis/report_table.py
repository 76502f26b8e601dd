"""A study report as text: the scaling table in NVIDIA's layout (markdown) with its sections
(measured vs published, where the step time goes, the projection, the hardware, TensorBoard), and
the same rows as CSV."""

import csv
import io
import os

from jobs.runs.enginelog import with_state

from ..measures import fmt_number
from . import published
from .breakdown import breakdown_lines
from .report_facts import SPREAD_CV, SPREAD_RATIO, json_key, size_text


WARN = "\u26a0"


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


def show_value(value):
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return json_key(value)
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
        text = size_text(base["gpus"], base["nodes"], base["gpus_per_node"])
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
        lines.append("- provenance: " + ", ".join(f"{k} {show_value(v)}" for k, v in report["provenance"].items()) +
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
    lines += breakdown_lines(report)
    lines += _projection_lines(report)       # with a fabric: the bands of the next sizes up
    lines += _hardware_lines(report)
    lines += _tensorboard_lines(report)
    if report["baseline_problems"]:
        lines += ["", "Baseline problems:", ""] + [f"- {text}" for text in report["baseline_problems"]]
    if report["provenance_differences"]:
        lines += ["", "Provenance differences (value of the point vs the other points):", ""]
        lines += [f"- `{d['point']}` {d['key']}: {show_value(d['value'])} vs {show_value(d['common'])}"
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
    """The "Projection" section (jobs.study.analysis.projection.for_report's data; nothing without it): the
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
