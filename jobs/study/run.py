"""A study directory and its life: submit the points, poll them, resume what is missing or failed.

Layout: <runs_dir>/study-<name>/ with study.yaml (the spec as validated), study.json (a typed,
versioned StudyRecord: every point and the run directories of its attempts, rewritten
atomically with each point's run directory before its job is submitted), points/ (one
ordinary run directory per attempt, made by the orchestrator, jobs.submit), results.json (every
point's state, summary and failure reason, rewritten whenever the study is polled) and run.lock
(held by the one `run` that may submit at a time). Since a point's run directory is in
study.json before its `sbatch` (jobs.submit's on_run_dir), a `run` killed at any moment leaves
every job it may have submitted findable, and the next look settles it by the job's token
(jobs.recovery). The study directory is private to its owner (or the profile's runs_group). A
poll of the whole study is one jobs.status.poll_many call (one Slurm call). A requeued job
keeps its job id and run, so it counts once. A point is resubmitted only when Slurm reported
its latest job in a terminal state other than COMPLETED, or its submission provably never
reached Slurm; a job Slurm has not reported yet is UNKNOWN, never failed, never resubmitted.
Points go in by rounds of repeats, one at a time on a profile whose nodes share hardware.
"""

import contextlib
import fcntl
import os
import queue
import socket
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from jobs import states
from jobs.schedulers import backend_for, capabilities
from jobs.errors import RequestError, ResultsNotSaved, SlurmCommandError, StorageError, SubmitError
from jobs.polling import poll_until
from jobs.runs import enginelog, rundir
from jobs.runs.atomic import storage_error, write_json, write_text
from jobs.runs.records import SUBMITTING, Record, RunRecord, read_record, resolved_path, typed_fields
from jobs.slurmtime import elapsed_clock
from jobs.status import poll_many
from jobs.submit import load, submit
from slurm.common.atomicfile import fsync_dir

from . import allocation, frozen
from .spec import StudyError, expand, is_study_dir, spec_yaml

STUDY_VERSION = 1
# what a point is, from its latest attempt; UNKNOWN: Slurm has not reported its job yet (or its
# submission may or may not have gone in): neither active nor failed, and never resubmitted
DONE, RUNNING, PENDING, FAILED, MISSING, UNKNOWN = "done", "running", "pending", "failed", "missing", "unknown"
POINT_STATES = (DONE, RUNNING, PENDING, UNKNOWN, FAILED, MISSING)
# spec keys that a study may change between runs: they add points (or set a limit), never
# change what an existing point measures
EXTENDABLE = ("gpus", "points", "variants", "repeats", "time", "description", "placement")
# the Slurm job name every study point (and study allocation) shares on a profile whose nodes share
# hardware, with --dependency=singleton: one at a time across all studies of a user on the cluster
SHARED_NAME = "recsys-study-shared"
# squeue's reasons for a pending job that cannot start as it is: a job of the shared name that
# waits so blocks every later study of its user (the singleton) until it is released or cancelled
STUCK_REASONS = ("DependencyNeverSatisfied", "JobHeldUser", "JobHeldAdmin", "BadConstraints",
                 "PartitionDown", "PartitionInactive")
# seconds between two identical progress lines while `run` waits for a free slot
WAITING_LINE_S = 30
# seconds `study status --watch` waits, points missing and no `study run` holding the lock, for
# one that is starting (RECSYS_STUDY_START_GRACE_S overrides)
START_GRACE_S = 30.0


def _log(message):
    print(f"recsys-submit: {message}", file=sys.stderr)


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
    # run dir of an attempt -> the sha256 of the study's frozen code it ran (jobs.study.frozen)
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
    code: Optional[Dict[str, Any]] = None       # the frozen code its points run (jobs.study.frozen.freeze)
    # refreshes: from, to (code), profile_from, profile_to (profile), at
    code_changes: List[Dict[str, Any]] = field(default_factory=list)
    profile_copy: Optional[Dict[str, Any]] = None   # the frozen profile (jobs.study.frozen.freeze_profile)
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
    counts = _counts(out)
    status = StudyStatus(study_dir=record.study_dir, points=out, counts=counts,
                         done=active(counts) == 0, calls=calls,
                         elapsed_s=round(time.time() - record.created, 1))
    write_results(record, status)
    return status


def _counts(points):
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


def open_study(spec, profile, study_dir, points=None):
    """The StudyRecord of `study_dir`: created for a new study, loaded (and checked to be the
    same spec and profile) for an existing one, with the spec's points merged in."""
    points = points if points is not None else expand(spec, profile)    # every check before anything exists
    if is_study_dir(study_dir):
        record = StudyRecord.load(study_dir)
        if record.profile != profile.name:
            raise StudyError(f"--profile: study {study_dir} runs on profile {record.profile!r}, not "
                             f"{profile.name!r}")
        _check_extension(record.spec, spec, study_dir)
        if record.spec != spec.to_dict():       # points, variants or repeats added: the spec grows
            record.spec = spec.to_dict()
            write_text(os.path.join(study_dir, "study.yaml"), spec_yaml(spec))
    else:
        try:
            os.makedirs(os.path.join(study_dir, "points"), exist_ok=True)
            fsync_dir(os.path.dirname(os.path.abspath(study_dir)))    # its entry outlives a crash of the host
        except OSError as exc:
            raise RequestError(f"--runs-dir: cannot create {study_dir!r}: {exc.strerror}") from None
        write_text(os.path.join(study_dir, "study.yaml"), spec_yaml(spec))
        record = StudyRecord(name=spec.name, study_dir=os.path.abspath(study_dir), profile=profile.name,
                             profile_path=profile.path, scheduler=backend_for(profile).scheduler,
                             spec=spec.to_dict(), created=round(time.time(), 3))
    known = {p.id for p in record.points}
    record.points += [PointRecord.from_point(p) for p in points if p.id not in known]
    record.save()
    return record, {p.id: p for p in points}


def _check_extension(recorded, spec, study_dir):
    """A spec may add points, variant values or repeats to an existing study; a change to
    anything a point measures is refused, naming the key."""
    new = spec.to_dict()
    for key in sorted(set(recorded) | set(new)):
        if key in EXTENDABLE or recorded.get(key) == new.get(key):
            continue
        raise StudyError(f"{spec.source}: {key}: study {study_dir} was run with {key} {recorded.get(key)!r}, "
                         f"not {new.get(key)!r}; a study can only gain points, variant values or repeats "
                         "(give the study another name to measure something else)")
    old_keys, new_keys = set(recorded.get("variants") or {}), set(new.get("variants") or {})
    if old_keys != new_keys:
        key = sorted(old_keys ^ new_keys)[0]
        raise StudyError(f"{spec.source}: variants.{key}: study {study_dir} was run with variants "
                         f"{sorted(old_keys) or 'none'}, not {sorted(new_keys) or 'none'}: a new variant "
                         "key changes every point; add values to the existing keys, or give the study "
                         "another name")


def run(spec, profile, runs_dir=None, study_dir=None, max_concurrent=None, log=_log,
        poll_first=None, poll_max=None, placement=None, nodes=None, refresh_code=False, exclude=None,
        overlap_other_users=False):
    """Submit every point of `spec` that is missing or failed (all of them for a new study), in
    rounds (every point's first repeat, then every point's second ...), keeping at most
    `max_concurrent` points queued or running: by default one on a profile whose nodes share
    hardware (points measured alone), else no cap. Returns (StudyRecord, [ids of the points
    submitted now]). Bad input raises StudyError/RequestError before anything exists; a second
    `run` of a study while one is submitting is refused (nothing is ever submitted twice).
    `placement` ("allocation", else the spec's `placement`): every point submitted now runs in one
    allocation of `nodes` nodes (default: the largest point's) without the `exclude` ones (a Slurm
    host list, e.g. the line `study screen` prints), jobs.study.allocation. Every point
    runs the study's frozen code (jobs.study.frozen), copied from the checkout when the study is
    made, again only with `refresh_code`, and with the profile the study froze (a later edit of
    the user's profile file changes no point; `refresh_code` takes it as it is then). On a profile
    whose nodes share hardware, another user's study job in the queue refuses the run unless
    `overlap_other_users` (check_shared_queue)."""
    profile = load(profile)
    if max_concurrent is not None and (isinstance(max_concurrent, bool) or max_concurrent < 1):
        raise StudyError(f"--max-concurrent: must be at least 1, got {max_concurrent}")
    if study_dir is None:
        rundir.check_runs_dir(runs_dir or rundir.default_runs_dir(profile))
        study_dir = default_study_dir(spec, runs_dir, profile)
    if os.path.lexists(study_dir):     # someone else's (or a link) is refused before anything in it is read
        rundir.check_private(study_dir, what="study directory")
    profile = _study_profile(study_dir, profile, refresh_code, log)
    if max_concurrent is None and profile.shared_nodes:
        max_concurrent = 1
    _check_placement(spec, profile, placement)
    placement = placement or spec.placement or "jobs"
    if nodes is not None and placement != "allocation":
        raise StudyError("--nodes: sizes a study's allocation; give --allocation (or placement: allocation)")
    if exclude is not None:
        if placement != "allocation":
            raise StudyError("--exclude: leaves nodes out of a study's allocation; give --allocation "
                             "(or placement: allocation)")
        exclude, _ = allocation.check_hostlist("--exclude", exclude)
    backend = backend_for(profile)
    # a new study submits every point: ask the cluster's configuration (one Slurm call) while
    # the points are checked, not after
    config = None if is_study_dir(study_dir) else _ask_config(backend)
    expanded = expand(spec, profile)    # every check before anything exists
    rundir.check_free_space(os.path.dirname(os.path.abspath(study_dir)))
    if profile.shared_nodes:
        check_shared_queue(backend, study_dir, overlap_other_users, log)
    with _submitting(study_dir, (profile.defaults or {}).get("runs_group")):
        record, points = open_study(spec, profile, study_dir, expanded)
        _frozen_code(record, refresh_code, log, profile)
        if config is not None:
            config.join()
        if placement == "allocation":
            return _run_allocation(spec, profile, backend, record, points, nodes, log, exclude)
        return _run_points(spec, profile, backend, record, points, max_concurrent, log, poll_first, poll_max)


def _check_placement(spec, profile, flag):
    """One allocation only on a backend that can run one (jobs.schedulers' `allocations`): refused
    in one line naming the flag or the spec's key, before the study directory exists."""
    if (flag or spec.placement) != "allocation" or capabilities(profile.scheduler).allocations:
        return
    where = "--allocation" if flag else f"{spec.source}: placement"
    raise StudyError(f"{where}: profile {profile.name!r} schedules with {profile.scheduler}, which cannot run a "
                     "study's points in one allocation; run them as separate jobs (placement: jobs) or use a "
                     "Slurm profile")


def _user():
    """This process's user name as Slurm prints it (squeue %u)."""
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _study_of(script):
    """The study a job's batch script belongs to (<runs>/study-<name>/points|allocations/...),
    else None."""
    parts = script.split(os.sep)
    for here, below in zip(parts, parts[1:]):
        if here.startswith("study-") and below in ("points", allocation.ALLOCATIONS):
            return here
    return None


def describe_queued(job, me):
    """`job 42 of user bob (study-x, RUNNING)`: one queued job of the shared study name."""
    whose = "yours" if job.user == me else f"of user {job.user}"
    what = _study_of(job.script) or (f"script {job.script}" if job.script else "not a study's job")
    state = f"{job.state}: {job.reason}" if job.reason else job.state
    return f"job {job.job_id} {whose} ({what}, {state})"


def check_shared_queue(backend, study_dir, overlap=False, log=_log, me=None):
    """Before a study on shared nodes submits: every job of SHARED_NAME in the queue, of any
    user (one squeue call). Slurm's singleton orders only one user's jobs, so another user's
    study job, queued or running, would run beside this study's points and spoil both
    measurements: refused in one line naming it, unless `overlap` (then said). A job of this
    user's other studies runs first: said, and said to be stuck when it cannot start as it is.
    This study's own jobs are left to the study. What the queue cannot show (squeue failing,
    PrivateData=jobs hiding other users' jobs) is not known, and said when squeue fails."""
    try:
        jobs = backend.queued_named(SHARED_NAME)
    except SlurmCommandError as exc:
        log(f"cannot tell whether other studies' jobs ({SHARED_NAME}) are queued: {exc}")
        return []
    me = me or _user()
    mine = os.path.abspath(study_dir) + os.sep
    others = []
    for job in jobs or []:
        if job.user == me and job.script.startswith(mine):
            continue
        line = describe_queued(job, me)
        if job.user != me:
            others.append((job.state != states.RUNNING, len(others), line))     # running ones first
        elif job.state == states.PENDING and job.reason in STUCK_REASONS:
            log(f"{line} cannot start as it is, and this study's points wait behind it (Slurm's singleton on "
                f"{SHARED_NAME}): release it (`scontrol release {job.job_id}`) or cancel it (`scancel {job.job_id}`)")
        else:
            log(f"{line} runs before this study's points (one {SHARED_NAME} job of a user at a time)")
    others = [line for _, _, line in sorted(others)]
    if others and not overlap:
        more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
        raise StudyError(f"study: {others[0]}{more} shares these nodes: Slurm's singleton orders only one user's "
                         f"jobs, so this study's points would run beside it and spoil both measurements; nothing "
                         f"submitted; wait for it (`squeue --name={SHARED_NAME}`) or give --overlap-other-users")
    for line in others:
        log(f"{line} may run beside this study's points (--overlap-other-users)")
    return jobs or []


def point_request(point, spec, profile, code=None):
    """A point's JobRequest; on a profile whose nodes share hardware it carries the cluster's one
    study job name (SHARED_NAME: Slurm runs one job of that name and user at a time), so the
    one-at-a-time rule holds across every study on the cluster, not only within this one; `code`:
    the study's frozen code (StudyRecord.code), which the job runs instead of the checkout."""
    request = point.request(spec, profile.name)
    if profile.shared_nodes:
        request.singleton = SHARED_NAME
    if code:
        request.code_dir = code["dir"]
    return request


def _frozen_code(record, refresh, log, profile=None):
    """The study's frozen code (and, given the `profile` its points are planned with, its frozen
    profile): copied for a new study (or one from before frozen code or profiles) and on
    `refresh`, which is recorded in code_changes; else the copies it has. A frozen profile other
    than `profile` (a refresh by another `run` since this one read the study) is refused."""
    change = {}
    if record.code is None or refresh:
        code = frozen.freeze(record.study_dir, group=(profile.defaults or {}).get("runs_group") if profile else None)
        if record.code is not None and record.code["sha256"] != code["sha256"]:
            change.update({"from": record.code["sha256"], "to": code["sha256"], "at": code["frozen_at"]})
            log(f"code refreshed: {record.code['sha256'][:16]} -> {code['sha256'][:16]}; points submitted from "
                "now run the new copy")
        record.code = code  # a new study's: saved with its first point's run dir, before its sbatch
    if profile is not None:
        sha = profile.content_sha256()
        if record.profile_copy is None or refresh:
            copy = frozen.freeze_profile(record.study_dir, profile)
            if record.profile_copy is not None and record.profile_copy["sha256"] != sha:
                change.update({"profile_from": record.profile_copy["sha256"], "profile_to": sha,
                               "at": copy["frozen_at"]})
                log(f"profile refreshed: {profile.name} {record.profile_copy['sha256'][:16]} -> {sha[:16]}; points "
                    "submitted from now run with it")
            record.profile_copy = copy
        elif record.profile_copy["sha256"] != sha:
            raise StudyError(f"study: {record.study_dir}: its frozen profile changed while this `study run` "
                             "started (another `study run --refresh-code`?); nothing submitted, run again")
    if change:
        record.code_changes.append(change)
        record.save()
    if record.code is not None:
        frozen.verify(record.code, record.study_dir)      # before any point runs it (and before each point)
    return record.code


def _study_profile(study_dir, profile, refresh, log):
    """The profile a study's points are planned with: the study's frozen copy of it
    (jobs.study.frozen) for an existing study, unless `refresh`; else `profile` as loaded now.
    An edit of the profile since the study froze it is said in one line."""
    if refresh or not is_study_dir(study_dir):
        return profile
    record = StudyRecord.load(study_dir)
    if record.code:
        frozen.verify(record.code, record.study_dir)      # a changed copy is refused before Slurm is asked anything
    if record.profile_copy is None or record.profile != profile.name:     # open_study refuses another profile
        return profile
    copy = frozen.load_frozen_profile(record.study_dir, record.profile_copy)
    if copy.content_sha256() != profile.content_sha256():
        log(f"profile {profile.name}: {profile.path or 'the profile given'} differs from the study's frozen copy "
            f"{record.profile_copy['sha256'][:16]} ({record.profile_copy['file']}); points run with the study's "
            "copy (`study run --refresh-code` takes the profile as it is now, recorded)")
    return copy


def _run_allocation(spec, profile, backend, record, points, nodes, log, exclude=None):
    """The missing and failed points (in rounds of repeats) as one allocation
    (jobs.study.allocation), only while no point of the study is queued or running: one
    allocation at a time, so its points never run beside another of the study's (a `run` meanwhile
    submits nothing and says so)."""
    status = poll(record) if any(p.runs for p in record.points) else None
    if status is not None and active(status.counts):
        log(f"{active(status.counts)} point(s) of the study are still queued or running; nothing submitted "
            f"until they end (`recsys-submit study status --watch`): {progress_line(status)}")
        return record, []
    point_states = {p.id: p.state for p in status.points} if status else {}
    todo = [p for p in record.points if p.id in points and point_states.get(p.id, MISSING) in (MISSING, FAILED)]
    todo.sort(key=lambda p: p.repeat)
    if not todo:
        return record, []
    runs = allocation.submit(spec, profile, backend, record, todo, points, point_request, nodes=nodes, log=log,
                             exclude=exclude)
    submitted = [p.id for p in todo]
    write_results(record, _after_submission(record, status, submitted, runs))
    return record, submitted


def _run_points(spec, profile, backend, record, points, max_concurrent, log, poll_first, poll_max):
    status = poll(record) if any(p.runs for p in record.points) else None
    point_states = {p.id: p.state for p in status.points} if status else {}
    todo = [p for p in record.points if p.id in points and point_states.get(p.id, MISSING) in (MISSING, FAILED)]
    todo.sort(key=lambda p: p.repeat)       # rounds: drift between rounds shows as spread, not bias
    busy = active(status.counts) if status else 0
    submitted = []
    points_dir = os.path.join(record.study_dir, "points")

    runs = {}       # point id -> the RunRecord its submission returned
    saving = threading.Lock()

    def submit_point(point):
        def recorded(run_dir):      # in study.json before anything is submitted from it
            with saving:
                point.add_attempt(run_dir, record)
                record.save(durable=True)

        if record.code:
            frozen.verify(record.code, record.study_dir)      # before every use: a changed copy is refused
        return submit([point_request(points[point.id], spec, profile, record.code)], profile, runs_dir=points_dir,
                      log=log, on_run_dir=recorded)

    said = {"counts": None, "at": 0.0}

    def waiting(status):
        """A progress line while the cap holds: when a point changes state, else every 30 s."""
        if status.counts == said["counts"] and time.monotonic() - said["at"] < WAITING_LINE_S:
            return
        said.update(counts=dict(status.counts), at=time.monotonic())
        log(f"waiting for a free slot (at most {max_concurrent} point(s) queued or running; "
            f"{len(todo) - len(submitted)} to submit): {progress_line(status)}")

    foreground = backend.capabilities.foreground
    if max_concurrent or foreground:
        for point in todo:      # one at a time: a cap on queued points, or local points in the foreground
            if max_concurrent and busy >= max_concurrent:
                status = poll_until(lambda: poll(record), lambda s: active(s.counts) < max_concurrent,
                                    on_poll=waiting, first=poll_first, ceiling=poll_max)
                busy = active(status.counts)
            runs[point.id] = submit_point(point)     # its run dir is in study.json already
            submitted.append(point.id)
            busy += 1
    elif todo:
        backend.accounting()    # asked (and cached) once, before the threads
        _submit_parallel(record, todo, submit_point, submitted, runs)
    if submitted and foreground:
        poll(record)    # the points ran to their end: results.json says how (no Slurm call)
    elif submitted:     # results.json lists the new attempts (as pending: no Slurm call for it)
        write_results(record, _after_submission(record, status, submitted, runs))
    return record, submitted


@contextlib.contextmanager
def _submitting(study_dir, group=None):
    """Hold the study's submission lock (study_dir/run.lock, flock): two `study run`s of one
    study at a time would each see the other's points as missing and submit them again. A new
    study directory is created private (rundir.make_private_dir); an existing one, and its lock,
    must be this user's and writable by nobody else (rundir.open_lock: a study name is
    predictable, so anyone who may write the runs dir could have made it first)."""
    try:
        if not os.path.isdir(study_dir):
            with contextlib.suppress(FileExistsError):
                rundir.make_private_dir(study_dir, group, parents=True)
        elif group:
            rundir.group_umask()    # what this run writes into the group's study stays readable by it
    except OSError as exc:
        raise RequestError(f"--runs-dir: cannot create {study_dir!r}: {exc.strerror}") from None
    path = os.path.join(study_dir, "run.lock")
    fd = rundir.open_lock(path)
    try:
        try:
            rundir.lock_exclusive(fd)     # a watcher's probe holds it for microseconds
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            raise StudyError(f"study: {study_dir} is being submitted by {holder}; nothing submitted "
                             "(`recsys-submit study status --watch` follows it)") from None
        line = f"`recsys-submit study run` pid {os.getpid()} on {socket.gethostname()}\n".encode()
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, line, 0)
        except OSError as exc:     # a full disk, a quota: one line, nothing submitted
            raise storage_error(path, exc) from None
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _ask_config(backend):
    """A started thread that asks the backend once for what every run records (Slurm: whether
    accounting is on, one `scontrol show config`, cached for the process), so that the call's
    latency overlaps the checking of the points instead of adding to it. Join it before
    anything else asks."""
    thread = threading.Thread(target=backend.accounting, name="recsys-config", daemon=True)
    thread.start()
    return thread


SUBMIT_THREADS = 8


def _submit_parallel(record, todo, submit_point, submitted, runs):
    """Submit independent points from a few threads (each sbatch waits on the controller, not on
    this process). Each point's run dir reaches study.json before its job is submitted
    (submit_point). A point that could not be submitted does not stop the others; the first
    error is raised at the end, saying what went in (a re-run resumes with the missing points).
    Interrupted, no further point is started, and the ones in flight finish first."""
    landed = queue.Queue()
    pending = iter(todo)
    take = threading.Lock()
    stop = threading.Event()

    def worker():
        while not stop.is_set():
            with take:
                point = next(pending, None)
            if point is None:
                return
            try:
                landed.put((point, submit_point(point), None))
            except BaseException as exc:    # reported (or re-raised, for a bug) by the main thread
                landed.put((point, None, exc))

    threads = [threading.Thread(target=worker, name=f"recsys-submit-{i}")
               for i in range(min(SUBMIT_THREADS, len(todo)))]
    errors = []

    def take_landed(batch):
        for point, run_record, exc in batch:
            if exc is not None:
                errors.append((point.id, exc))
                continue
            runs[point.id] = run_record
            submitted.append(point.id)

    try:
        for thread in threads:
            thread.start()
        while len(submitted) + len(errors) < len(todo):
            batch = [landed.get()]
            while True:                 # everything else that landed meanwhile
                try:
                    batch.append(landed.get_nowait())
                except queue.Empty:
                    break
            take_landed(batch)
    except BaseException:
        stop.set()
        for thread in threads:
            if thread.is_alive():
                thread.join()
        batch = []
        while not landed.empty():
            batch.append(landed.get_nowait())
        take_landed(batch)
        raise
    for thread in threads:
        thread.join()
    order = {p.id: i for i, p in enumerate(todo)}
    submitted.sort(key=order.get)
    errors.sort(key=lambda e: order[e[0]])
    for point_id, exc in errors:
        if not isinstance(exc, (RequestError, SubmitError, SlurmCommandError, StorageError)):
            raise exc               # a bug, not a refused submission: its traceback
    if errors:
        point_id, exc = errors[0]
        raise SubmitError(f"point {point_id} not submitted: {exc}; {len(errors)} point(s) failed to submit, "
                          f"{len(submitted)} submitted; `recsys-submit study run` again submits the missing "
                          f"ones (study {record.study_dir})")


def _after_submission(record, status, submitted, runs):
    """The StudyStatus right after submitting: the last poll's, with new attempts pending
    (their job ids from the RunRecords the submissions returned, not read back from disk)."""
    before = {p.id: p for p in status.points} if status else {}
    out = []
    for point in record.points:
        if point.id in runs:
            job = runs[point.id].jobs
            out.append(PointStatus(id=point.id, state=PENDING, job_state="SUBMITTED", run_dir=point.runs[-1],
                                   job_id=job[0].job_id if job else None, attempts=len(point.runs)))
        else:
            out.append(before.get(point.id) or PointStatus(id=point.id, state=MISSING, job_state=None,
                                                           run_dir=None, job_id=None, attempts=0))
    counts = _counts(out)
    return StudyStatus(study_dir=record.study_dir, points=out, counts=counts, done=False, calls=0,
                       elapsed_s=round(time.time() - record.created, 1))


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
