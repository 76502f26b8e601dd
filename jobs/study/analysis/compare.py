"""Comparing studies: is study B slower than study A, point by point, beyond the noise of the repeats?

Points are matched across studies by (GPUs, nodes, variant label). Each study's figures are the
cells of its report (jobs.study.analysis.report.build: the repeats' throughputs, their median, min-max,
n, cv), so a comparison never computes repeat statistics a second way. Every later study is
compared with the FIRST one: the ratio of the medians, and a verdict from a two-sided
Mann-Whitney U test of the repeats' throughputs (scipy.stats.mannwhitneyu; exact p-values when
the pooled repeats have no ties and a side has at most 8 repeats, else the normal approximation)
at alpha 0.05: `faster` or `slower` when p < alpha, else `within noise`. With fewer than
MIN_REPEATS repeats on a side there is no test (`ratio only`). The smallest p the exact test can
give for n vs m repeats is computed (3 vs 3: 0.10), and a pair that can never reach alpha says so.
scipy is needed (the `compare` extra); matplotlib only for the plot, as in the report.
"""

import csv
import functools
import io
import json
import os
import time

from jobs.errors import RequestError
from jobs.runs.atomic import write_group

from ..measures import fmt_number
from ..running.record import StudyRecord, find_study, poll
from .plots import gpu_axes, load_pyplot, make_out_dir, plot_wanted, png, write_png
from .report import build

COMPARE_VERSION = 1
ALPHA = 0.05
MIN_REPEATS = 3
# scipy's own rule for its "auto" method: exact up to this many repeats on a side, without ties
EXACT_MAX = 8
REFERENCE = "reference"
FASTER, SLOWER, NOISE, RATIO_ONLY = "faster", "slower", "within noise", "ratio only"
# spec keys whose difference is the study's shape, not what a point measures
SHAPE_KEYS = ("name", "description", "gpus", "points", "variants", "repeats", "time", "version")


def _stats():
    try:
        from scipy import stats
    except ImportError:
        raise RequestError("compare: scipy is not installed; pip install 'recsys-submit[compare]'") from None
    return stats


@functools.lru_cache(maxsize=None)
def smallest_p(n, m):
    """The smallest two-sided p the exact test can give for n vs m repeats: that of two samples
    that do not overlap at all (3 vs 3: 2 / C(6, 3) = 0.10)."""
    return float(_stats().mannwhitneyu(list(range(n)), list(range(n, n + m)), alternative="two-sided",
                                       method="exact").pvalue)


def repeats_for_a_verdict(alpha=ALPHA):
    """The fewest repeats of each study with which the exact test can reach `alpha`."""
    k = MIN_REPEATS
    while smallest_p(k, k) >= alpha:
        k += 1
    return k


def judge(reference, other, alpha=ALPHA):
    """(verdict, p, method, note) of `other`'s throughputs vs `reference`'s (lists of floats)."""
    n, m = len(reference), len(other)
    if n < MIN_REPEATS or m < MIN_REPEATS:
        return RATIO_ONLY, None, None, (f"{n} vs {m} repeats: fewer than {MIN_REPEATS} on a side, no test "
                                        f"(ratio only); run {repeats_for_a_verdict(alpha)} or more repeats of "
                                        "each study for a verdict")
    ties = len(set(reference) | set(other)) < n + m
    method = "exact" if not ties and min(n, m) <= EXACT_MAX else "asymptotic"
    result = _stats().mannwhitneyu(other, reference, alternative="two-sided", method=method)
    p = float(result.pvalue)
    note = None
    floor = smallest_p(n, m)
    if floor >= alpha:
        note = (f"{n} vs {m} repeats: the smallest p the test can give is {floor:#.2g} (alpha {alpha:g}), so it "
                f"can never say faster or slower; run {repeats_for_a_verdict(alpha)} or more repeats of each "
                "study for a verdict")
    if p >= alpha:
        return NOISE, p, method, note
    # U of `other` above n*m/2: its repeats tend to be the larger (faster) ones
    return (FASTER if result.statistic > n * m / 2 else SLOWER), p, method, note


def _cell_state(cell):
    if cell["throughput"] is not None:
        return "done"
    return "failed" if cell["failed"] else "pending"


def _cells(report):
    """{(gpus, nodes, variant): (row, cell)} of a report, in the report's order."""
    out = {}
    for row in report["rows"]:
        for variant in report["variants"]:
            if variant in row["variants"]:
                out[(row["gpus"], row["nodes"], variant)] = (row, row["variants"][variant])
    return out


def _point_text(key, gpn=None):
    gpus, nodes, variant = key
    gpn = gpn or gpus // max(nodes, 1)
    text = f"{gpus} GPU{'' if gpus == 1 else 's'} ({nodes} x {gpn})"
    return text if variant == "default" else f"{text} {variant}"


def _labels(records):
    """Study names, made unique when a study is given twice (`A`, `A (2)`)."""
    out, seen = [], {}
    for record in records:
        seen[record.name] = seen.get(record.name, 0) + 1
        out.append(record.name if seen[record.name] == 1 else f"{record.name} ({seen[record.name]})")
    return out


def find(studies, runs_dir=None, history=None):
    """The study dirs of `studies`: each a directory or a name under the runs dir, else (with
    `history(name, runs_dir)`: jobs.study.analysis.history.find, which sits above this module) a name from
    the runs dir's history: the newest study of that name, wherever it lies, or one line when its
    directory is gone."""
    from jobs.runs.rundir import default_runs_dir

    runs_dir = runs_dir or default_runs_dir()
    out = []
    for study in studies:
        try:
            out.append(find_study(study, runs_dir))
        except RequestError:
            found = history(study, runs_dir) if history is not None else None
            if found is None:
                raise
            out.append(found)
    return out


def load(study_dirs):
    """The StudyRecords of `study_dirs`, refused (RequestError, one line) unless there are at least
    two and they share model and scaling mode."""
    if len(study_dirs) < 2:
        raise RequestError("compare: give at least two studies (the first is the reference)")
    records = [StudyRecord.load(d) for d in study_dirs]
    first = records[0]
    for record in records[1:]:
        for key in ("model", "scaling"):
            if record.spec.get(key) != first.spec.get(key):
                raise RequestError(f"compare: {record.name} is a {record.spec.get(key)} study and {first.name} "
                                   f"a {first.spec.get(key)} one ({key} differs): only studies of one model "
                                   "and scaling mode compare")
    return records


def _differences(first, record, first_report, report):
    """What a study changed against the first: spec keys a point measures, profile, provenance."""
    out = []
    keys = [k for k in list(first.spec) + [k for k in record.spec if k not in first.spec] if k not in SHAPE_KEYS]
    for key in keys:
        if first.spec.get(key) != record.spec.get(key):
            out.append({"key": key, "reference": first.spec.get(key), "value": record.spec.get(key)})
    if first.profile != record.profile:
        out.append({"key": "profile", "reference": first.profile, "value": record.profile})
    ref_prov, prov = first_report["provenance"] or {}, report["provenance"] or {}
    for key in [k for k in ref_prov if k != "profile"] + [k for k in prov if k not in ref_prov]:
        if key in ref_prov and key in prov and ref_prov[key] != prov[key]:
            out.append({"key": f"provenance {key}", "reference": ref_prov[key], "value": prov[key]})
    return out


def compare(records, reports, fail_if_slower=None, alpha=ALPHA):
    """The comparison as plain data (compare.json): every study, every matched point with each
    study's figures, ratio, p and verdict vs the first study, the points without a partner, the
    notes, and the gate's result when `fail_if_slower` (percent) is given."""
    labels = _labels(records)
    cells = [_cells(report) for report in reports]
    keys = list(cells[0])
    for other in cells[1:]:
        keys += [k for k in other if k not in keys]
    points, unmatched, notes, slower = [], [], [], []
    for key in keys:
        present = [i for i, c in enumerate(cells) if key in c]
        if 0 not in present or len(present) < 2:
            continue
        ref_row, ref = cells[0][key]
        entry = {"gpus": key[0], "nodes": key[1], "gpus_per_node": ref_row["gpus_per_node"], "variant": key[2],
                 "studies": []}
        for i in present:
            row, cell = cells[i][key]
            state = _cell_state(cell)
            item = {"study": labels[i], "state": state, "global_batch": row["global_batch"],
                    "batch_per_gpu": row["batch_per_gpu"], "throughput": cell["throughput"],
                    "throughput_min": cell["throughput_min"], "throughput_max": cell["throughput_max"],
                    "cv": cell["cv"], "n": cell["n"], "throughputs": list(cell["throughputs"]),
                    "failed": len(cell["failed"]), "pending": len(cell["pending"]), "ratio": None,
                    "p_value": None, "method": None, "verdict": None, "note": None}
            if i == 0:
                item.update(ratio=1.0 if state == "done" else None, verdict=REFERENCE)
            elif state == "done" and _cell_state(ref) == "done":
                verdict, p, method, note = judge(ref["throughputs"], cell["throughputs"], alpha)
                item.update(ratio=cell["throughput"] / ref["throughput"], p_value=p, method=method,
                            verdict=verdict, note=note)
                if note and note not in notes:
                    notes.append(note)
                if (fail_if_slower is not None and verdict == SLOWER
                        and (1.0 - item["ratio"]) * 100.0 > fail_if_slower):
                    slower.append(f"{_point_text(key, entry['gpus_per_node'])}: {labels[i]} "
                                  f"{fmt_number(cell['throughput'])} vs {labels[0]} {fmt_number(ref['throughput'])} samples/s "
                                  f"({(1.0 - item['ratio']) * 100.0:.1f}% slower, p {p:.3g})")
            entry["studies"].append(item)
        if len({s["global_batch"] for s in entry["studies"]}) > 1:
            note = (f"{_point_text(key)}: the global batch differs between the studies "
                    f"({', '.join(str(s['global_batch']) for s in entry['studies'])})")
            notes.append(note)
        points.append(entry)
    for i in range(1, len(cells)):
        for key in cells[0]:
            if key not in cells[i]:
                unmatched.append({"gpus": key[0], "nodes": key[1], "variant": key[2], "study": labels[0],
                                  "missing_from": labels[i]})
        for key in cells[i]:
            if key not in cells[0]:
                unmatched.append({"gpus": key[0], "nodes": key[1], "variant": key[2], "study": labels[i],
                                  "missing_from": labels[0]})
    warnings = []
    for label, report in zip(labels, reports):
        warnings += [f"{label}: point {f['point']} failed: {f['reason']}" for f in report["failures"]]
        warnings += [f"{label}: point {p['point']} " + ("was never submitted" if p["state"] == "missing" else
                                                         f"is {p['state']} (not finished yet)")
                     for p in report["pending"]]
    return {
        "version": COMPARE_VERSION,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "model": records[0].spec.get("model"),
        "scaling": records[0].spec.get("scaling"),
        "reference": labels[0],
        "test": "Mann-Whitney U, two-sided, of the repeats' throughputs vs the reference's",
        "alpha": alpha,
        "min_repeats": MIN_REPEATS,
        "studies": [{"name": labels[i], "study_dir": r.study_dir, "profile": r.profile,
                     "repeats": r.spec.get("repeats"), "engine_args": r.spec.get("engine_args"),
                     "differences": [] if i == 0 else _differences(records[0], r, reports[0], reports[i])}
                    for i, r in enumerate(records)],
        "points": points,
        "unmatched": unmatched,
        "notes": notes,
        "fail_if_slower": fail_if_slower,
        "slower": slower,
        "failures": sum(len(report["failures"]) for report in reports),
        "warnings": warnings,
    }


def _spread_text(item):
    if item["throughput"] is None:
        return "-"
    text = f"{fmt_number(item['throughput_min'])}-{fmt_number(item['throughput_max'])}, n={item['n']}"
    if item["cv"] is not None:
        text += f", cv {item['cv']:.2f}"
    if item["failed"]:
        text += f", {item['failed']} failed"
    return text


def _verdict_text(item, reference_state):
    if item["verdict"] == REFERENCE:
        return REFERENCE if item["state"] == "done" else f"reference {item['state']}: no verdicts"
    if item["verdict"] is None:
        if item["state"] != "done":
            return f"- ({item['state']})"
        return f"- (reference {reference_state})"
    return item["verdict"] + (" \u2020" if item["note"] and item["verdict"] != RATIO_ONLY else "")


def _show(value):
    if isinstance(value, list):
        return " ".join(str(v) for v in value) or "(none)"
    return "-" if value is None else str(value)


def markdown(comparison):
    c = comparison
    ref = c["reference"]
    others = [s["name"] for s in c["studies"][1:]]
    lines = [f"# Comparing studies: `{ref}` (reference) vs {', '.join(f'`{o}`' for o in others)}", "",
             f"- model: {c['model']}, {c['scaling']} scaling; date: {c['date']}",
             "- studies: " + "; ".join(f"`{s['name']}` ({s['study_dir']}, profile {s['profile']}, "
                                       f"{s['repeats']} repeat(s))" for s in c["studies"])]
    for study in c["studies"][1:]:
        if study["differences"]:
            lines.append(f"- `{study['name']}` differs from `{ref}` in: " + "; ".join(
                f"{d['key']} {_show(d['value'])} (vs {_show(d['reference'])})" for d in study["differences"]))
        else:
            lines.append(f"- `{study['name']}` differs from `{ref}` in nothing a point measures")
    lines += ["- points matched by (GPUs, nodes, variant); throughput = median of the repeats (min-max, n, cv "
              f"= sample stdev / mean); ratio = median / `{ref}`'s median",
              f"- verdict vs `{ref}`: {c['test']} (exact p without ties), alpha {c['alpha']:g}: faster or "
              f"slower when p < {c['alpha']:g}, else within noise; fewer than {c['min_repeats']} repeats on a "
              "side: ratio only", ""]
    head = ["GPUs", "nodes", "variant", "study", "throughput (samples/s)", "spread (min-max, n, cv)",
            f"ratio vs {ref}", "p", "verdict"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|---:|---:|---|---|---:|---|---:|---:|---|")
    for point in c["points"]:
        ref_state = point["studies"][0]["state"]
        for item in point["studies"]:
            tp = fmt_number(item["throughput"]) if item["state"] == "done" else item["state"]
            lines.append("| " + " | ".join([
                str(point["gpus"]), f"{point['nodes']} x {point['gpus_per_node']}", point["variant"], item["study"],
                tp, _spread_text(item), fmt_number(item["ratio"], 2), "-" if item["p_value"] is None else
                f"{item['p_value']:.3g}", _verdict_text(item, ref_state)]) + " |")
    if c["notes"]:
        lines += [""] + [f"\u2020 {note}" if "smallest p" in note else f"Note: {note}" for note in c["notes"]]
    if c["unmatched"]:
        lines += ["", "Points without a partner (not compared):", ""]
        lines += [f"- {_point_text((u['gpus'], u['nodes'], u['variant']))} of `{u['study']}`: not in "
                  f"`{u['missing_from']}`" for u in c["unmatched"]]
    if c["fail_if_slower"] is not None:
        if c["slower"]:
            lines += ["", f"Slower than `{ref}` by more than {c['fail_if_slower']:g}% (verdict slower):", ""]
            lines += [f"- {text}" for text in c["slower"]]
        else:
            lines += ["", f"No point is slower than `{ref}` by more than {c['fail_if_slower']:g}% with verdict "
                          "slower."]
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("gpus", "nodes", "gpus_per_node", "variant", "study", "state", "global_batch", "throughput",
              "throughput_min", "throughput_max", "n", "cv", "failed", "ratio", "p_value", "method", "verdict",
              "note")


def csv_text(comparison):
    """One line per (matched point, study)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_FIELDS)
    for point in comparison["points"]:
        for item in point["studies"]:
            merged = dict(point, **item)
            writer.writerow(["" if merged.get(f) is None else merged[f] for f in CSV_FIELDS])
    return out.getvalue()


def figure(comparison):
    """Throughput (median, min-max error bars) vs GPUs, one line per study, log-log axes, one
    panel per variant."""
    plt = load_pyplot()
    variants = []
    for point in comparison["points"]:
        if point["variant"] not in variants:
            variants.append(point["variant"])
    variants = variants or ["default"]
    fig, axes = plt.subplots(1, len(variants), figsize=(5.5 * len(variants), 4.2), squeeze=False)
    names = [s["name"] for s in comparison["studies"]]
    for ax, variant in zip(axes[0], variants):
        for name in names:
            pts = sorted((p["gpus"], p["nodes"], s) for p in comparison["points"] if p["variant"] == variant
                         for s in p["studies"] if s["study"] == name and s["state"] == "done")
            if not pts:
                continue
            gpus = [g for g, _, _ in pts]
            med = [s["throughput"] for _, _, s in pts]
            ax.errorbar(gpus, med, yerr=[[m - s["throughput_min"] for m, (_, _, s) in zip(med, pts)],
                                         [s["throughput_max"] - m for m, (_, _, s) in zip(med, pts)]],
                        marker="o", capsize=4, label=name)
        gpu_axes(ax, {p["gpus"] for p in comparison["points"] if p["variant"] == variant})
        ax.set_ylabel("throughput (samples/s, higher is better)")
        ax.set_title(variant if variant != "default" else comparison["model"])
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(f"{comparison['model']} {comparison['scaling']} scaling: {', '.join(names)} "
                 f"(median, min-max of the repeats)")
    fig.tight_layout()
    return fig


def plot(comparison, path):
    """Write figure(comparison) as a PNG (atomically)."""
    write_png(path, figure(comparison))


def default_out_dir(records):
    """<first study>/compare/vs-<other>[-<other>...]: comparing the same reference with
    different studies never overwrites an earlier comparison."""
    return os.path.join(records[0].study_dir, "compare", "vs-" + "-".join(r.name for r in records[1:]))


def write(study_dirs, out_dir=None, want_plot=None, fail_if_slower=None):
    """Poll every study, compare them with the first and write compare.{md,csv,json} (and
    compare.png) to `out_dir` (default: default_out_dir). `want_plot`: True needs matplotlib, None
    plots when it is installed. Returns (comparison dict, {kind: path})."""
    records = load(study_dirs)
    _stats()                # refuse before polling or writing anything
    draw = plot_wanted(want_plot)
    reports = [build(record, poll(record)) for record in records]
    comparison = compare(records, reports, fail_if_slower=fail_if_slower)
    out_dir = out_dir or default_out_dir(records)
    make_out_dir(out_dir)
    paths = {"markdown": os.path.join(out_dir, "compare.md"), "csv": os.path.join(out_dir, "compare.csv"),
             "json": os.path.join(out_dir, "compare.json")}
    files = {paths["markdown"]: markdown(comparison), paths["csv"]: csv_text(comparison),
             paths["json"]: json.dumps(comparison, indent=2) + "\n"}
    if draw:
        paths["plot"] = os.path.join(out_dir, "compare.png")
        files[paths["plot"]] = png(figure(comparison))
    write_group(files)      # all or nothing: never a new table beside an old plot
    return comparison, paths
