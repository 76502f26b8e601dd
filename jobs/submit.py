"""The orchestrator: plan -> dry run -> run directory -> request.json -> jobs, for every backend.

Everything that can be refused (the request, the profile, the runs dir, values sbatch cannot
take, --after ids the scheduler does not know) is refused by planning and the backend's dry run
before the run directory exists. The dry run is a value (jobs.backends.base.DryRun): its drafts
are then submitted in order, each with the ids of the jobs it waits for. jobs.json is written
before anything is submitted, again with each job's intent (its token) before `sbatch` and with
its id after, so a crash at any moment leaves a record that says what may have gone in, and
every later look settles it by the token (jobs.recovery) instead of submitting again. The
run dir's file system must have room for the records first (rundir.check_free_space). If a submission fails, the
earlier jobs are cancelled unless keep_partial, and jobs.json and the error say what really
became of them. How one job is submitted, polled or cancelled is the backend's (jobs.backends).
"""

import contextlib
import os
import shutil
import sys

from . import faultpoints
from .errors import RequestError, SlurmCommandError, StorageError, SubmitError
from .planning.container_paths import registry_image_warning
from .planning.plan import plan, run_name
from .planning.requeue import lead_time_warning
from .profiles import Profile, load_profile
from .runs import rundir
from .runs.atomic import write_text
from .schedulers import backend_for


def _log(message):
    print(f"recsys-submit: {message}", file=sys.stderr)


def load(profile):
    """A Profile from a name, a path or an already loaded Profile."""
    if isinstance(profile, Profile):
        return profile
    return load_profile(profile)


def _run_dir(resolved, profile, runs_dir):
    """Where the run will live (not created): the same path for render and for submit."""
    return rundir.new_run_dir(runs_dir or rundir.default_runs_dir(profile), run_name(resolved), create=False)


def dry_run(requests, profile, run_dir=None, max_array_size=None, runs_dir=None, write=False, check_data=False):
    """The DryRun of a chain without submitting or checking anything a submission checks beyond
    the plan (a script may be for another machine); dependencies show as <key> placeholders. The
    run dir is the one a submission with the same `runs_dir` would create. With `write`, the
    scripts are also written as RUN_DIR/<key>.sbatch (and RUN_DIR/logs made), so that they can
    be submitted by hand (`recsys-submit render -o DIR`). `check_data`: the engine's data must be
    named, as a submission requires (`--dry-run` of a submission; not `render`)."""
    profile = load(profile)
    backend = backend_for(profile)
    max_array = max_array_size or backend.max_array_size(requests)
    resolved, specs = plan(requests, profile, max_array_size=max_array, check_data=check_data)
    run_dir = run_dir or _run_dir(resolved, profile, runs_dir)
    dry = backend.dry_run(specs, run_dir, check=False, written=write, token=None if write else "<token>")
    if write:
        if any(draft.script is None for draft in dry.drafts):
            raise RequestError(f"-o: a {dry.scheduler} profile writes no batch scripts; "
                               "--dry-run shows what it would run")
        try:
            os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
        except OSError as exc:
            raise RequestError(f"-o: cannot create {run_dir!r}: {exc.strerror}") from None
        for draft in dry.drafts:
            write_text(draft.script, draft.text)
    return dry


def render_plan(requests, profile, run_dir=None, max_array_size=None, runs_dir=None, write=False):
    """[(spec, script text)] of dry_run(...): what `recsys-submit render` prints or writes."""
    dry = dry_run(requests, profile, run_dir=run_dir, max_array_size=max_array_size, runs_dir=runs_dir,
                  write=write)
    return [(draft.spec, draft.text) for draft in dry.drafts]


def render_text(requests, profile, runs_dir=None, check_data=False):
    """The script(s) a submission would write, as one text (scripts separated by a header)."""
    return dry_run(requests, profile, runs_dir=runs_dir, check_data=check_data).text()


@contextlib.contextmanager
def _holding_submit_lock(run_dir):
    """Hold RUN_DIR/submit.lock while submitting: a reader that finds the record `submitting`
    knows from the lock whether its submission may still be under way (the kernel drops it with
    the last process holding it, kill -9 included). The lock is inherited by `sbatch`
    (jobs.backends.slurm.commands), so a submitter killed while sbatch runs leaves it held until
    sbatch has exited and its job is in the queue or not."""
    fd = rundir.open_lock(os.path.join(run_dir, rundir.SUBMIT_LOCK))   # never a link, nor another's
    try:
        rundir.lock_exclusive(fd)       # a new run dir: only a reader's probe can hold it
        os.set_inheritable(fd, True)    # held by sbatch too, for as long as it runs
        yield
    finally:
        os.close(fd)


def submit(requests, profile, runs_dir=None, keep_partial=False, log=_log, wait=None, wait_local=None,
           on_run_dir=None):
    """Plan and submit a chain of requests; returns the jobs.runs.records.RunRecord written to
    jobs.json. `wait`: None for the backend's default (local: run in the foreground; Slurm:
    never wait), False for a local run in the background (`wait_local` is its older name).
    `on_run_dir(run_dir)` is called once the run's records exist and before anything is
    submitted (a study records its point's run there). Raises RequestError/ProfileError before
    anything exists, StorageError when the runs dir has no room for the records (nothing
    submitted), SubmitError after a failed submission (saying what was submitted and what became
    of it)."""

    if wait is None and wait_local is not None:
        wait = wait_local
    profile = load(profile)
    backend = backend_for(profile)
    resolved, specs = plan(requests, profile, max_array_size=backend.max_array_size(requests),
                           submitting=True)
    planned_dir = _run_dir(resolved, profile, runs_dir)
    dry = backend.dry_run(specs, planned_dir, wait)
    runs_root = runs_dir or rundir.default_runs_dir(profile)
    rundir.check_free_space(runs_root)
    # Created now under the next free name (another submission may have taken this one meanwhile).
    run_dir = rundir.new_run_dir(runs_root, run_name(resolved),
                                 group=(profile.defaults or {}).get("runs_group"))
    with _holding_submit_lock(run_dir):
        record, dry = _records(backend, dry, specs, resolved, profile, run_dir, log)
        if on_run_dir is not None:
            on_run_dir(run_dir)
        return _submit_drafts(backend, dry, record, keep_partial, log)


def _records(backend, dry, specs, resolved, profile, run_dir, log):
    """request.json and the first jobs.json of a new run dir (every planned job key, nothing
    submitted). A run dir whose records cannot be written is removed again: nothing was
    submitted from it. Returns (RunRecord, the DryRun drawn for this run dir)."""
    from .runs.records import RequestRecord, RunRecord   # not needed to render: loaded here

    if run_dir != dry.run_dir:      # the drafts name their run dir: draw them for this one
        dry = backend.dry_run(specs, run_dir, dry.wait, check=False)
    try:
        for spec in specs:
            for warning in (lead_time_warning(spec, run_dir), registry_image_warning(spec, profile)):
                if warning:
                    log(f"warning: {warning}")
        RequestRecord(requests=[r.request.to_dict() for r in resolved], profile=profile.as_dict()).save(run_dir)
        record = RunRecord(run_dir=run_dir, profile=profile.name, profile_path=profile.path,
                           scheduler=backend.scheduler, accounting=backend.accounting(), foreground=dry.wait,
                           planned=[d.key for d in dry.drafts])
        record.save()
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return record, dry


def _submit_drafts(backend, dry, record, keep_partial, log):
    """Submit the drafts in order. Each job's intent (its token) is in jobs.json before it is
    submitted and its id right after, in the write that clears the intent."""
    from .runs.records import SUBMITTED

    run_dir = record.run_dir

    def intent_recorded(job):
        record.intent = job
        record.save(durable=True)       # must outlive a crash of this host, not only of this process
        faultpoints.reached("intent-recorded")

    ids = {}
    for index, draft in enumerate(dry.drafts):
        try:
            jobs = backend.submit(draft, ids, dry.wait, log=log, on_intent=intent_recorded)
        except (SubmitError, SlurmCommandError, StorageError) as exc:
            _fail(backend, record, draft.spec, exc, keep_partial)
        ids[draft.key] = jobs[0].job_id if jobs else None
        record.jobs.extend(jobs)
        record.intent = None
        if index == len(dry.drafts) - 1 and not dry.wait:
            record.state = SUBMITTED    # the last job of a run not waited for: one write says both
        try:
            record.save()   # after every job: a crash mid-chain still leaves the ids on disk
        except StorageError as exc:
            _unrecorded(record, jobs, exc)
        faultpoints.reached("job-recorded")
        failed = backend.failure(run_dir, jobs) if dry.wait else None
        if failed:
            record.error = failed
            break
    if record.state != SUBMITTED:
        record.state = SUBMITTED
        record.save()
    return record


def _unrecorded(record, jobs, exc):
    """A job went in but jobs.json could not be rewritten with its id: the intent written before
    sbatch is still on disk, so `status` and `cancel` find the job by its token; nothing is
    cancelled or submitted again here."""
    went_in = ", ".join(f"{j.key}={j.job_id}" for j in jobs)
    raise SubmitError(f"submitted {went_in}, but its id could not be recorded ({exc}); jobs.json still "
                      f"holds its token, so `recsys-submit status {record.run_dir}` and `cancel` find it "
                      "once there is room", uncertain=False) from None


def _fail(backend, record, spec, exc, keep_partial):
    """Cancel (or keep) what a broken chain submitted; record and raise what really happened."""
    from .runs.records import CANCEL_FAILED, CANCELLED_PARTIAL, PARTIAL

    submitted = record.jobs
    done = ", ".join(f"{j.key}={j.job_id}" for j in submitted) or "none"
    if submitted and not keep_partial:
        try:
            backend.cancel(record.run_dir, submitted)
            fate, outcome, record.state = "cancelled them", "cancelled", CANCELLED_PARTIAL
        except SlurmCommandError as cancel_exc:
            fate = (f"could NOT cancel them ({cancel_exc}), so they may still run: "
                    f"recsys-submit cancel {record.run_dir}")
            outcome, record.state = "cancel-failed", CANCEL_FAILED
    else:
        fate = "kept them (--keep-partial)" if submitted else "nothing to cancel"
        outcome, record.state = "kept", PARTIAL
    for job in submitted:
        job.outcome = outcome
    uncertain = record.uncertain = bool(getattr(exc, "uncertain", False))
    what = "may or may not have been submitted" if uncertain else "not submitted"
    record.error = (f"job {spec.key!r} {what}: {exc}; submitted before it: {done}; {fate}; "
                    f"run dir {record.run_dir}")
    if not uncertain:
        record.intent = None        # it provably did not go in (an uncertain one keeps its token)
    try:
        record.save()
    except StorageError as save_exc:
        record.error += f"; this could not be recorded ({save_exc})"
    raise SubmitError(record.error, uncertain=uncertain) from None
