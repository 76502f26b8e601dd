"""Running a study: submit the points, resume what is missing or failed.

Layout: <runs_dir>/study-<name>/ with study.yaml (the spec as validated), study.json
(jobs.study.running.record, rewritten atomically with each point's run directory before its job
is submitted), points/ (one ordinary run directory per attempt, made by the orchestrator,
jobs.submit), results.json (jobs.study.running.record.poll) and run.lock (held by the one `run`
that may submit at a time). Since a point's run directory is in study.json before its `sbatch`
(jobs.submit's on_run_dir), a `run` killed at any moment leaves every job it may have submitted
findable, and the next look settles it by the job's token (jobs.recovery). The study directory
is private to its owner (or the profile's runs_group). A point is resubmitted only when Slurm
reported its latest job in a terminal state other than COMPLETED, or its submission provably
never reached Slurm; a job Slurm has not reported yet is UNKNOWN, never resubmitted. Points go
in by rounds of repeats, one at a time on a profile whose nodes share hardware.
"""

import contextlib
import fcntl
import os
import socket
import sys
import threading
import time

from jobs import states
from jobs.schedulers import backend_for, capabilities
from jobs.errors import RequestError, SlurmCommandError
from jobs.polling import poll_until
from jobs.runs import rundir
from jobs.runs.atomic import storage_error, write_text
from jobs.submit import load, submit
from slurm.common.atomicfile import fsync_dir

from ..spec import StudyError, expand, is_study_dir, spec_yaml
from . import allocation, frozen
from .parallel import submit_parallel
from .record import (FAILED, MISSING, PENDING, PointRecord, PointStatus, StudyRecord, StudyStatus, active,
                     counts_of, default_study_dir, poll, progress_line, write_results)


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


def _log(message):
    print(f"recsys-submit: {message}", file=sys.stderr)


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
    host list, e.g. the line `study screen` prints), jobs.study.running.allocation. Every point
    runs the study's frozen code (jobs.study.running.frozen), copied from the checkout when the study is
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
    (jobs.study.running.frozen) for an existing study, unless `refresh`; else `profile` as loaded now.
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
    (jobs.study.running.allocation), only while no point of the study is queued or running: one
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
        submit_parallel(record, todo, submit_point, submitted, runs)
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
    counts = counts_of(out)
    return StudyStatus(study_dir=record.study_dir, points=out, counts=counts, done=False, calls=0,
                       elapsed_s=round(time.time() - record.created, 1))
