"""The study report's scaling figure: throughput and efficiency vs GPUs (scaling.png)."""

from .plots import gpu_axes, load_pyplot, write_png


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


def plot(report, path):
    """Write figure(report) as a PNG (atomically). Needs matplotlib (RequestError naming --plot
    when it is missing)."""
    write_png(path, figure(report))
