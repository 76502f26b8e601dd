"""The history of a runs directory's studies: one entry per finished study in
<runs dir>/studies-index.json (typed, versioned), written when the study's report is written
(jobs.study.analysis.report.write): name, date, profile, the frozen code's hash (jobs.study.running.frozen),
model, points, the headline (the largest measured size of the first variant: throughput and
efficiency) and every cell's repeats, so a point's throughput can be followed over time and
judged against the study before it with the compare test (jobs.study.analysis.compare.judge). This
module sits above report and compare: they know it only as the hooks `study report` and
`study compare` pass them (on_report, find).

The index is rewritten whole (temporary name, then rename) under an flock on
<runs dir>/studies-index.lock, so two studies whose reports are written at the same moment both
land in it. A study whose directory is gone stays listed, as gone. The index is no more readable
than the most private study it lists (each entry records who may read its study, `readers`):
0600, or 0640 with the group when every study it lists is readable by that one group (the
profile's runs_group). The runs dir may be shared: only this user's own lock and index are
written (another user's is refused in one line, and the report goes on without the history).
"""

import contextlib
import os
import re
import stat
import time
import warnings

from jobs.errors import RequestError, ResultsNotSaved, StorageError
from jobs.runs import rundir
from jobs.runs.atomic import read_json, write_json

from .plots import load_pyplot, plot_wanted, write_png

INDEX = "studies-index.json"
LOCK = "studies-index.lock"
HISTORY_VERSION = 1
LOCK_WAIT_S = 30.0      # how long a report waits for another one writing the index
PRESENT, GONE = "present", "gone"


def index_path(runs_dir):
    return os.path.join(runs_dir, INDEX)


def cell_id(gpus, nodes, gpus_per_node, variant):
    """A cell's name, as its points' ids have it without the repeat: `g8-n4x2`, `g2-n1x2-amp-true`."""
    tag = "" if variant == "default" else "-" + variant.replace("=", "-").replace(",", "-")
    return f"g{gpus}-n{nodes}x{gpus_per_node}{tag}"


def entry(record, report):
    """The index entry of a study from its report (jobs.study.analysis.report.build)."""
    cells = []
    for row in report["rows"]:
        for variant, cell in row["variants"].items():
            cells.append({"id": cell_id(row["gpus"], row["nodes"], row["gpus_per_node"], variant),
                          "gpus": row["gpus"], "nodes": row["nodes"], "gpus_per_node": row["gpus_per_node"],
                          "variant": variant, "global_batch": row["global_batch"],
                          "throughput": cell["throughput"], "throughputs": list(cell["throughputs"]),
                          "efficiency": cell["efficiency"], "failed": len(cell["failed"])})
    first = report["variants"][0] if report["variants"] else None
    measured = [c for c in cells if c["variant"] == first and c["throughput"] is not None]
    top = max(measured, key=lambda c: (c["gpus"], c["nodes"]), default=None)
    return {"name": record.name, "study_dir": record.study_dir, "created": record.created,
            "date": round(time.time(), 3), "profile": record.profile,
            "code": (record.code or {}).get("sha256"), "model": report["model"], "scaling": report["scaling"],
            "points": len(record.points), "failed": len(report["failures"]),
            "headline": None if top is None else {"cell": top["id"], "gpus": top["gpus"],
                                                  "throughput": top["throughput"], "efficiency": top["efficiency"]},
            "cells": cells}


def finished(report):
    """Whether a report is of a finished study: no point queued, running or not reported yet."""
    return not [p for p in report["pending"] if p["state"] != "missing"]


@contextlib.contextmanager
def _locked(runs_dir):
    """The index's lock held (rundir.holding: never through a link, this user's own; the runs dir
    itself may be shared, so only the lock file is checked)."""
    path = os.path.join(runs_dir, LOCK)
    try:
        with rundir.holding(path, retry_s=LOCK_WAIT_S, private_dir=False):
            yield
    except BlockingIOError:
        raise StorageError(f"study history: {path} held for more than {LOCK_WAIT_S:g} s by another "
                           "process") from None


def _readers(study_dir):
    """Who besides its owner may read a study: its group's id when the group may (the profile's
    runs_group), else None (its owner only)."""
    try:
        st = os.stat(study_dir)
    except OSError:
        return None
    if st.st_mode & stat.S_IROTH:
        return "all"
    return st.st_gid if st.st_mode & stat.S_IRGRP else None


def _access(studies):
    """(mode, gid or None) of an index listing `studies`: no more readable than the most private
    of them (an entry from before `readers` was recorded counts as private to its owner)."""
    readers = [e.get("readers") for e in studies]
    if readers and all(r == "all" for r in readers):
        return 0o644, None
    groups = {r for r in readers if r != "all"}     # a study everyone may read, its group may too
    if len(groups) == 1 and isinstance(next(iter(groups)), int):
        return 0o640, next(iter(groups))
    return 0o600, None


def _write_index(runs_dir, studies):
    """The index rewritten whole, then given the mode and group its studies allow (_access),
    changed through a descriptor opened without following a link: never another user's file."""
    path = index_path(runs_dir)
    if os.path.lexists(path):
        rundir.check_private(path, what="study history: the index")
    mode, gid = _access(studies)
    write_json(path, {"version": HISTORY_VERSION, "studies": studies}, mode=0o600)
    if mode == 0o600:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise StorageError(f"study history: cannot open {path}: {exc.strerror}") from None
    try:
        rundir.check_private(path, os.fstat(fd), what="study history: the index")
        if gid is not None:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, mode)
    except OSError as exc:
        raise StorageError(f"study history: cannot give {path} its mode {mode:04o}: {exc.strerror}") from None
    finally:
        os.close(fd)


def load(runs_dir):
    """The entries of the runs dir's index, oldest first ([] when there is none)."""
    path = index_path(runs_dir)
    try:
        data = read_json(path)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise RequestError(f"study history: {path} cannot be read ({exc})") from None
    if (not isinstance(data, dict) or data.get("version") != HISTORY_VERSION
            or not isinstance(data.get("studies"), list)):
        raise RequestError(f"study history: {path} is not a version {HISTORY_VERSION} study index")
    return sorted(data["studies"], key=lambda e: e.get("date") or 0)


def add(record, report):
    """Put the study in its runs dir's index (replacing its earlier entry) under the index's lock.
    Best effort, as results.json: a study the user may only read is reported without it
    (ResultsNotSaved warning)."""
    runs_dir = os.path.dirname(record.study_dir)
    try:
        with _locked(runs_dir):
            studies = [e for e in load(runs_dir) if e.get("study_dir") != record.study_dir]
            studies.append(dict(entry(record, report), readers=_readers(record.study_dir)))
            _write_index(runs_dir, studies)
    except (StorageError, RequestError) as exc:
        warnings.warn(f"study history: {exc}", ResultsNotSaved, stacklevel=2)


def on_report(record, report):
    """jobs.study.analysis.report.write's hook: a finished study's report puts it in the history."""
    if finished(report):
        add(record, report)


def _present(e):
    return PRESENT if os.path.isfile(os.path.join(e.get("study_dir") or "", "study.json")) else GONE


def listing(runs_dir, model=None, profile=None):
    """The index's entries, filtered, each with its `state` (present or gone) now."""
    out = []
    for e in load(runs_dir):
        if (model is None or e.get("model") == model) and (profile is None or e.get("profile") == profile):
            out.append(dict(e, state=_present(e)))
    return out


def find(name, runs_dir):
    """The directory of the newest study named `name` in the history (RequestError, one line, when
    none is, or its directory is gone)."""
    named = [e for e in load(runs_dir) if e.get("name") == name]
    if not named:
        return None
    newest = named[-1]
    if _present(newest) == GONE:
        raise RequestError(f"study: {name!r} is in the history of {runs_dir} but its directory "
                           f"{newest['study_dir']} is gone")
    return newest["study_dir"]


def _fmt(value, digits=0):
    return "-" if value is None else f"{value:,.{digits}f}"


def text(entries):
    """`study history`'s table."""
    if not entries:
        return "no finished studies in the history (a study is listed once `study report` has been written)\n"
    head = ["date", "study", "profile", "model", "code", "points", "headline", "throughput (samples/s)",
            "efficiency", "state"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|---|---|---:|---|---:|---:|---|"]
    for e in entries:
        top = e.get("headline") or {}
        lines.append("| " + " | ".join([
            time.strftime("%Y-%m-%d %H:%M", time.localtime(e.get("date") or 0)), e.get("name", "?"),
            e.get("profile", "?"), f"{e.get('model')} {e.get('scaling')}", (e.get("code") or "not frozen")[:12],
            str(e.get("points", "-")) + (f" ({e['failed']} failed)" if e.get("failed") else ""),
            top.get("cell") or "-", _fmt(top.get("throughput")), _fmt(top.get("efficiency"), 2),
            e["state"]]) + " |")
    return "\n".join(lines) + "\n"


def check_point(point):
    """A cell id as `--plot` takes it (it names the plot's file too)."""
    if not isinstance(point, str) or not re.fullmatch(r"g\d+-n\d+x\d+[A-Za-z0-9_.-]*", point):
        raise RequestError(f"--plot: {point!r} is not a point such as g2-n1x2 (`study history --json` lists "
                           "each study's cells)")
    return point


def series(entries, point):
    """The chosen cell over time: [{name, date, throughput, min, max, n, verdict, p_value, state}],
    each judged against the entry before it with the compare test (jobs.study.analysis.compare.judge)."""
    from .compare import REFERENCE, judge

    models = sorted({f"{e.get('model')} {e.get('scaling')}" for e in entries})
    if len(models) > 1:
        raise RequestError(f"--plot: the listed studies are of {len(models)} kinds ({', '.join(models)}); "
                           "add --model (and --profile) so one point is followed")
    out, previous = [], None
    for e in entries:
        cell = next((c for c in e.get("cells", []) if c.get("id") == point), None)
        if cell is None or cell.get("throughput") is None:
            continue
        values = list(cell.get("throughputs") or [])
        item = {"name": e["name"], "date": e["date"], "throughput": cell["throughput"], "min": min(values),
                "max": max(values), "n": len(values), "state": e.get("state"), "verdict": REFERENCE,
                "p_value": None, "ratio": None}
        if previous is not None:
            verdict, p, _, _ = judge(previous["throughputs"], values)
            item.update(verdict=verdict, p_value=p, ratio=cell["throughput"] / previous["throughput"])
        previous = {"throughputs": values, "throughput": cell["throughput"]}
        out.append(item)
    if not out:
        known = sorted({c.get("id") for e in entries for c in e.get("cells", [])})
        raise RequestError(f"--plot: no listed study measured point {point!r} (points: {', '.join(known) or 'none'})")
    return out


MARKS = {"reference": ("o", "tab:blue"), "within noise": ("o", "tab:gray"), "ratio only": ("s", "tab:olive"),
         "faster": ("^", "tab:green"), "slower": ("v", "tab:red")}


def figure(points, point):
    """Throughput of `point` over time (median, min-max of the repeats), each study marked by its
    verdict against the one before it."""
    plt = load_pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(points) + 3), 4.2))
    xs = list(range(len(points)))
    ax.plot(xs, [p["throughput"] for p in points], color="tab:blue", alpha=0.4)
    for x, p in zip(xs, points):
        marker, color = MARKS.get(p["verdict"], ("o", "black"))
        ax.errorbar([x], [p["throughput"]], yerr=[[p["throughput"] - p["min"]], [p["max"] - p["throughput"]]],
                    marker=marker, color=color, capsize=4, markersize=9, linestyle="none")
    for verdict, (marker, color) in MARKS.items():
        if any(p["verdict"] == verdict for p in points):
            ax.plot([], [], marker=marker, color=color, linestyle="none",
                    label=verdict if verdict == "reference" else f"{verdict} vs the study before")
    ax.set_xticks(xs, [f"{p['name']}\n{time.strftime('%m-%d %H:%M', time.localtime(p['date']))}"
                       + (" (gone)" if p["state"] == GONE else "") for p in points], fontsize="small")
    ax.set_ylabel("throughput (samples/s, median, min-max)")
    ax.set_title(f"point {point} over time")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot(entries, point, path):
    """Write the plot of `point` over time as a PNG (atomically); the series drawn."""
    plot_wanted(True)       # matplotlib, or one line naming --plot
    points = series(entries, check_point(point))
    write_png(path, figure(points, point))
    return points
