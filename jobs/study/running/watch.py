"""Watching a study (`study status --watch`): poll it until no point is pending, running or
unknown and no `study run` holds its lock, and wait for a study that a `study run` started beside
the watch has not written yet."""

import os
import time

from jobs.errors import RequestError
from jobs.polling import poll_until
from jobs.runs import enginelog, rundir

from .record import MISSING, PENDING, RUNNING, StudyRecord, find_study, poll


# seconds `study status --watch` waits, points missing and no `study run` holding the lock, for
# one that is starting (RECSYS_STUDY_START_GRACE_S overrides)
START_GRACE_S = 30.0


def lock_held(study_dir):
    """Whether a `study run` holds the study's lock (study_dir/run.lock) now, so more points may
    still be submitted: rundir.lock_held (True, False or None: it cannot be read)."""
    return rundir.lock_held(os.path.join(study_dir, "run.lock"))


def find_study_to_watch(study=None, runs_dir=None, grace=None):
    """find_study for a watch: a named study that does not exist yet is looked for again for up
    to `grace` seconds (start_grace()), since `study run NAME & study status NAME --watch` may
    start the watch before the run has written study.json."""
    deadline = time.monotonic() + (start_grace() if grace is None else grace)

    def attempt():
        try:
            return find_study(study, runs_dir)
        except RequestError:
            if not study or time.monotonic() > deadline:
                raise
            return None

    return poll_until(attempt, lambda found: found is not None, first=0.2, ceiling=1.0)


def start_grace():
    """Seconds `watch` waits, with points missing and no `study run` holding the lock, for one
    that is starting (`study run ... & study status --watch`): RECSYS_STUDY_START_GRACE_S."""
    return float(os.environ.get("RECSYS_STUDY_START_GRACE_S", START_GRACE_S))


def watch(study_dir, on_poll=None, first=None, ceiling=None, timeout=None, grace=None):
    """Poll a study until it is finished: no point pending, running or unknown, no `study run`
    holding its lock (a capped run submits point after point, the later ones missing meanwhile)
    and no point missing. Points missing while no `study run` holds the lock end the watch once
    they have been so for `grace` seconds (start_grace()); the last StudyStatus still counts them
    missing, so the caller can say who submits them. The study record is read again at every
    poll: a running `study run` adds attempts and points to it."""
    grace = start_grace() if grace is None else grace
    unattended = {"since": None}    # when points were first seen missing with nobody submitting
    waiting = {"run_dirs": []}      # the run dirs of the points last seen pending or running

    def once():
        held = lock_held(study_dir)     # before the record: a run that let go has saved its points
        status = poll(StudyRecord.load(study_dir))
        status.submitting = held
        waiting["run_dirs"] = [p.run_dir for p in status.points if p.run_dir and p.state in (RUNNING, PENDING)]
        if held or not status.counts[MISSING]:
            unattended["since"] = None
        elif unattended["since"] is None:
            unattended["since"] = time.monotonic()
        return status

    def finished(status):
        if status.submitting or not status.done:
            return False
        return not status.counts[MISSING] or time.monotonic() - unattended["since"] >= grace

    # a point's job starting or its engine ending brings the next poll forward (jobs.polling)
    return poll_until(once, finished, on_poll=on_poll, first=first, ceiling=ceiling, timeout=timeout,
                      wake=lambda: enginelog.activity(waiting["run_dirs"]))
