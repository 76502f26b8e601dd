"""The files of a projection (jobs.study.analysis.projection's record): the markdown table, the CSV,
the JSON and the log-log plot, written as one group."""
from __future__ import annotations

import json
import os
from typing import Any, Dict

from .plots import gpu_axes, load_pyplot, make_out_dir, plot_wanted, png


def vs_band_text(where) -> str:
    """A figure's place against its band, for the table: ", inside" or ", -47.6 % vs band"."""
    if not where:
        return ""
    return ", inside the band" if where["inside"] else f", {100 * where['error']:+.1f} % vs band"


def markdown(record: Dict[str, Any]) -> str:
    c = record["calibration"]
    lines = [f"# Projection: {record['model']} on {record['profile']} ({record['scaling']} scaling, "
             f"{'global' if record['scaling'] == 'strong' else 'per-GPU'} batch {record['batch']})", "",
             f"Calibration: {c['source']} ({c['gpus']} GPU(s), batch {c['batch_per_gpu']} per GPU, "
             f"{c['scaled_ms']:.3f} ms scaled + {c['fixed_ms']:.3f} ms fixed).",
             f"Fabric: {record['fabric']['source']}" + (" (measured bus bandwidths)" if record['fabric']['measured']
                                                        else ""), ""]
    if c.get("spread_source"):
        lines[-1:-1] = [f"Calibration repeats: {c['spread_source']}; the band's low edge takes the slowest, "
                        "its high edge the fastest."]
    if c.get("noisy"):
        lines[-1:-1] = [f"WARNING: a noisy calibration, every band below carries it: {c['noisy']}"]
    if record.get("model_size"):
        lines[-1:-1] = [f"Model size: {record['model_size']} (the calibration row's); published rows of other sizes "
                        "are other tables and are not shown."]
    if c.get("split_source"):
        lines[-1:-1] = [f"Compute split (dense with the batch per GPU, embedding with the slowest rank's share of "
                        f"the embedding work): {c['split_source']}."]
    if c.get("curve"):
        lines[-1:-1] = [f"Compute vs batch per GPU: {c['curve_source']}, log-log between the measured batches, "
                        "their affine fit outside."]
    if record.get("shared_host_cores"):
        lines[-1:-1] = [f"Ranks share the host's {record['shared_host_cores']} cores: "
                        + (record["fabric"].get("core_sharing") or "an even share of the cores (not measured)") + "."]
        if record["fabric"].get("exchange_sharing"):
            lines[-1:-1] = ["Exchanges among ranks on those cores: measured at that sharing (the nearest measured "
                            f"rank count at or above): {record['fabric']['exchange_sharing']}."]
    lines += [
             "| GPUs | nodes | batch/GPU | step ms (overlap - serial) | samples/s (low - high) | efficiency | "
             "compute ms | embedding exchange ms | gradient exchange ms | dominant | GB per rank | measured |",
             "|---:|---:|---:|---|---|---|---:|---:|---:|---|---:|---|"]
    for p in record["points"]:
        ph = p["phases_ms"]
        mem = "-" if p["memory_gb_per_rank"] is None else f"{p['memory_gb_per_rank']:.3f}" + \
            ("" if p["fits"] in (None, True) else " DOES NOT FIT")
        meas = "-" if p.get("measured_throughput") is None else \
            f"{p['measured_throughput']:,.0f}" + vs_band_text(p.get("measured_vs_band"))
        for pub in p.get("published", []):
            size = f" {pub['model_size']}" if pub.get("model_size") else ""
            meas += f"; published {pub['throughput']:,.0f} ({pub['table']}{size}{vs_band_text(pub.get('vs_band'))})"
        lines.append(f"| {p['gpus']} | {p['nodes']} | {p['batch_per_gpu']} | {p['step_ms_overlap']:.3f} - "
                     f"{p['step_ms_serial']:.3f} | {p['throughput_low']:,.0f} - {p['throughput_high']:,.0f} | "
                     f"{p['efficiency_low']:.2f} - {p['efficiency_high']:.2f} | {ph['compute']:.3f} | "
                     f"{ph['embedding_exchange']:.3f} | {ph['gradient_exchange']:.3f} | {p['dominant']} | {mem} | "
                     f"{meas} |")
    if record.get("not_projected"):
        lines += ["", "Not projected: " + "; ".join(why for why in record["not_projected"].values()) + "."]
    lines += ["", "The band runs from no overlap of compute and exchanges (low) to full overlap (high), "
              "with the calibration's slowest and fastest repeat where it has repeats; "
              "docs/studies.md, \"Projecting a study\", gives every formula."]
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ("gpus", "nodes", "gpus_per_node", "batch_per_gpu", "step_ms_overlap", "step_ms_serial",
               "throughput_low", "throughput_high", "efficiency_low", "efficiency_high", "compute_ms",
               "embedding_exchange_ms", "gradient_exchange_ms", "dominant", "embedding_bytes_slowest",
               "memory_gb_per_rank", "fits", "measured_throughput")


def csv_text(record: Dict[str, Any]) -> str:
    import csv
    import io
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for p in record["points"]:
        flat = dict(p, **{f"{k}_ms": v for k, v in p["phases_ms"].items()})
        w.writerow(["" if flat.get(k) is None else flat[k] for k in CSV_COLUMNS])
    return out.getvalue()


def figure(record: Dict[str, Any]):
    """Log-log throughput vs GPUs: the band, the measured points, the published rows."""
    plt = load_pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    pts = record["points"]
    xs = [p["gpus"] for p in pts]
    ax.fill_between(xs, [p["throughput_low"] for p in pts], [p["throughput_high"] for p in pts], alpha=0.3,
                    label="projected band (no overlap - full overlap)")
    ax.plot(xs, [p["throughput_high"] for p in pts], lw=1)
    ax.plot(xs, [p["throughput_low"] for p in pts], lw=1)
    meas = [(p["gpus"], p["measured_throughput"]) for p in pts if p.get("measured_throughput")]
    if meas:
        ax.plot(*zip(*meas), "ko", label="measured (this study)")
    pub = [(p["gpus"], q["throughput"]) for p in pts for q in p.get("published", [])]
    if pub:
        ax.plot(*zip(*pub), "r^", ms=8, label="published")
    gpu_axes(ax, xs)
    ax.set_ylabel("samples/s")
    ax.set_title(f"{record['model']} on {record['profile']}: projected throughput")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def write(record: Dict[str, Any], out_dir: str, want_plot=None) -> Dict[str, str]:
    """projection.{md,csv,json} (+ projection.png) in out_dir, written as one group."""
    from jobs.runs.atomic import write_group

    draw = plot_wanted(want_plot)
    make_out_dir(out_dir)
    paths = {k: os.path.join(out_dir, f"projection.{k}") for k in ("md", "csv", "json")}
    files: Dict[str, Any] = {paths["md"]: markdown(record), paths["csv"]: csv_text(record),
             paths["json"]: json.dumps(record, indent=2) + "\n"}
    if draw:
        paths["png"] = os.path.join(out_dir, "projection.png")
        files[paths["png"]] = png(figure(record))
    write_group(files)
    return paths
