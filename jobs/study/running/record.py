"""A study directory's records and one poll of its points: study.json (a typed, versioned
StudyRecord: every point and the run directories of its attempts), results.json (every point's
state, summary and failure reason, rewritten whenever the study is polled), what a point is from
its latest attempt, and the progress line. What submits points (jobs.study.running.run) and what
watches or analyses a study (jobs.study.running.watch, jobs.study.analysis) all read a study
through this module.

A poll of the whole study is one jobs.status.poll_many call (one Slurm call). A requeued job
keeps its job id and run, so it counts once. A job Slurm has not reported yet is UNKNOWN, never
failed.
"""

import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from jobs import states
from jobs.errors import RequestError, ResultsNotSaved, StorageError
from jobs.runs import enginelog, rundir
from jobs.runs.atomic import write_json
from jobs.runs.records import SUBMITTING, Record, RunRecord, read_record, resolved_path, typed_fields
from jobs.slurmtime import elapsed_clock
from jobs.status import poll_many

from ..spec import is_study_dir
from . import allocation


STUDY_VERSION = 1
# what a point is, from its latest attempt; UNKNOWN: Slurm has not reported its job yet (or its
# submission may or may not have gone in): neither active nor failed, and never resubmitted
DONE, RUNNING, PENDING, FAILED, MISSING, UNKNOWN = "done", "running", "pending", "failed", "missing", "unknown"
POINT_STATES = (DONE, RUNNING, PENDING, UNKNOWN, FAILED, MISSING)


@dataclass
class PointRecord(Record):
    """One point of a study and the run directories of its attempts (oldest first)."""

    id: str
    nodes: int
    gpus_per_node: int
    gpus: int
    batch_per_gpu: int
    global_batch: int
    variant: Dict[str, Any]
    variant_label: str
    repeat: int
    runs: List[str] = field(default_factory=list)
    # run dir of an attempt that ran in a study allocation -> the allocation's run dir
    allocation: Dict[str, str] = field(default_factory=dict)
    # run dir of an attempt -> the sha256 of the study's frozen code it ran (jobs.study.running.frozen)
    code: Dict[str, str] = field(default_factory=dict)
    # run dir of an attempt -> the content sha256 of the study's frozen profile it ran with
    profile: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_point(cls, point):
        data = point.to_dict()
        data.pop("engine_args")
        return cls(**data)

    def add_attempt(self, run_dir, study):
        """A new attempt's run dir, with the study's frozen code and profile it runs (`study`:
        the StudyRecord)."""
        self.runs.append(run_dir)
        if study.code:
            self.code[run_dir] = study.code["sha256"]
        if study.profile_copy:
            self.profile[run_dir] = study.profile_copy["sha256"]


@dataclass
class StudyRecord(Record):
    """study.json."""

    name: str
    study_dir: str
    profile: str
    profile_path: Optional[str]
    scheduler: str
    spec: Dict[str, Any]
    created: float
    points: List[PointRecord] = field(default_factory=list)
    code: Optional[Dict[str, Any]] = None       # the frozen code its points run (jobs.study.running.frozen.freeze)
    # refreshes: from, to (code), profile_from, profile_to (profile), at
    code_changes: List[Dict[str, Any]] = field(default_factory=list)
    profile_copy: Optional[Dict[str, Any]] = None   # the frozen profile (jobs.study.running.frozen.freeze_profile)
    version: int = STUDY_VERSION

    def save(self, durable=False):
        """`durable`: flushed to disk first (a point's run dir recorded before its sbatch). Paths are
        written absolute, with the study's own `study_dir`: load finds them again after a move."""
        write_json(os.path.join(self.study_dir, "study.json"), self.to_dict(), durable=durable)

    @classmethod
    def load(cls, study_dir):
        try:
            data = read_record(os.path.join(study_dir, "study.json"), STUDY_VERSION, kind="study")
        except OSError as exc:
            raise RequestError(f"study: {study_dir!r} is not a study directory ({exc.strerror})") from None
        path = os.path.join(study_dir, "study.json")
        values = typed_fields(cls, data, path)
        values["points"] = [typed_fields(PointRecord, p, path, "points[]") for p in data.get("points", [])]
        here = os.path.abspath(study_dir)       # the directory may have moved: paths inside it follow
        _study_paths(values, lambda p: resolved_path(p, here, values.get("study_dir")))
        values["points"] = [PointRecord(**p) for p in values["points"]]
        values["study_dir"] = here
        rundir.keep_group(here)     # what a status or report of the owner writes stays the group's to read
        return cls(**values)


def _study_paths(data, fix):
    """Pass every path inside the study that study.json holds (a point's run dirs, its
    allocations' run dirs, the frozen code's directory) through `fix`, in place."""
    for point in data.get("points", []):
        point["runs"] = [fix(r) for r in point.get("runs", [])]
        point["allocation"] = {fix(k): fix(v) for k, v in point.get("allocation", {}).items()}
        for key in ("code", "profile"):
            point[key] = {fix(k): v for k, v in point.get(key, {}).items()}
    if isinstance(data.get("code"), dict) and isinstance(data["code"].get("dir"), str):
        data["code"] = dict(data["code"], dir=fix(data["code"]["dir"]))


@dataclass
class PointStatus(Record):
    """A point's state from its latest attempt."""

    id: str
    state: str                      # done | running | pending | unknown | failed | missing
    job_state: Optional[str]        # the scheduler's word (COMPLETED, CANCELLED, ...)
    run_dir: Optional[str]
    job_id: Optional[str]
    attempts: int
    summary: Optional[Dict[str, Any]] = None
    reason: Optional[str] = None


@dataclass
class StudyStatus(Record):
    """One poll of a study."""

    study_dir: str
    points: List[PointStatus]
    counts: Dict[str, int]
    done: bool                      # nothing pending, running or unknown (failed and missing points may remain)
    calls: int                      # Slurm commands this poll issued
    elapsed_s: float                # since the study was created
    submitting: Optional[bool] = None   # a `study run` held run.lock (watch asks; None: not asked)


def default_study_dir(spec, runs_dir=None, profile=None):
    return os.path.join(runs_dir or rundir.default_runs_dir(profile), f"study-{spec.name}")


def find_study(study=None, runs_dir=None):
    """A study argument: a path, a name under the runs dir (with or without `study-`), or
    (None) the newest study there."""
    runs_dir = runs_dir or rundir.default_runs_dir()
    if study:
        for candidate in (study, os.path.join(runs_dir, study), os.path.join(runs_dir, f"study-{study}")):
            if is_study_dir(candidate):
                return os.path.abspath(candidate)
        raise RequestError(f"study: {study!r} is not a study directory (no study.json; runs dir {runs_dir})")
    if os.path.isdir(runs_dir):
        found = [os.path.join(runs_dir, d) for d in os.listdir(runs_dir) if is_study_dir(os.path.join(runs_dir, d))]
        if found:
            return os.path.abspath(max(found, key=lambda d: os.path.getmtime(os.path.join(d, "study.json"))))
    raise RequestError(f"study: no studies under {runs_dir}; give a study directory")


def _classify(job_status):
    """(point state, reason) of a point's latest job. Only a state Slurm reported as terminal
    fails a point; a job Slurm has not reported yet is UNKNOWN."""
    state = job_status.state
    if state == states.COMPLETED:
        if job_status.summary is None:
            return FAILED, "COMPLETED but its engine log has no summary record"
        return DONE, None
    if state in states.TERMINAL:
        return FAILED, job_status.reason or state
    if state in (states.PENDING, states.REQUEUED, states.SUSPENDED):
        return PENDING, None
    if state == states.RUNNING:
        return RUNNING, None
    return UNKNOWN, f"{state}: Slurm has not reported job {job_status.job_id} yet"


def _in_allocation(job, run_dir, alloc_dir=None):
    """(point state, reason, summary, job state) of an attempt that ran in a study allocation (`job`:
    the allocation's status; `alloc_dir`: its run dir): from the point's own exit record while the
    allocation lives on. A point that ran out of time (its step's own limit, or the allocation's)
    is failed as TIMEOUT with the phase it was in; a point the allocation's time limit did not
    reach is missing again (not failed: nothing of it ran), and one any other end of the
    allocation (node failure, preemption, scancel) cut short is failed; the next `run` submits
    them again."""
    seen = allocation.progress(run_dir, job.key, job.job_id)
    code = seen.get("exit_code", "").strip()
    if "timed_out" in seen:
        return FAILED, allocation.timeout_reason(run_dir, job.key, job.job_id, seen), None, states.TIMEOUT
    if code == "0":
        summary = enginelog.summary(enginelog.job_logs(run_dir, job.key, [job.job_id]))
        if summary is None:
            return FAILED, "exited 0 but its engine log has no summary record", None, job.state
        return DONE, None, summary, job.state
    if code:
        return FAILED, enginelog.failure_reason(run_dir, job.key, f"{states.FAILED} (exit {code})"), None, job.state
    timed_out = job.state == states.TIMEOUT or (
        alloc_dir is not None and "time_limit" in allocation.progress(alloc_dir, allocation.KEY, job.job_id))
    if timed_out and "start" not in seen:
        return MISSING, (f"not reached: its allocation (job {job.job_id}) ended at its time limit before the point "
                         "began; the next `study run` submits it"), None, job.state
    if job.state in states.TERMINAL:
        when = "while it ran" if "start" in seen else "before it began"
        return FAILED, f"its allocation (job {job.job_id}) ended {job.state} {when}", None, job.state
    if job.state == states.RUNNING:
        return (RUNNING if "start" in seen else PENDING), None, None, job.state
    if job.state in (states.PENDING, states.REQUEUED, states.SUSPENDED):
        return PENDING, None, None, job.state
    return UNKNOWN, f"{job.state}: Slurm has not reported allocation job {job.job_id} yet", None, job.state


def _without_job(run_dir):
    """(point state, reason) of an attempt whose run holds no job: FAILED only when its
    submission provably never reached Slurm (sbatch refused it); an interrupted or uncertain
    submission is UNKNOWN, so it is never submitted twice."""
    try:
        run = RunRecord.load(run_dir)
    except RequestError as exc:
        return UNKNOWN, f"its run record cannot be read ({exc})"
    if run.state == SUBMITTING or run.intent is not None:
        return UNKNOWN, (f"its submission is under way or was interrupted and whether its job went in "
                         f"cannot be told now (`squeue --me -o %i,%k` lists the tokens; its token is in "
                         f"{os.path.join(run_dir, 'jobs.json')}); remove {run_dir} to submit the point "
                         "again once you know")
    if run.uncertain:
        return UNKNOWN, f"{run.error}; remove {run_dir} to submit the point again once you know"
    return FAILED, f"not submitted: {run.error or 'its run has no job'}"


def poll(record):
    """A StudyStatus of every point (one poll_many call for all latest attempts); results.json
    is rewritten with it."""
    latest = [(p, p.runs[-1]) for p in record.points if p.runs]
    results = dict(zip([p.id for p, _ in latest], poll_many([r for _, r in latest]))) if latest else {}
    calls = max([r.calls for r in results.values()] or [0])
    out = []
    for point in record.points:
        result = results.get(point.id)
        if result is None:
            out.append(PointStatus(id=point.id, state=MISSING, job_state=None, run_dir=None, job_id=None,
                                   attempts=0))
            continue
        job = result.jobs[0] if result.jobs else None
        if job is None:
            (state, reason), job_state = _without_job(result.run_dir), None
        elif result.run_dir in point.allocation:
            state, reason, job.summary, job_state = _in_allocation(job, result.run_dir,
                                                                   point.allocation[result.run_dir])
        else:
            (state, reason), job_state = _classify(job), job.state
        out.append(PointStatus(id=point.id, state=state, job_state=job_state, run_dir=result.run_dir,
                               job_id=job.job_id if job else None, attempts=len(point.runs),
                               summary=job.summary if job else None, reason=reason))
    counts = counts_of(out)
    status = StudyStatus(study_dir=record.study_dir, points=out, counts=counts,
                         done=active(counts) == 0, calls=calls,
                         elapsed_s=round(time.time() - record.created, 1))
    write_results(record, status)
    return status


def counts_of(points):
    """{point state: how many} of [PointStatus], every state present."""
    return {k: sum(1 for p in points if p.state == k) for k in POINT_STATES}


def active(counts):
    """Points that may still be queued or running (UNKNOWN included: not known to be gone)."""
    return counts[RUNNING] + counts[PENDING] + counts[UNKNOWN]


def write_results(record, status):
    """results.json: the study's points as last polled (atomically). Best effort: reading a
    study must not need writing it (another user, a read-only mount, a full disk), so a write
    that fails is a ResultsNotSaved warning and the caller goes on with the fresh status."""
    try:
        write_json(os.path.join(record.study_dir, "results.json"),
                   {"version": STUDY_VERSION, "study": record.name, "profile": record.profile,
                    "updated": round(time.time(), 3),
                    "points": [dict(p.to_dict(), **{k: v for k, v in pr.to_dict().items() if k != "runs"})
                               for p, pr in zip(status.points, record.points)]})
    except StorageError as exc:
        warnings.warn(str(exc), ResultsNotSaved, stacklevel=2)


def progress_line(status, width=30):
    """`[#########-----]  3/8 done  1 running  3 pending  1 failed  elapsed 0:00:42`."""
    total = len(status.points) or 1
    finished = status.counts[DONE] + status.counts[FAILED]
    filled = int(width * finished / total)
    parts = [f"[{'#' * filled}{'-' * (width - filled)}]", f"{status.counts[DONE]}/{total} done"]
    for key in (RUNNING, PENDING, UNKNOWN, FAILED, MISSING):
        if status.counts.get(key):
            parts.append(f"{status.counts[key]} {key}")
    if status.submitting:
        parts.append("`study run` submitting")
    parts.append(f"elapsed {elapsed_clock(status.elapsed_s)}")
    return "  ".join(parts)
