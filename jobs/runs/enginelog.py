"""What the submission layer reads back from a finished job: the engine's JSON-lines log.

The engine writes one JSON object per line (recsys.monitoring.logger); the submission layer passes its
`--log-path` (jobs.planning.argv.EngineLog), so the log of job <key> is logs/<key>-<tag>.engine.jsonl in
the run dir. The final `summary` record (throughput, step time, metrics, world size) is what
status and studies report: read defensively (a torn last line, a record of a later summary
version, missing fields are skipped, never guessed), and never from the human log lines. Only
the reason of a failure, which the engine cannot always write (a scancel, a crash), is taken
from the text logs.
"""

import glob
import json
import os
import re

from .rundir import ENGINE_LOG_SUFFIX as SUFFIX
# the `summary` record formats this reader knows, 1..SUMMARY_VERSION (docs/engine-log.md); a later
# one is skipped, since a field may have changed meaning (a record without the field is of version 1).
# 3 adds `step_breakdown` (--breakdown-steps), passed through as it is, like every field not read here;
# it carries its own `version` (1, or 2: compute timed alone, the remainder measured, `timed_step_ms` and
# `split_over_timed` added), read by jobs.study.analysis.report, which takes either.
SUMMARY_VERSION = 3
# summary fields a study reads; others pass through untouched
THROUGHPUT, STEP_TIME, WORLD_SIZE = "throughput_samples_per_s", "mean_step_time_ms", "world_size"
_REASON = re.compile(r"error|cancelled|killed|exception|diverg|timeout|time limit|oom|segmentation",
                     re.IGNORECASE)


def _parsed(lines):
    """The well-formed records among JSON lines (undecodable ones skipped)."""
    out = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue        # a torn line of a killed job
        if isinstance(rec, dict):
            out.append(rec)
    return out


def records(path):
    """Every well-formed record of a JSON-lines log (undecodable lines skipped); [] if absent."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return _parsed(handle)
    except OSError:
        return []


def job_logs(run_dir, key, tags=None):
    """Engine logs of job `key`: logs/<key>-<tag>.engine.jsonl for the given tags, else every
    tag of that key (oldest first)."""
    logs = os.path.join(run_dir, "logs")
    if tags:
        paths = [os.path.join(logs, f"{key}-{tag}{SUFFIX}") for tag in tags]
        return [p for p in paths if os.path.exists(p)]
    return sorted(glob.glob(os.path.join(logs, f"{glob.escape(key)}-*{SUFFIX}")), key=os.path.getmtime)


SUMMARY_TAIL_BYTES = 1 << 16    # a summary record is a few KiB; the engine writes it last
HEAD_BYTES = 1 << 16            # the start-up records (where the event files go) come first


def head_records(path, nbytes=HEAD_BYTES):
    """The complete records in the first `nbytes` of an engine log ([] when it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(nbytes)
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return _parsed(lines[:-1] if len(data) == nbytes else lines)     # the last line may be cut


def tensorboard_dirs(run_dir):
    """{job name: the directory its event files went to} for the jobs of a run whose engine said so
    (its ``tensorboard_dir`` info record: a restored training writes into its first attempt's)."""
    out = {}
    for path in sorted(glob.glob(os.path.join(glob.escape(run_dir), "logs", f"*{SUFFIX}"))):
        for rec in head_records(path):
            if rec.get("type") == "info" and isinstance(rec.get("tensorboard_dir"), str):
                out[os.path.basename(path)[:-len(SUFFIX)]] = rec["tensorboard_dir"]
                break
    return out


def tail_text(path, nbytes):
    """The last `nbytes` of a file, decoded (bad bytes replaced). Raises OSError."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        handle.seek(max(0, handle.tell() - nbytes))
        return handle.read().decode("utf-8", errors="replace")


def ends_with_summary(path):
    """Whether the engine log's last complete line is a `summary` record (the run has ended)."""
    try:
        tail = tail_text(path, SUMMARY_TAIL_BYTES)
    except OSError:
        return False
    lines = [line for line in tail.splitlines() if line.strip()]
    try:
        return bool(lines) and json.loads(lines[-1]).get("type") == "summary"
    except (ValueError, AttributeError):
        return False


def activity(run_dirs):
    """What changes when a job of these runs starts or ends, read without the scheduler: the names
    in each run dir and its logs/ (a job's batch output and rank logs appear as it starts), and
    which engine logs end with their summary (written as the engine ends). Steady logging does
    not change it, so a watcher woken by it does not poll the scheduler at every log line."""
    names, ended = [], []
    for run_dir in run_dirs:
        for path in (run_dir, os.path.join(run_dir, "logs")):
            try:
                names += sorted(os.path.join(path, name) for name in os.listdir(path))
            except OSError:
                names.append((path, None))
        ended += [p for p in glob.glob(os.path.join(glob.escape(run_dir), "logs", f"*{SUFFIX}"))
                  if ends_with_summary(p)]
    return tuple(map(str, names)), tuple(sorted(ended))


def summary(paths):
    """The last `summary` record of the logs (a requeued job appends; the last run counts) of a
    version this reader knows; None when there is none."""
    found = None
    for path in paths:
        for rec in records(path):
            if rec.get("type") == "summary" and _known_version(rec):
                found = rec
    return found


def _known_version(record):
    version = record.get("summary_version", 1)
    return isinstance(version, int) and not isinstance(version, bool) and 1 <= version <= SUMMARY_VERSION


def startup(paths):
    """The `startup` records (one per phase: horovod_init, data, model, first_step)."""
    return [rec for path in paths for rec in records(path) if rec.get("type") == "startup"]


def hang_reason(paths):
    """The line of the watchdog that ended the last run of these logs (its `hang` records, one per
    rank that could still speak; docs/engine-log.md), or None when none fired: the record of a
    rank naming the peer it waits for is best, else the lowest rank's. Only records after the
    run's last start count (a requeued job appends to its log)."""
    hangs = []
    for path in paths:
        for rec in records(path):
            if rec.get("type") == "startup" and rec.get("phase") == "horovod_init":
                hangs = []
            elif rec.get("type") == "hang" and isinstance(rec.get("message"), str):
                hangs.append(rec)
    if not hangs:
        return None
    best = min(hangs, key=lambda r: (not r.get("waits_for"), r.get("rank") if isinstance(r.get("rank"), int) else 1 << 30))
    message = best["message"]
    return message if len(message) <= 400 else message[:397] + "..."


def with_state(state, reason):
    """`STATE: reason`, the state said once: a reason that starts with it ("CANCELLED: rank 1: ...",
    "hung: rank 0 ...") is shown as it is."""
    if not reason:
        return state or ""
    if not state or reason.split(":", 1)[0].strip().upper() == str(state).upper():
        return reason
    return f"{state}: {reason}"


def number(record, field):
    """A finite float field of a record, or None (absent, null, "nan", not a number)."""
    if not record:
        return None
    value = record.get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if value == value and value not in (float("inf"), float("-inf")) else None


# The last words of a failing rank, best first: a program's own one-line error
# (`recsys-train: error: ...`, `python -m preproc: error: ...`; not srun's), the last line of a
# Python traceback, then anything that looks like a reason.
_OWN_ERROR = re.compile(r"^(?!srun: )[\w./ -]+: error: |^\w+(Error|Exception|Exit): ")
_SRUN_TASK = re.compile(r"srun: error: \S+: task (\d+): (Exited with exit code [1-9]|Killed|Segmentation)")
_RANK_LOG = re.compile(r"\.rank(\d+)\.log$")


def _lines(paths):
    for path in paths:
        try:
            with open(path, errors="replace") as handle:
                for line in handle:
                    line = line.strip()
                    if line:
                        yield line
        except OSError:
            continue


def _last(paths, pattern):
    found = None
    for line in _lines(paths):
        if pattern.search(line) and not line.startswith("[recsys] summary"):
            found = line
    return found


def _short(line):
    return line if len(line) <= 200 else line[:197] + "..."


def failure_reason(run_dir, key, state):
    """One line saying why job `key` failed: its state, the failing rank and that rank's last
    error line (the engine prints `recsys-train: error: ...` in its rank log). The failing rank
    is the first one srun names as exiting badly in the batch output, else the first whose log
    has an error of its own; without rank logs, the batch output's last error-looking line."""
    logs = os.path.join(run_dir, "logs")
    batch = sorted(glob.glob(os.path.join(logs, f"{glob.escape(key)}-*.out")), key=os.path.getmtime)
    ranks = {}
    for path in sorted(glob.glob(os.path.join(logs, f"{glob.escape(key)}-*.rank*.log")), key=os.path.getmtime):
        match = _RANK_LOG.search(path)
        if match:
            ranks.setdefault(int(match.group(1)), []).append(path)
    named = []
    for line in _lines(batch):
        match = _SRUN_TASK.search(line)
        if match and int(match.group(1)) not in named:
            named.append(int(match.group(1)))
    order = named + sorted(r for r in ranks if r not in named)
    for pattern in (_OWN_ERROR, _REASON):
        for rank in order:
            line = _last(ranks.get(rank, []), pattern)
            if line:
                return f"{state}: rank {rank}: {_short(line)}"
    best = _last(batch, _OWN_ERROR) or _last(batch, _REASON)
    return f"{state}: {_short(best)}" if best else state


# what a start-up that reached the last `startup` record of this phase was doing next (recsys.train)
_AFTER_STARTUP = {None: "start-up, before Horovod's initialisation", "horovod_init": "start-up, loading its data",
                  "data": "start-up, building its model", "model": "its first step (tracing included)"}
# each rank's heartbeat beside the engine log when the job has more than one rank (recsys.monitoring.watchdog's
# heartbeat_dir: <engine log>.ranks/rank<R>.json, the rank's phase and step, rewritten about once a second)
HEARTBEATS = ".ranks"


def stalled_where(run_dir: str, key: str, tag: str, nodes: list, ntasks: int) -> str:
    """Where a job that ran out of time was, from what its ranks left: its phase (before its first
    step, and in which part of the start-up, or in its steps) and, when the ranks' heartbeats or
    a lone rank tell, the rank that stopped first and its node (`nodes`: the job's node names;
    ranks are placed in blocks, as srun does by default)."""
    log = os.path.join(run_dir, "logs", f"{key}-{tag}{SUFFIX}")
    phases = [rec.get("phase") for rec in startup([log])]
    if "first_step" in phases:
        where = "after its first step, in its steps"
    else:
        last = phases[-1] if phases and phases[-1] in _AFTER_STARTUP else None
        where = f"before its first step ({_AFTER_STARTUP[last]})"
    rank, heard = (0, None) if ntasks == 1 else _stalest_rank(f"{log}{HEARTBEATS}", ntasks)
    if rank is None:
        return where
    node = f" on {nodes[rank * len(nodes) // ntasks]}" if nodes and ntasks else ""
    return f"{where}; rank {rank}{node}" + (f" (last heard in {heard})" if heard else "")


def _stalest_rank(beats, ntasks):
    """(rank, its last phase) of the rank whose heartbeat is oldest (one without a heartbeat
    first); (None, None) when no rank wrote one (the watchdog off, or no rank got that far)."""
    seen = {}
    for rank in range(ntasks):
        try:
            with open(os.path.join(beats, f"rank{rank}.json")) as handle:
                beat = json.load(handle)
            seen[rank] = (float(beat["time"]), f"{beat.get('phase')} at step {beat.get('step')}")
        except (OSError, ValueError, KeyError, TypeError):
            seen[rank] = (float("-inf"), None)
    if all(when == float("-inf") for when, _ in seen.values()):
        return None, None
    rank = min(seen, key=lambda r: seen[r][0])
    return rank, seen[rank][1]
