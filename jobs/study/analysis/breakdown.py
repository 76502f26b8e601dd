"""Where a study's step time goes, as the report shows it: the section of the markdown table,
breakdown.csv and one stacked-bar figure per variant, from each cell's step breakdown
(jobs.study.measures.read_breakdown)."""

import csv
import io
import os

from jobs.planning.request import slug

from ..measures import BREAKDOWN_PHASES, EXCHANGES, fmt_number
from .plots import load_pyplot, png


def _phase_text(over, phase):
    value = over["phases"].get(phase) if over else None
    if not value or value["ms"] is None:
        return "-"
    return f"{value['ms']:,.2f} ({value['pct']:.1f}%)"


def breakdown_lines(report):
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
