"""The Slurm backend's status poll: as few Slurm calls as the answer needs, never a guess.

Per poll, for every task not settled yet: `sacct` when the cluster has accounting (recorded at
submission from `scontrol show config`), else `squeue`, one call for all runs. sacct learns of a
new job seconds after `sbatch` returns, so the tasks it does not name are asked of the queue
(one `squeue` call) before anything is decided. A task the queue no longer knows is settled from
the exit record its batch script wrote (logs/<key>-<id>.info), else from `scontrol show job`.
A task that no source knows yet is UNKNOWN (never a failure); with accounting, that includes a
job the controller has purged before sacct recorded it.

Every state a poll saw is kept per run in status.json (a versioned record), so a terminal task
is never asked about again, and a job Slurm has forgotten (MinJobAge passed, no accounting)
keeps the last state seen instead of turning UNKNOWN. A job Slurm has forgotten that ended
unseen and left no exit record never finished its script: it is settled once, as failed with
that reason, and not asked about again. Saving status.json is best effort: a reader who cannot
write the run (another user, a read-only mount, a full disk) gets the same answer, and a
jobs.errors.ResultsNotSaved warning says where it could not be kept.
"""

import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Dict, Optional

from jobs import states
from jobs.errors import ResultsNotSaved, StorageError
from jobs.runs.atomic import read_json, write_json
from jobs.runs.records import JobStatus, Record, StatusResult, known_fields

from .queries import CALLS, NEVER, query_sacct, query_scontrol, query_squeue

CACHE_VERSION = 2
CACHE = "status.json"


@dataclass
class TaskSeen(Record):
    """The last thing a poll learnt about one task."""

    state: str
    source: str                         # sacct | squeue | exit-record | scontrol | forgotten
    seen: float                         # time.time() of that poll
    reason: Optional[str] = None        # set when the poll itself knows why (a forgotten job)


@dataclass
class StatusCache(Record):
    """status.json: every task's last seen state."""

    tasks: Dict[str, TaskSeen] = field(default_factory=dict)
    version: int = CACHE_VERSION

    def settled(self, task):
        seen = self.tasks.get(task)
        return seen is not None and seen.state in states.TERMINAL

    @classmethod
    def read(cls, run_dir):
        """The cache of a run; empty when absent or unreadable. Version 1 (before this record)
        was a plain {task: terminal state} mapping."""
        try:
            data = read_json(os.path.join(run_dir, CACHE))
        except (OSError, ValueError):
            return cls()
        if not isinstance(data, dict):
            return cls()
        if "version" not in data:
            return cls(tasks={t: TaskSeen(state=s, source="cache", seen=0.0) for t, s in data.items()
                              if isinstance(s, str)})
        if data.get("version") != CACHE_VERSION:
            return cls()        # another release's cache: ask Slurm again rather than misread it
        return cls(tasks={t: TaskSeen(**known_fields(TaskSeen, v)) for t, v in (data.get("tasks") or {}).items()})

    def write(self, run_dir):
        write_json(os.path.join(run_dir, CACHE), self.to_dict())

    def save(self, run_dir):
        """write(), best effort: the cache only spares Slurm calls, so a poll by someone who
        cannot write the run must still answer (a ResultsNotSaved warning instead)."""
        try:
            self.write(run_dir)
        except StorageError as exc:
            warnings.warn(str(exc), ResultsNotSaved, stacklevel=2)


def _expected_tasks(job):
    if job.array_size:
        return [f"{job.job_id}_{i}" for i in range(job.array_size)]
    return [job.job_id]


def _info_path(run_dir, job, task):
    return os.path.join(run_dir, "logs", f"{job.key}-{task}.info")


def _from_info(run_dir, job, task):
    """State from the batch script's own record (exit_code=... at the end)."""
    try:
        with open(_info_path(run_dir, job, task)) as handle:
            values = dict(line.rstrip("\n").split("=", 1) for line in handle if "=" in line)
    except OSError:
        return None
    if "exit_code" in values:
        return states.COMPLETED if values["exit_code"].strip() == "0" else states.FAILED
    return None


def _forgotten_reason(run_dir, job, task):
    return (f"{states.FAILED}: Slurm no longer knows job {task} (it ended more than MinJobAge ago, "
            f"no accounting) and its batch script left no exit record "
            f"({os.path.relpath(_info_path(run_dir, job, task), run_dir)}): it was cancelled, "
            "killed or lost its node before its script ended")


def _ask(pending, source, accounting):
    """{task: TaskSeen} for every (run_dir, job, task) in `pending`, the set of tasks that can
    never start, and the sources used ('sacct', 'squeue', 'sacct+squeue')."""
    ids = sorted({job.job_id for _, job, _ in pending})
    source = source or os.environ.get("RECSYS_STATUS_SOURCE") or ("sacct" if accounting else "squeue")
    now = round(time.time(), 3)
    never = set()
    answer = query_sacct(ids) if source == "sacct" else None
    used = []
    if answer is not None:
        used.append("sacct")
        found = {t: TaskSeen(state=s, source="sacct", seen=now) for t, s in answer.items()
                 if s != states.UNKNOWN}
    else:
        found = {}
    unanswered = sorted({job.job_id for _, job, task in pending if task not in found})
    if unanswered:      # sacct has not heard of them yet (or there is no accounting): the queue
        used.append("squeue")
        queue = query_squeue(unanswered, never)
        found.update({t: TaskSeen(state=s, source="squeue", seen=now) for t, s in queue.items()
                      if s != states.UNKNOWN and t not in found})
    out = {}
    for run_dir, job, task in pending:
        if task in found:
            out[task] = found[task]
            continue
        state = _from_info(run_dir, job, task)
        if state is not None:
            out[task] = TaskSeen(state=state, source="exit-record", seen=now)
            continue
        state = query_scontrol(task)
        if state is not None and state != states.UNKNOWN:
            out[task] = TaskSeen(state=state, source="scontrol", seen=now)
        elif state is None and answer is None:
            # "Invalid job id" and no accounting to ask later: the controller has no record of it
            # any more (with accounting, sacct records it soon: UNKNOWN until then)
            out[task] = TaskSeen(state=states.FAILED, source="forgotten", seen=now,
                                 reason=_forgotten_reason(run_dir, job, task))
    return out, never, "+".join(used)


def poll_many(items, source=None):
    """[StatusResult] of every (run_dir, RunRecord) in `items`, asking Slurm only about tasks
    whose end no poll has seen yet: one sacct or squeue call for them all (plus one squeue call
    while sacct lags behind a fresh submission)."""
    before = CALLS["count"]
    caches = [StatusCache.read(run_dir) for run_dir, _ in items]
    pending = [(run_dir, job, task) for (run_dir, record), cache in zip(items, caches) for job in record.jobs
               for task in _expected_tasks(job) if not cache.settled(task)]
    found, never, used = {}, set(), "cache"
    if pending:
        found, never, used = _ask(pending, source, any(record.accounting for _, record in items))
    calls = CALLS["count"] - before
    results = []
    for (run_dir, record), cache in zip(items, caches):
        own = [t for job in record.jobs for t in _expected_tasks(job)]
        asked = any(not cache.settled(t) for t in own)     # in this poll's query (read before the update)
        fresh = {t: found[t] for t in own if t in found}
        if fresh:
            cache.tasks.update(fresh)
            cache.save(run_dir)
        out = []
        for job in record.jobs:
            tasks = {t: cache.tasks[t].state if t in cache.tasks else states.UNKNOWN for t in _expected_tasks(job)}
            status = JobStatus(key=job.key, job_id=job.job_id, name=job.name,
                               state=states.summarize(list(tasks.values())), tasks=tasks)
            reasons = [cache.tasks[t].reason for t in tasks if t in cache.tasks and cache.tasks[t].reason]
            if reasons:
                status.reason = reasons[0]
            if any(t in never for t in tasks):
                status.reason = (f"{NEVER}: a job it waits for (afterok) failed, so it never starts; "
                                 f"`recsys-submit cancel {run_dir}` removes it")
            out.append(status)
        # a job that can never start has ended for a watcher (and the run has failed)
        done = all(all(s in states.TERMINAL or t in never for t, s in job.tasks.items()) for job in out)
        results.append(StatusResult(run_dir=run_dir, jobs=out, done=done, calls=calls,
                                    source=used if asked else "cache", submission=record.state))
    return results
