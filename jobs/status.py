"""Status of every job of a run (or of many runs at once, a study's points): poll/watch through
the run's backend, and the Slurm backend's poll, which makes ONE Slurm call per poll however
many runs it covers. Finished jobs carry their engine summary (jobs.enginelog).

Source per Slurm poll: `sacct` for all unfinished jobs when the cluster has accounting (recorded at
submission from `scontrol show config`), else one `squeue` call; a job that squeue no longer
knows is settled from the exit record its batch script wrote (logs/<key>-<id>.info), and only
when that is missing too from `scontrol show job`. Terminal states are cached in status.json,
so finished jobs are never asked about again. Parsing of sacct output and of array job ids
(`123_[4-9%2]`) is submitit's (SlurmInfoWatcher.read_info, read_job_id).
"""

import os
import time

from . import runs as runs_mod
from . import slurmcli
from .slurmcli import TERMINAL

CALLS = {"count": 0}    # Slurm commands issued by this module (the benchmark reads it)


def _call(args):
    CALLS["count"] += 1
    return slurmcli.run(args, timeout=60)


def _base_state(state):
    return (state or "UNKNOWN").split()[0].rstrip("+").upper()


def _expected_tasks(job):
    if job.array_size:
        return [f"{job.job_id}_{i}" for i in range(job.array_size)]
    return [job.job_id]


def _expand(job_id):
    from submitit.slurm.slurm import read_job_id

    out = []
    for parts in read_job_id(job_id):
        if len(parts) == 3:
            out += [f"{parts[0]}_{i}" for i in range(int(parts[1]), int(parts[2]) + 1)]
        else:
            out.append("_".join(parts))
    return out


def query_sacct(ids):
    """{task id: state} from one sacct call; None when sacct cannot answer."""
    from submitit.slurm.slurm import SlurmInfoWatcher

    proc = _call(["sacct", "-X", "--parsable2", "-o", "JobID,State,ExitCode,NodeList",
                  "-j", ",".join(ids)])
    if proc.returncode != 0:
        return None
    info = SlurmInfoWatcher().read_info(proc.stdout)
    return {task: _base_state(stats.get("State")) for task, stats in info.items()}


NEVER = "DependencyNeverSatisfied"     # squeue's reason for a job whose afterok job failed


def query_squeue(ids, never=None):
    """{task id: state} from one squeue call (jobs it no longer knows are absent); the pending
    tasks that can never start (an afterok job failed) are added to the set `never`."""
    proc = _call(["squeue", "-h", "-r", "--states=all", "-o", "%i|%T|%r", "-j", ",".join(ids)])
    if proc.returncode != 0 and "invalid job id" not in (proc.stderr or "").lower():
        raise slurmcli.SlurmCommandError(f"squeue: {slurmcli.first_line(proc.stderr)}")
    states = {}
    for line in proc.stdout.splitlines():
        job_id, _, rest = line.strip().partition("|")
        state, _, reason = rest.partition("|")
        if job_id:
            for task in _expand(job_id):
                states[task] = _base_state(state)
                if never is not None and states[task] == "PENDING" and reason.strip() == NEVER:
                    never.add(task)
    return states


def _from_info(run_dir, job, task):
    """State from the batch script's own record (exit_code=... at the end)."""
    key = job.key
    path = os.path.join(run_dir, "logs", f"{key}-{task}.info")
    try:
        with open(path) as handle:
            values = dict(line.rstrip("\n").split("=", 1) for line in handle if "=" in line)
    except OSError:
        return None
    if "exit_code" in values:
        return "COMPLETED" if values["exit_code"].strip() == "0" else "FAILED"
    return None


def _from_scontrol(task):
    proc = _call(["scontrol", "show", "job", task])
    for word in proc.stdout.split():
        if word.startswith("JobState="):
            return _base_state(word.split("=", 1)[1])
    return None


def poll(run_dir, source=None):
    """One status poll of a run (a jobs.records.StatusResult), asked of the run's backend;
    each finished job carries its engine summary (or, failed, the reason)."""
    return poll_many([run_dir], source)[0]


def poll_many(run_dirs, source=None):
    """One poll of several runs (a study's points): runs of one backend are asked together,
    so a Slurm poll is one Slurm call however many runs there are. [StatusResult] in order."""
    from .backends import backend_class

    records = [runs_mod.load_run(run_dir) for run_dir in run_dirs]
    results = [None] * len(records)
    by_scheduler = {}
    for index, record in enumerate(records):
        by_scheduler.setdefault(record.scheduler, []).append(index)
    for scheduler, indices in by_scheduler.items():
        items = [(run_dirs[i], records[i]) for i in indices]
        for index, result in zip(indices, backend_class(scheduler)().poll_many(items, source)):
            results[index] = result
    for result in results:
        attach_summaries(result)
    return results


def attach_summaries(result):
    """Fill each terminal job's `summary` from its engine log and a failed job's `reason`."""
    from . import enginelog

    for job in result.jobs:
        states = list(job.tasks.values())
        if not states or not all(s in TERMINAL for s in states):
            continue
        if len(states) == 1:
            job.summary = enginelog.summary(enginelog.job_logs(result.run_dir, job.key))
        bad = sorted({s for s in states if s != "COMPLETED"})
        if bad:
            job.reason = enginelog.failure_reason(result.run_dir, job.key, "/".join(bad))
    return result


def poll_slurm(run_dir, record, source=None):
    """SlurmBackend.poll: one sacct or squeue call for every unfinished job of the run."""
    return poll_slurm_many([(run_dir, record)], source)[0]


def poll_slurm_many(items, source=None):
    """SlurmBackend.poll_many: ONE sacct or squeue call for every unfinished job of every
    (run_dir, RunRecord) in `items`; terminal states are cached per run in status.json."""
    from .records import JobStatus, StatusResult

    before = CALLS["count"]
    caches = []
    pending = []
    for run_dir, record in items:
        try:
            cache = runs_mod.read_json(os.path.join(run_dir, "status.json"))
        except (OSError, ValueError):
            cache = {}
        caches.append(cache)
        pending += [(run_dir, j) for j in record.jobs
                    if not all(cache.get(t) in TERMINAL for t in _expected_tasks(j))]
    states, never = {}, set()
    used = "cache"
    if pending:
        ids = [j.job_id for _, j in pending]
        source = source or os.environ.get("RECSYS_STATUS_SOURCE") or \
            ("sacct" if any(r.accounting for _, r in items) else "squeue")
        answer = query_sacct(ids) if source == "sacct" else None
        used = "sacct"
        if answer is None:
            answer, used = query_squeue(ids, never), "squeue"
        for run_dir, job in pending:
            for task in _expected_tasks(job):
                state = answer.get(task)
                if state is None and used == "squeue":
                    state = _from_info(run_dir, job, task) or _from_scontrol(task)
                states[task] = state or "UNKNOWN"
    calls = CALLS["count"] - before
    results = []
    for (run_dir, record), cache in zip(items, caches):
        own = [t for j in record.jobs for t in _expected_tasks(j)]
        known = dict(cache)
        known.update({t: states[t] for t in own if t in states})
        runs_mod.write_json(os.path.join(run_dir, "status.json"),
                            {t: s for t, s in known.items() if s in TERMINAL})
        out = []
        for job in record.jobs:
            tasks = {t: known.get(t, "UNKNOWN") for t in _expected_tasks(job)}
            status = JobStatus(key=job.key, job_id=job.job_id, name=job.name,
                               state=summarize(list(tasks.values())), tasks=tasks)
            if any(t in never for t in tasks):
                status.reason = (f"{NEVER}: a job it waits for (afterok) failed, so it never starts; "
                                 f"`recsys-submit cancel {run_dir}` removes it")
            out.append(status)
        # a job that can never start has ended for a watcher (and the run has failed)
        done = all(all(s in TERMINAL or t in never for t, s in j.tasks.items()) for j in out)
        run_used = used if any(t in states for t in own) else "cache"
        results.append(StatusResult(run_dir=run_dir, jobs=out, done=done, calls=calls,
                                    source=run_used, submission=record.state))
    return results


def summarize(states):
    """One word for a job, or counts for an array: 'COMPLETED', '3 RUNNING, 5 PENDING'."""
    if len(states) == 1:
        return states[0]
    counts = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    if len(counts) == 1:
        return f"{len(states)} {states[0]}"
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def poll_until(poll_once, done, on_poll=None, first=None, factor=1.5, ceiling=None, timeout=None):
    """Call `poll_once()` until `done(result)` (or `timeout` s), backing off from `first` to
    `ceiling` seconds between polls (RECSYS_POLL_FIRST / RECSYS_POLL_MAX by default): the one
    polling loop of runs and studies, so neither hammers the controller."""
    first = float(first or os.environ.get("RECSYS_POLL_FIRST", "2"))
    ceiling = float(ceiling or os.environ.get("RECSYS_POLL_MAX", "60"))
    delay, start = first, time.monotonic()
    while True:
        result = poll_once()
        if on_poll:
            on_poll(result)
        if done(result) or (timeout is not None and time.monotonic() - start > timeout):
            return result
        time.sleep(delay)
        delay = min(ceiling, delay * factor)


def watch(run_dir, on_poll=None, first=None, factor=1.5, ceiling=None, timeout=None, outage=None):
    """Poll a run until every job is terminal. A controller that does not answer (restarted,
    overloaded) is waited for, with one line per failed poll on stderr, for up to `outage`
    seconds in a row (RECSYS_WATCH_OUTAGE_S, default 900) before its error is raised."""
    import sys

    outage = float(outage if outage is not None else os.environ.get("RECSYS_WATCH_OUTAGE_S", "900"))
    since = [None]

    def once():
        try:
            result = poll(run_dir)
        except slurmcli.SlurmCommandError as exc:
            now = time.monotonic()
            since[0] = since[0] or now
            if not slurmcli.is_transient(str(exc)) or now - since[0] > outage:
                raise
            print(f"recsys-submit: {exc}; polling again (controller unreachable for {now - since[0]:.0f} s)",
                  file=sys.stderr, flush=True)
            return None
        since[0] = None
        return result

    return poll_until(once, lambda result: result is not None and result["done"],
                      on_poll=(lambda result: result is not None and on_poll(result)) if on_poll else None,
                      first=first, factor=factor, ceiling=ceiling, timeout=timeout)


def run_failed(result):
    return any(s not in ("COMPLETED",) for j in result["jobs"] for s in j["tasks"].values())


def log_files(run_dir, key=None, rank=None):
    """Log files of a run: batch outputs, or per-rank outputs when `rank` is given (which
    files those are is the run's backend's)."""
    from .backends import backend_class

    scheduler = runs_mod.load_run(run_dir).scheduler
    return backend_class(scheduler)().log_files(run_dir, key=key, rank=rank)
