"""A study's points in one allocation: one job of the largest point's nodes (or a size given), in
which every point runs its own script, the one a separate job of the point would run, on the
first nodes of the allocation. The queue is waited for once and every point of the study runs
on the same node set, so two points differ by their size only.

Records, crash-safe as a separate job's (jobs.submit): the allocation is an ordinary run
directory under study-<name>/allocations/ (its jobs.json holds its intent, with the token,
before `sbatch`); every point gets its own run directory under points/ as before, whose jobs.json
holds the same token as its intent before `sbatch` and the allocation's job id after, so a look
at the point settles an interrupted submission the usual way (jobs.recovery) and a point's
state comes from the allocation's state and the point's own record (logs/<key>-<job id>.info:
started, exit code). Each point's step has its own time limit (its --time, srun --time): a
point that runs out of it is TIMEOUT, with the phase it was in, and the next point runs. At the
allocation's own time limit its script (Slurm's USR2 from its --signal, else the SIGTERM at the
limit) records the running point as TIMEOUT, and the points it did not reach are missing again.
A point the allocation did not finish otherwise (node failure, preemption, scancel) is failed
with that reason. The next `study run` submits every one of them again; a point that finished
is kept.
"""

import contextlib
import dataclasses
import os
import re
import time

from jobs.errors import RequestError, SlurmCommandError, StorageError, SubmitError
from jobs.planning.plan import plan, run_name
from jobs.planning.request import slug
from jobs.runs import enginelog, rundir
from jobs.runs.atomic import write_text
from jobs.runs.records import PARTIAL, SUBMITTED, JobRecord, RequestRecord, RunRecord

from . import frozen
from ..spec import StudyError

ALLOCATIONS = "allocations"
KEY = "allocation"
# seconds the allocation's time limit adds to its points' own limits (starting each point's script)
MARGIN_S = 60


def _plan_points(spec, profile, record, todo, points, point_request):
    """[(PointRecord, resolved requests, JobSpec)]: each point planned as its separate job is,
    without requeueing (a point the allocation did not finish is submitted again by the study)."""
    if record.code:
        frozen.verify(record.code, record.study_dir)      # the copy its points run, as recorded
    out = []
    for point in todo:
        resolved, specs = plan([point_request(points[point.id], spec, profile, record.code)], profile,
                               submitting=True)
        if len(specs) != 1 or specs[0].array:
            raise StudyError(f"--allocation: point {point.id} plans {len(specs)} jobs; a point in an allocation "
                             "is one job")
        out.append((point, resolved, dataclasses.replace(specs[0], requeue=False)))
    return out


def allocation_spec(spec, planned, nodes=None):
    """The allocation's JobSpec: the largest point's job, `nodes` nodes (default: the largest
    point's), as many tasks and GPUs per node as the widest point, the points' time limits
    summed."""
    specs = [s for _, _, s in planned]
    largest = max(specs, key=lambda s: (s.nodes, s.ntasks_per_node))
    size = largest.nodes if nodes is None else nodes
    if isinstance(size, bool) or not isinstance(size, int) or size < largest.nodes:
        raise StudyError(f"--nodes: the allocation needs at least the largest point's {largest.nodes} node(s), "
                         f"got {size!r}")
    return dataclasses.replace(
        largest, key=KEY, name=slug(f"{spec.name}-{KEY}"), subject=spec.name, nodes=size,
        ntasks_per_node=max(s.ntasks_per_node for s in specs), gpus_per_node=max(s.gpus_per_node for s in specs),
        time_seconds=sum(s.time_seconds for s in specs) + MARGIN_S * len(specs), requeue=False, array=None,
        task_count=None, after_ok=[], after_any=[], external_after=[], env={}, checkpoint_dir=None)


@contextlib.contextmanager
def _holding(run_dirs):
    """Every run dir's submit.lock held while its submission is under way (jobs.recovery leaves
    a run alone while its submitter lives)."""
    with contextlib.ExitStack() as stack:
        for run_dir in run_dirs:
            fd = rundir.open_lock(os.path.join(run_dir, rundir.SUBMIT_LOCK))   # never a link, nor another's
            stack.callback(os.close, fd)
            rundir.lock_exclusive(fd)
            os.set_inheritable(fd, True)    # held by sbatch too, for as long as it runs (jobs.submit)
        yield


def check_hostlist(flag, hosts):
    """A Slurm host list given by the user (`--exclude node3,node7`, `--nodelist node[1-4]`), or the
    `--exclude=...` line `study screen` prints: its host names, refused in one line naming `flag`."""
    from slurm.common.hostlist import expand as expand_hostlist

    text = hosts[len(flag) + 1:] if isinstance(hosts, str) and hosts.startswith(f"{flag}=") else hosts
    try:
        names = expand_hostlist(text) if isinstance(text, str) and text.strip() else None
    except ValueError as exc:
        names, why = None, f" ({exc})"
    else:
        why = ""
    if not names or not all(re.fullmatch(r"[A-Za-z0-9_.\-]+", n) for n in names):
        raise StudyError(f"{flag}: {hosts!r} is not a Slurm host list such as node[1-4],gpu7{why}")
    if len(set(names)) != len(names):
        raise StudyError(f"{flag}: {hosts!r} names a node twice")
    return text, names


def submit(spec, profile, backend, record, todo, points, point_request, nodes=None, log=None, exclude=None):
    """Submit `todo` (PointRecords, in the order they run) as one allocation. Each point's run
    dir is in study.json, with the allocation's token as its intent, before `sbatch`. Returns
    {point id: the point's RunRecord}. `point_request(point, spec, profile, code)`: a point's JobRequest
    (jobs.study.running.run's, so a point is planned the same way in an allocation or alone); `exclude`: a
    host list the allocation leaves out (check_hostlist). Raises StudyError (before anything exists)
    or SubmitError."""
    planned = _plan_points(spec, profile, record, todo, points, point_request)
    alloc = allocation_spec(spec, planned, nodes)
    group = (profile.defaults or {}).get("runs_group")
    alloc_root = os.path.join(record.study_dir, ALLOCATIONS)
    try:
        os.makedirs(alloc_root, exist_ok=True)
    except OSError as exc:
        raise StorageError(f"study: cannot create {alloc_root!r}: {exc.strerror}") from None
    alloc_dir = rundir.new_run_dir(alloc_root, KEY, group=group)
    points_dir = os.path.join(record.study_dir, "points")
    dirs = [rundir.new_run_dir(points_dir, run_name(resolved), group=group) for _, resolved, _ in planned]
    alloc_draft, drafts = backend.allocation(alloc, [(s, d) for (_, _, s), d in zip(planned, dirs)], alloc_dir,
                                             exclude=exclude)
    accounting = backend.accounting()

    def run_record(run_dir, key):
        return RunRecord(run_dir=run_dir, profile=profile.name, profile_path=profile.path,
                         scheduler=backend.scheduler, accounting=accounting, planned=[key])

    with _holding([alloc_dir] + dirs):
        alloc_record = run_record(alloc_dir, KEY)
        alloc_record.save()
        runs = {}
        for (point, resolved, point_spec), draft in zip(planned, drafts):
            RequestRecord(requests=[r.request.to_dict() for r in resolved], profile=profile.as_dict()).save(draft.run_dir)
            write_text(draft.script, draft.text)
            run = run_record(draft.run_dir, point_spec.key)
            run.intent = JobRecord(key=point_spec.key, name=point_spec.name, job_id=None,
                                   ntasks=point_spec.nodes * point_spec.ntasks_per_node, script=draft.script,
                                   token=alloc_draft.token, submitted_at=round(time.time(), 3))
            run.save(durable=True)
            runs[point.id] = run
            point.add_attempt(draft.run_dir, record)
            point.allocation[draft.run_dir] = alloc_dir
        record.save(durable=True)       # every point findable before the allocation's sbatch

        jobs = submit_recorded(backend, alloc_draft, alloc_record, "the study's allocation",
                               f"; {len(runs)} point(s) in it (allocation run dir {alloc_dir})", log=log,
                               on_failure=lambda exc: _failed([alloc_record] + list(runs.values()), exc))
        job_id = jobs[0].job_id
        for run in runs.values():
            run.intent.job_id = job_id
            run.jobs, run.intent, run.state = [run.intent], None, SUBMITTED
            run.save()
    log(f"allocation job {job_id}: {alloc.nodes} node(s), {len(runs)} point(s) on its first nodes "
        f"(run dir {alloc_dir})")
    return runs


def submit_recorded(backend, draft, alloc_record, what, where, log=None, on_failure=None):
    """The sbatch of an allocation (a study's, a screen's) with its intent in `alloc_record` first,
    so that jobs.recovery settles a crash between the two; then its job. A failure is one
    SubmitError saying whether Slurm may have the job (`on_failure(exc)` runs before it)."""
    def intent(job):
        alloc_record.intent = job
        alloc_record.save(durable=True)

    try:
        jobs = backend.submit(draft, {}, False, log=log, on_intent=intent)
    except (SubmitError, SlurmCommandError, StorageError) as exc:
        if on_failure is not None:
            on_failure(exc)
        raise SubmitError(f"{what} {'may or may not have been' if _uncertain(exc) else 'was not'} submitted: "
                          f"{exc}{where}", uncertain=_uncertain(exc)) from None
    alloc_record.jobs, alloc_record.intent, alloc_record.state = jobs, None, SUBMITTED
    alloc_record.save()
    return jobs


def _uncertain(exc):
    return bool(getattr(exc, "uncertain", False))


def _failed(records, exc):
    """The allocation's sbatch failed: every record says so; one that provably did not go in
    drops its intent (its point is submitted again), an uncertain one keeps it (jobs.recovery)."""
    for run in records:
        run.state, run.uncertain, run.error = PARTIAL, _uncertain(exc), f"the study's allocation: {exc}"
        if not run.uncertain:
            run.intent = None
        with contextlib.suppress(StorageError):
            run.save()


def progress(run_dir, key, job_id):
    """What a point's own script recorded in allocation `job_id` (logs/<key>-<job id>.info):
    {name: value}, e.g. start, nodelist, exit_code; empty before it began."""
    try:
        with open(os.path.join(run_dir, "logs", f"{key}-{job_id}.info")) as handle:
            return dict(line.rstrip("\n").split("=", 1) for line in handle if "=" in line)
    except OSError:
        return {}


def timeout_reason(run_dir: str, key: str, job_id: str, seen: dict) -> str:
    """`TIMEOUT: ...` of a point that ran out of time in allocation `job_id` (`seen`: its
    progress()): whose limit (its step's own, or the allocation's) and where it was: its phase,
    and the rank and node that stopped first when its ranks' records tell (enginelog.stalled_where)."""
    limit = seen.get("limit_s", "").strip()
    if seen.get("timed_out", "").strip() == "step":
        whose = f"its own {int(limit) // 60}-minute limit" if limit.isdigit() else "its own time limit"
    else:
        whose = f"the allocation's time limit (job {job_id})"
    try:
        ntasks = RunRecord.load(run_dir).jobs[0].ntasks or 0
    except (RequestError, IndexError):
        ntasks = 0
    nodes = [n for n in seen.get("nodelist", "").strip().split(",") if n]
    return f"TIMEOUT: {whose}, {enginelog.stalled_where(run_dir, key, job_id, nodes, ntasks)}"
