"""The orchestrator: plan -> dry run -> run directory -> request.json -> jobs, for every backend.

Everything that can be refused (the request, the profile, the runs dir, values sbatch cannot
take, --after ids the scheduler does not know) is refused by planning and the backend's dry run
before the run directory exists. The dry run is a value (jobs.backends.base.DryRun): its drafts
are then submitted in order, each with the ids of the jobs it waits for, and jobs.json is
rewritten after each, so a crash mid-chain still says what went in. If a submission fails, the
earlier jobs are cancelled unless keep_partial, and jobs.json and the error say what really
became of them. How one job is submitted, polled or cancelled is the backend's (jobs.backends).
"""

import os
import sys

from .errors import RequestError, SlurmCommandError, SubmitError
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


def dry_run(requests, profile, run_dir=None, max_array_size=None, runs_dir=None, write=False):
    """The DryRun of a chain without submitting or checking anything a submission checks beyond
    the plan (a script may be for another machine); dependencies show as <key> placeholders. The
    run dir is the one a submission with the same `runs_dir` would create. With `write`, the
    scripts are also written as RUN_DIR/<key>.sbatch (and RUN_DIR/logs made), so that they can
    be submitted by hand (`recsys-submit render -o DIR`)."""
    profile = load(profile)
    backend = backend_for(profile)
    max_array = max_array_size or backend.max_array_size(requests)
    resolved, specs = plan(requests, profile, max_array_size=max_array)
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


def render_text(requests, profile, runs_dir=None):
    """The script(s) a submission would write, as one text (scripts separated by a header)."""
    return dry_run(requests, profile, runs_dir=runs_dir).text()


def submit(requests, profile, runs_dir=None, keep_partial=False, log=_log, wait=None, wait_local=None):
    """Plan and submit a chain of requests; returns the jobs.runs.records.RunRecord written to
    jobs.json. `wait`: None for the backend's default (local: run in the foreground; Slurm:
    never wait), False for a local run in the background (`wait_local` is its older name).
    Raises RequestError/ProfileError before anything exists, SubmitError after a failed
    submission (saying what was submitted and what became of it)."""
    from .runs.records import SUBMITTED, RequestRecord, RunRecord   # not needed to render: loaded here

    if wait is None and wait_local is not None:
        wait = wait_local
    profile = load(profile)
    backend = backend_for(profile)
    resolved, specs = plan(requests, profile, max_array_size=backend.max_array_size(requests),
                           submitting=True)
    planned_dir = _run_dir(resolved, profile, runs_dir)
    dry = backend.dry_run(specs, planned_dir, wait)
    # Created now under the next free name (another submission may have taken this one meanwhile).
    run_dir = rundir.new_run_dir(runs_dir or rundir.default_runs_dir(profile), run_name(resolved))
    if run_dir != dry.run_dir:      # the drafts name their run dir: draw them for this one
        dry = backend.dry_run(specs, run_dir, dry.wait, check=False)
    for spec in specs:
        warning = lead_time_warning(spec, run_dir)
        if warning:
            log(f"warning: {warning}")
    RequestRecord(requests=[r.request.to_dict() for r in resolved], profile=profile.as_dict()).save(run_dir)
    record = RunRecord(run_dir=run_dir, profile=profile.name, profile_path=profile.path,
                       scheduler=backend.scheduler, accounting=backend.accounting(), foreground=dry.wait)
    record.save()
    ids = {}
    for index, draft in enumerate(dry.drafts):
        try:
            jobs = backend.submit(draft, ids, dry.wait, log=log)
        except (SubmitError, SlurmCommandError) as exc:
            _fail(backend, record, draft.spec, exc, keep_partial)
        ids[draft.key] = jobs[0].job_id if jobs else None
        record.jobs.extend(jobs)
        if index == len(dry.drafts) - 1 and not dry.wait:
            record.state = SUBMITTED    # the last job of a run not waited for: one write says both
        record.save()       # after every job: a crash mid-chain still leaves the ids on disk
        failed = backend.failure(run_dir, jobs) if dry.wait else None
        if failed:
            record.error = failed
            break
    if record.state != SUBMITTED:
        record.state = SUBMITTED
        record.save()
    return record


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
    record.save()
    raise SubmitError(record.error, uncertain=uncertain) from None
