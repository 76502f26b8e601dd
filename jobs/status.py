"""Status of every job of a run (or of many runs at once, a study's points): poll and watch
through the run's backend, which answers in the toolkit's states (jobs.states) and asks its
scheduler as little as it can (Slurm: one call per poll however many runs, jobs.backends.slurm.poll).
Finished jobs carry their engine summary and failed ones the reason (jobs.runs.enginelog).
"""

import os
import re
import sys
import time

from . import states
from .schedulers import backend_class
from .errors import SlurmCommandError
from .polling import poll_until
from .recovery import load_settled
from .runs import enginelog
from .runs.records import RunRecord


def poll(run_dir, source=None):
    """One status poll of a run (a jobs.runs.records.StatusResult), asked of the run's backend;
    each finished job carries its engine summary (or, failed, the reason)."""
    return poll_many([run_dir], source)[0]


def poll_many(run_dirs, source=None):
    """One poll of several runs (a study's points): runs of one backend are asked together,
    so a Slurm poll is one Slurm call however many runs there are. [StatusResult] in order."""
    records = [load_settled(run_dir) for run_dir in run_dirs]    # an interrupted submission settled first
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
    for job in result.jobs:
        task_states = list(job.tasks.values())
        if not task_states or not all(s in states.TERMINAL for s in task_states):
            continue
        if len(task_states) == 1:
            job.summary = enginelog.summary(enginelog.job_logs(result.run_dir, job.key))
        bad = sorted({s for s in task_states if s != states.COMPLETED})
        if bad and not job.reason:      # the backend's own reason (a job Slurm forgot) stands
            hang = enginelog.hang_reason(enginelog.job_logs(result.run_dir, job.key)) if len(task_states) == 1 else None
            if hang:                    # Slurm's FAILED, told apart: the watchdog ended it (recsys.monitoring.watchdog)
                job.state, job.tasks = states.HUNG, {task: states.HUNG for task in job.tasks}
            job.reason = hang or enginelog.failure_reason(result.run_dir, job.key, "/".join(bad))
    return result


def watch(run_dir, on_poll=None, first=None, factor=1.5, ceiling=None, timeout=None, outage=None):
    """Poll a run until every job is terminal. A controller that does not answer (restarted,
    overloaded: the backend marks its error transient) is waited for, with one line per failed
    poll on stderr, for up to `outage` seconds in a row (RECSYS_WATCH_OUTAGE_S, default 900)
    before its error is raised."""
    outage = float(outage if outage is not None else os.environ.get("RECSYS_WATCH_OUTAGE_S", "900"))
    since = [None]

    def once():
        try:
            result = poll(run_dir)
        except SlurmCommandError as exc:
            now = time.monotonic()
            since[0] = since[0] or now
            if not exc.transient or now - since[0] > outage:
                raise
            print(f"recsys-submit: {exc}; polling again (controller unreachable for {now - since[0]:.0f} s)",
                  file=sys.stderr, flush=True)
            return None
        since[0] = None
        return result

    # a job's logs appearing or its engine's summary bring the next poll forward (jobs.polling)
    return poll_until(once, lambda result: result is not None and result["done"],
                      on_poll=(lambda result: result is not None and on_poll(result)) if on_poll else None,
                      first=first, factor=factor, ceiling=ceiling, timeout=timeout,
                      wake=lambda: enginelog.activity([run_dir]))


def run_failed(result):
    """Whether any job of a polled run ended badly (or can never start). A job whose state is
    not known yet has not failed."""
    task_states = [s for j in result["jobs"] for s in j["tasks"].values()]
    ended_badly = any(s in states.TERMINAL and s != states.COMPLETED for s in task_states)
    never_starts = result["done"] and any(s not in states.TERMINAL for s in task_states)
    return ended_badly or never_starts


def log_files(run_dir, key=None, rank=None):
    """Log files of a run: batch outputs, or per-rank outputs when `rank` is given (which
    files those are is the run's backend's)."""
    return backend_class(RunRecord.load(run_dir).scheduler)().log_files(run_dir, key=key, rank=rank)


_METRIC = re.compile(r"^(auc|bce|map_at_\d+|hr_at_\d+|ndcg_at_\d+)$")


def summary_line(summary):
    """A finished job's engine summary record (docs/engine-log.md) as one line: metrics at their
    step, throughput, step time, world size, checkpoint."""
    number = enginelog.number
    parts = []
    metrics = [f"{k} {number(summary, k):.4f}" for k in sorted(summary)
               if _METRIC.match(k) and number(summary, k) is not None]
    if metrics:
        parts.append(", ".join(metrics) + (f" at step {summary['eval_step']}"
                                           if summary.get("eval_step") is not None else ""))
    if number(summary, enginelog.THROUGHPUT) is not None:
        parts.append(f"{number(summary, enginelog.THROUGHPUT):,.0f} samples/s")
    if number(summary, enginelog.STEP_TIME) is not None:
        parts.append(f"{number(summary, enginelog.STEP_TIME):.1f} ms/step")
    if summary.get("world_size") is not None:
        parts.append(f"world size {summary['world_size']}")
    if summary.get("checkpoint"):
        parts.append(f"checkpoint {summary['checkpoint']}")
    return "; ".join(parts)
