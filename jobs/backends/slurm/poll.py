"""The Slurm backend's status poll: ONE Slurm call per poll, however many runs it covers.

Source per poll: `sacct` for all unfinished jobs when the cluster has accounting (recorded at
submission from `scontrol show config`), else one `squeue` call; a job that squeue no longer
knows is settled from the exit record its batch script wrote (logs/<key>-<id>.info), and only
when that is missing too from `scontrol show job`. Terminal states are cached per run in
status.json, so finished jobs are never asked about again.
"""

import os

from jobs import states
from jobs.runs.atomic import read_json, write_json
from jobs.runs.records import JobStatus, StatusResult

from .queries import CALLS, NEVER, query_sacct, query_scontrol, query_squeue


def _expected_tasks(job):
    if job.array_size:
        return [f"{job.job_id}_{i}" for i in range(job.array_size)]
    return [job.job_id]


def _from_info(run_dir, job, task):
    """State from the batch script's own record (exit_code=... at the end)."""
    path = os.path.join(run_dir, "logs", f"{job.key}-{task}.info")
    try:
        with open(path) as handle:
            values = dict(line.rstrip("\n").split("=", 1) for line in handle if "=" in line)
    except OSError:
        return None
    if "exit_code" in values:
        return states.COMPLETED if values["exit_code"].strip() == "0" else states.FAILED
    return None


def _read_cache(run_dir):
    try:
        return read_json(os.path.join(run_dir, "status.json"))
    except (OSError, ValueError):
        return {}


def poll_many(items, source=None):
    """[StatusResult] of every (run_dir, RunRecord) in `items`: ONE sacct or squeue call for every
    unfinished job of them all; terminal states are cached per run in status.json."""
    before = CALLS["count"]
    caches = [_read_cache(run_dir) for run_dir, _ in items]
    pending = [(run_dir, job) for (run_dir, record), cache in zip(items, caches) for job in record.jobs
               if not all(cache.get(t) in states.TERMINAL for t in _expected_tasks(job))]
    found, never = {}, set()
    used = "cache"
    if pending:
        ids = [job.job_id for _, job in pending]
        source = source or os.environ.get("RECSYS_STATUS_SOURCE") or \
            ("sacct" if any(record.accounting for _, record in items) else "squeue")
        answer = query_sacct(ids) if source == "sacct" else None
        used = "sacct"
        if answer is None:
            answer, used = query_squeue(ids, never), "squeue"
        for run_dir, job in pending:
            for task in _expected_tasks(job):
                state = answer.get(task)
                if state is None and used == "squeue":
                    state = _from_info(run_dir, job, task) or query_scontrol(task)
                found[task] = state or states.UNKNOWN
    calls = CALLS["count"] - before
    results = []
    for (run_dir, record), cache in zip(items, caches):
        own = [t for job in record.jobs for t in _expected_tasks(job)]
        known = dict(cache)
        known.update({t: found[t] for t in own if t in found})
        write_json(os.path.join(run_dir, "status.json"), {t: s for t, s in known.items() if s in states.TERMINAL})
        out = []
        for job in record.jobs:
            tasks = {t: known.get(t, states.UNKNOWN) for t in _expected_tasks(job)}
            status = JobStatus(key=job.key, job_id=job.job_id, name=job.name,
                               state=states.summarize(list(tasks.values())), tasks=tasks)
            if any(t in never for t in tasks):
                status.reason = (f"{NEVER}: a job it waits for (afterok) failed, so it never starts; "
                                 f"`recsys-submit cancel {run_dir}` removes it")
            out.append(status)
        # a job that can never start has ended for a watcher (and the run has failed)
        done = all(all(s in states.TERMINAL or t in never for t, s in job.tasks.items()) for job in out)
        run_used = used if any(t in found for t in own) else "cache"
        results.append(StatusResult(run_dir=run_dir, jobs=out, done=done, calls=calls,
                                    source=run_used, submission=record.state))
    return results
