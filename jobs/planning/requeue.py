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

`recsys-submit requeue` asks a running job for the same USR2 checkpoint first
(jobs.backends.slurm.requeue); the readers at the end of this module say what that attempt left:
the script's marks, the engine's signal checkpoint, and so the trained steps the requeue kept.
"""

import json
import os

from .argv import RunPath

# Attempts in a row without a new checkpoint after which a job stops requeueing itself.
MAX_IDLE_REQUEUES = 3
ATTEMPT = "attempt.json"          # written by the engine (recsys.checkpoints.atomic.note_attempt)


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


# --- `recsys-submit requeue` of a running job: checkpoint first (jobs.backends.slurm.backend) ---
# The command sends the batch script USR2 (what the time limit sends); the script forwards it to
# the step, the engine saves a checkpoint and exits, and the script requeues the job. These read
# what that left: the script's marks in logs/<key>-<tag>.info and the engine's JSON log.
INFO_MARKS = ("start", "requeue_requested", "requeue_failed", "requeue_stopped", "hung", "exit_code")
# how long `requeue` waits for the checkpoint and the job's own requeue
REQUEUE_WAIT_S = 300.0


def script_settings(script_text):
    """(requeue on USR2, checkpoint dir or "") as the rendered batch script says them."""
    requeue, ckpt = True, ""
    for line in script_text.splitlines():
        if line.startswith("recsys_requeue="):
            requeue = line.split("=", 1)[1].split()[0] == "yes"
        elif line.startswith("recsys_ckpt_dir="):
            value = line.split("=", 1)[1].split("#", 1)[0].strip()
            ckpt = value.strip("'\"")
    return requeue, ckpt


def info_marks(run_dir, key, tag):
    """{mark: how many times the batch script wrote it} for INFO_MARKS (an attempt appends)."""
    counts = dict.fromkeys(INFO_MARKS, 0)
    try:
        with open(os.path.join(run_dir, "logs", f"{key}-{tag}.info"), errors="replace") as handle:
            for line in handle:
                mark = line.split("=", 1)[0]
                if mark in counts:
                    counts[mark] += 1
    except OSError:
        pass
    return counts


def engine_progress(run_dir, key, tag):
    """(number of engine log records, last trained step or None, steps of the checkpoints saved
    on a signal) from logs/<key>-<tag>.engine.jsonl."""
    from jobs.runs.enginelog import job_logs, records

    paths = job_logs(run_dir, key, [tag])
    found = records(paths[0]) if paths else []
    steps = [r["step"] for r in found if r.get("type") == "step" and isinstance(r.get("step"), int)]
    saved = [r["step"] for r in found if r.get("type") == "checkpoint" and r.get("reason") == "signal"
             and isinstance(r.get("step"), int)]
    return len(found), (max(steps) if steps else None), saved


def kept_line(key, tag, checkpoint_dir, before, after):
    """The one line `requeue` prints for a task it requeued: the checkpoint it asked for and how
    many trained steps the requeued attempt keeps (`before`/`after`: engine_progress)."""
    new_saves = after[2][len(before[2]):]
    last = after[1]
    if new_saves:
        step = new_saves[-1]
        lost = max(0, (last or step) - step)
        return (f"requeue: job {key} ({tag}): checkpoint at step {step} saved, requeued: {step} steps kept, "
                f"{lost} lost")
    if not checkpoint_dir:
        return f"requeue: job {key} ({tag}): requeued; it writes no checkpoint (no --checkpoint-dir), so it starts over"
    return (f"requeue: job {key} ({tag}): requeued, but no checkpoint was saved on the signal "
            f"(last trained step {last if last is not None else 'none'}); it resumes from its last checkpoint in "
            f"{checkpoint_dir}, if any")
