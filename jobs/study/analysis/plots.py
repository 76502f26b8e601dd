"""The plotting every study output shares (the report, compare, history, the projection): matplotlib
loaded on demand (a login node without it still gets every table), the one check of ``--plot``, a
figure rendered to PNG bytes in memory (written with its tables as one group) or written alone,
the output directory, and the axes of a throughput-vs-GPUs plot. The figures themselves stay with the module
whose record they draw."""
from __future__ import annotations

import io
import os
from typing import Iterable, Optional

from jobs.errors import RequestError
from jobs.runs.atomic import storage_error, write_bytes


def load_pyplot():
    """matplotlib's pyplot on the Agg backend, or a RequestError naming --plot."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RequestError("--plot: matplotlib is not installed; pip install 'recsys-submit[plot]' "
                           "(or pass --no-plot)") from None
    return plt


def plot_wanted(want_plot: Optional[bool]) -> bool:
    """Whether to draw: True needs matplotlib (RequestError naming --plot, before anything is
    written), None draws when it is installed, False never."""
    if want_plot is False:
        return False
    try:
        load_pyplot()
    except RequestError:
        if want_plot:
            raise
        return False
    return True


def png(fig) -> bytes:
    """A figure as PNG bytes, rendered in memory (and closed): plots are written with their
    tables, as one group of files."""
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=100)
    finally:
        load_pyplot().close(fig)
    return buffer.getvalue()


def write_png(path: str, fig) -> None:
    """A figure written alone as a PNG at `path` (atomically: jobs.runs.atomic), for the commands
    whose `--plot PATH` asks for the figure without its tables."""
    write_bytes(path, png(fig))


def gpu_axes(ax, ticks: Iterable[int], log_y: bool = True) -> None:
    """A throughput-vs-GPUs axis: GPUs on a log2 axis ticked at the counts drawn, "GPUs" below."""
    ticks = sorted(set(ticks))
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(ticks, [str(t) for t in ticks])
    if log_y:
        ax.set_yscale("log")
    ax.set_xlabel("GPUs")


def make_out_dir(out_dir: str) -> None:
    """An output directory, made if missing; a StorageError (one line, exit 1) when it cannot be,
    e.g. the default <study>/report of a study the user may only read."""
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise storage_error(out_dir, exc, what="cannot create") from None
