"""`recsys-submit requeue` on Slurm: checkpoint first, then requeue, and never re-run a finished job.

A bare `scontrol requeue` kills the running attempt and loses every step since its last
checkpoint, and Slurm accepts it for a COMPLETED job too (the job runs again). So the command
sends the batch script USR2 (`scancel --batch --signal=USR2`), as the time limit does: the script
forwards it to the step, the engine saves a checkpoint and exits, and the script requeues its own
job (slurm/job.sbatch.tmpl). Slurm refuses a signal to a job that has ended ("Invalid job id
specified"), so a job that ended after the command looked at it is refused by Slurm itself, in
one line, and nothing runs again. The command then waits (with a timeout) for the script's
requeue and says how many trained steps the checkpoint kept (jobs.planning.requeue).
"""

import os
from typing import Callable, Dict, List, Optional

from jobs import states
from jobs.errors import RequestError, SlurmCommandError
from jobs.planning import requeue as progress
from jobs.polling import poll_until

from . import commands
from .states import to_state


def _tasks(job) -> Dict[str, str]:
    """{task as Slurm names it (`ID`, or `ID_TASK` of an array): state}; {} once Slurm forgot it."""
    proc = commands.run(["squeue", "-h", "-j", str(job.job_id), "--states=all", "-o", "%i %T"])
    if proc.returncode != 0:
        if "invalid job id" in proc.stderr.lower():
            return {}
        raise commands.failed("squeue", proc)
    return dict(line.split(None, 1) for line in proc.stdout.splitlines() if len(line.split()) == 2)


def _restarts(tag: str) -> int:
    proc = commands.run(["scontrol", "-o", "show", "job", tag])
    words = dict(w.split("=", 1) for w in proc.stdout.split() if "=" in w)
    value = words.get("Restarts", "0")
    return int(value) if value.isdigit() else 0


def _script(job) -> str:
    try:
        with open(job.script or "", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def requeue_with_checkpoint(run_dir: str, jobs, log: Optional[Callable[[str], None]] = None,
                            timeout: Optional[float] = None) -> List[str]:
    """Ask each running job of `jobs` (JobRecords) to checkpoint and requeue itself; wait for it.
    Returns the ids asked. A job that ended meanwhile: RequestError with Slurm's refusal. One that
    does not requeue within `timeout` s: SlurmCommandError saying where to look."""
    say = log or (lambda line: None)
    wait = progress.REQUEUE_WAIT_S if timeout is None else float(timeout)
    asked: List[str] = []
    watched: list = []
    pending: list = []
    for job in jobs:
        requeues, ckpt = progress.script_settings(_script(job))
        if not requeues:
            raise RequestError(f"requeue: job {job.key} ({job.job_id}) was submitted with --no-requeue: its batch "
                               "script ends after the checkpoint instead of requeueing; cancel it and submit again "
                               "(the engine's --restore resumes from its checkpoint)")
        tasks = _tasks(job)
        tags = [t for t, word in tasks.items() if word == "RUNNING"]
        if not tags and any(to_state(word) in states.ACTIVE and word != "COMPLETING" for word in tasks.values()):
            pending.append(f"job {job.key} ({job.job_id}) is {', '.join(sorted(set(tasks.values())))}")
            continue
        if not tags:
            raise RequestError(f"requeue: job {job.key} ({job.job_id}) ended after it was looked at "
                               f"({', '.join(sorted(set(tasks.values()))) or 'gone from Slurm'}); nothing was requeued")
        before = {t: (progress.info_marks(run_dir, job.key, t), progress.engine_progress(run_dir, job.key, t),
                      _restarts(t)) for t in tags}
        proc = commands.run(["scancel", "--batch", "--signal=USR2", str(job.job_id)])
        if proc.returncode != 0:
            others = f" (already asked to checkpoint and requeue: {' '.join(asked)})" if asked else ""
            raise RequestError(f"requeue: job {job.key} ({job.job_id}) was not asked to checkpoint, Slurm refused "
                               f"the signal ({commands.first_line(proc.stderr)}): it ended after it was looked at; "
                               f"nothing was requeued{others}")
        asked.append(job.job_id)
        watched += [(job, t, ckpt, before[t]) for t in tags]
    if pending:
        say(f"requeue: left alone, not running: {', '.join(pending)}")
    if not asked:
        raise RequestError(f"requeue: run {run_dir}: not running: {', '.join(pending)}; nothing to "
                           "checkpoint or requeue")

    def outcome(item):
        job, tag, _, (marks, _, restarts) = item
        now = progress.info_marks(run_dir, job.key, tag)
        new = {k: now[k] - marks[k] for k in now}
        if new["requeue_failed"] or new["requeue_stopped"] or new["hung"]:
            return "refused"
        if new["requeue_requested"] and _restarts(tag) > restarts:
            return "requeued"
        if new["exit_code"]:
            return "ended"
        return None

    def poll():
        return [outcome(item) for item in watched]

    try:
        results = poll_until(poll, lambda seen: all(seen), first=0.5, ceiling=5.0, timeout=wait)
    finally:
        _forget_status(run_dir)     # the cached states are stale now, whatever happened
    for (job, tag, ckpt, was), result in zip(watched, results):
        info = os.path.join("logs", f"{job.key}-{tag}.info")
        if result == "requeued":
            say(progress.kept_line(job.key, tag, ckpt, was[1], progress.engine_progress(run_dir, job.key, tag)))
            continue
        why = {None: f"it did not requeue within {wait:.0f} s (it may still: see {info})",
               "ended": f"its batch script ended instead of requeueing (see {info} and its .out)",
               "refused": f"its batch script did not requeue it (see the last lines of its .out, {info})"}[result]
        raise SlurmCommandError(f"requeue: job {job.key} ({tag}) was asked to checkpoint; {why}")
    return asked


def _forget_status(run_dir: str) -> None:
    try:
        os.remove(os.path.join(run_dir, "status.json"))
    except FileNotFoundError:
        pass

