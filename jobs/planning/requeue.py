"""Requeue progress: a requeued training job must move its checkpoint forward, or stop.

A job that gets USR2 (`--signal-seconds` before its time limit, or a preemption) saves a
checkpoint and requeues itself (slurm/job.sbatch.tmpl). When start-up plus one checkpoint takes
longer than the time the job has before the signal, each attempt ends before it writes a new
checkpoint and the job would requeue forever. The batch script therefore compares the newest
`ckpt-<step>` in the job's checkpoint directory at the start of an attempt and at USR2, counts
attempts in a row that wrote none (`idle_attempts=` in logs/<key>-<tag>.info), and after
MAX_IDLE_REQUEUES of them stops requeueing with one line saying why (exit 3).

At submission, `lead_time_warning` compares the request with what the previous attempt on the
same checkpoint directory measured (the engine writes `<checkpoint-dir>/attempt.json`: seconds
from process start to the first trained step, and of its last checkpoint write).
"""

import json
import os

from .argv import RunPath

# Attempts in a row without a new checkpoint after which a job stops requeueing itself.
MAX_IDLE_REQUEUES = 3
ATTEMPT = "attempt.json"          # written by the engine (recsys.checkpoint.note_attempt)


def previous_attempt(directory, run_dir=None):
    """The engine's record of the last attempt on `directory` ({startup_s, checkpoint_s, ...}),
    or None (none yet, unreadable). A relative directory (or a RunPath a chain hands over) is the
    run directory's, where ranks run."""
    if not directory:
        return None
    if isinstance(directory, RunPath):
        directory = directory.under(run_dir or ".")
    path = os.path.join(run_dir or ".", directory, ATTEMPT) if not os.path.isabs(directory) \
        else os.path.join(directory, ATTEMPT)
    try:
        with open(path) as handle:
            info = json.load(handle)
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _seconds(info, key):
    value = info.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        return None
    return float(value)


def lead_time_warning(spec, run_dir=None):
    """One line when the previous attempt on this job's checkpoint directory shows that a
    requeued attempt cannot write a new checkpoint before USR2 (or save within the lead time)."""
    if not spec.checkpoint_dir or not spec.requeue:
        return None
    info = previous_attempt(spec.checkpoint_dir, run_dir)
    if not info:
        return None
    startup, save = _seconds(info, "startup_s"), _seconds(info, "checkpoint_s") or 0.0
    before_signal = spec.time_seconds - spec.signal_seconds
    where = os.path.join(spec.checkpoint_dir, ATTEMPT)
    if startup is not None and before_signal < startup + save:
        return (f"job {spec.key}: USR2 comes {before_signal} s after start (--time minus --signal-seconds "
                f"{spec.signal_seconds}), but the previous attempt needed {startup:.0f} s of start-up plus "
                f"{save:.0f} s for a checkpoint ({where}): a requeued attempt would write no new checkpoint "
                f"(requeueing stops after {MAX_IDLE_REQUEUES} such attempts); give a longer --time")
    if save and spec.signal_seconds < save:
        return (f"job {spec.key}: --signal-seconds {spec.signal_seconds} is shorter than the previous "
                f"attempt's checkpoint write ({save:.0f} s, {where}): the job may be killed mid-save")
    return None
