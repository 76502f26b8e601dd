"""Settling a submission that was interrupted: what a killed `recsys-submit` left behind.

jobs.submit writes jobs.json before anything is submitted and each job's intent (its token)
before `sbatch`; a submitter killed at any moment therefore leaves a record that is still
`submitting`, or holds an intent. Every later look at a run (status, cancel, requeue, a study's
poll and re-run) passes through `load_settled`, which decides what became of it before anything
else is decided, and never by a guess: a submitter that still holds the run's lock is still at
work (nothing is changed; `sbatch` inherits that lock, so it stays held while a killed
submitter's sbatch still runs); otherwise the backend looks the job up by its token
(Backend.find_submitted): found, it joins the record's jobs; provably never accepted, the
record says so (a study may then submit the point again); neither, the record stays as it is
and the point stays unknown. The settled record is saved when the reader may write it.
"""

import os

from .errors import RequestError, StorageError
from .runs.records import PARTIAL, SUBMITTED, SUBMITTING, RunRecord
from .runs.rundir import SUBMIT_LOCK, lock_held
from .schedulers import backend_class


def _unsettled(record):
    return record.intent is not None or (record.state == SUBMITTING and bool(record.planned)
                                         and not record.foreground)


def in_flight(run_dir, record):
    """Whether a submission of `record` may still be under way: unsettled, and its submit.lock
    held (by the submitter or by the `sbatch` it started) or not readable."""
    return _unsettled(record) and backend_class(record.scheduler)().records_intents and \
        lock_held(os.path.join(run_dir, SUBMIT_LOCK)) is not False


def refuse_in_flight(action, run_dir, record):
    """Refuse `action` (cancel, requeue) in one line while a submission of the run may still be
    under way: a job that goes in a moment later would be left running."""
    if in_flight(run_dir, record):
        raise RequestError(f"{action}: run {run_dir}: a submission is still under way (its submitter or its "
                           f"sbatch holds {SUBMIT_LOCK}), so a job may still go in; nothing done, {action} again "
                           "once it ended")


def settle(run_dir, record):
    """`record` (a RunRecord of `run_dir`) with an interrupted submission settled; saved when
    something was learnt and the file can be written."""
    if not _unsettled(record):
        return record
    backend = backend_class(record.scheduler)()
    if not backend.records_intents or lock_held(os.path.join(run_dir, SUBMIT_LOCK)) is not False:
        return record
    changed = False
    if record.intent is not None:
        intent = record.intent
        verdict, detail = backend.find_submitted(run_dir, intent)
        if verdict == "submitted":
            intent.job_id = detail
            record.jobs.append(intent)
            record.intent = None
            record.uncertain = False
            _after(record, f"job {intent.key!r} went in as job {detail} (found by its token after the "
                           "submission was interrupted)")
            changed = True
        elif verdict == "absent":
            record.intent = None
            record.uncertain = False
            _after(record, f"job {intent.key!r} was not submitted: {detail}")
            changed = True
        else:
            return record        # nothing can be told now: the point stays unknown, never resubmitted
    elif record.state == SUBMITTING:
        missing = _never_submitted(record)
        _after(record, f"job {missing[0]!r} was not submitted (the submission ended before its "
                       "intent was recorded)" if missing else "")
        changed = True
    if changed:
        try:
            record.save()
        except (StorageError, OSError):
            pass    # a reader without write access: the next look settles it again, the same way
    return record


def _never_submitted(record):
    done = {j.key for j in record.jobs}
    return [k for k in record.planned if k not in done]


def _after(record, what):
    """The record's state once its last intent is settled: SUBMITTED when every planned job went
    in, else PARTIAL with a line saying what did not."""
    if record.state != SUBMITTING:
        if what:
            record.error = f"{record.error}; settled: {what}" if record.error else what
        return
    missing = _never_submitted(record)
    if not missing:
        record.state = SUBMITTED
        return
    went = ", ".join(f"{j.key}={j.job_id}" for j in record.jobs) or "none"
    record.state = PARTIAL
    record.error = (f"submission interrupted: {what}; never submitted: {', '.join(missing)}; submitted: "
                    f"{went}; run dir {record.run_dir}")


def load_settled(run_dir):
    """RunRecord.load(run_dir), settled (see the module doc)."""
    return settle(run_dir, RunRecord.load(run_dir))
