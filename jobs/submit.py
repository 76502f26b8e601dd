"""The orchestrator: plan -> run directory -> request.json -> jobs, for every backend.

Everything that can be refused (the request, the profile, the runs dir, values sbatch cannot
take) is refused before the run directory exists. Jobs of a chain are then submitted in
order, each with the ids of the jobs it waits for, and jobs.json is rewritten after each, so
a crash mid-chain still says what went in. If a submission fails, the earlier jobs are
cancelled unless keep_partial, and jobs.json and the error say what really became of them.
How one job is submitted, polled or cancelled is the backend's (jobs.backends).
"""

import os
import sys

from . import runs as runs_mod
from .backends import backend_for
from .errors import RequestError, SlurmCommandError, SubmitError
from .plan import plan, run_name
from .progress import lead_time_warning
from .render import render


def _log(message):
    print(f"recsys-submit: {message}", file=sys.stderr)


def load(profile):
    """A Profile from a name, a path or an already loaded Profile."""
    from .profiles import Profile, load_profile

    if isinstance(profile, Profile):
        return profile
    return load_profile(profile)


def _run_dir(resolved, profile, runs_dir):
    """Where the run will live (not created): the same path for render and for submit."""
    return runs_mod.new_run_dir(runs_dir or runs_mod.default_runs_dir(profile), run_name(resolved),
                                create=False)


def render_plan(requests, profile, run_dir=None, max_array_size=None, runs_dir=None, write=False):
    """[(spec, script text)] without submitting; dependencies show as <key> placeholders.
    The run dir is the one a submission with the same `runs_dir` would create. With `write`,
    the scripts are also written as RUN_DIR/<key>.sbatch (and RUN_DIR/logs made), so that they
    can be submitted by hand (`recsys-submit render -o DIR`)."""
    from .runs import write_text

    profile = load(profile)
    max_array = max_array_size or backend_for(profile).max_array_size(requests)
    resolved, specs = plan(requests, profile, max_array_size=max_array)
    run_dir = run_dir or _run_dir(resolved, profile, runs_dir)
    token = os.urandom(8).hex() if write else "<token>"    # a written script is run as it is
    parts = [(spec, render(spec, run_dir, os.path.join(run_dir, f"{spec.key}.sbatch"), token=token,
                           written=write))
             for spec in specs]
    if write:
        try:
            os.makedirs(os.path.join(run_dir, "logs"), exist_ok=True)
        except OSError as exc:
            raise RequestError(f"-o: cannot create {run_dir!r}: {exc.strerror}") from None
        for spec, text in parts:
            write_text(os.path.join(run_dir, f"{spec.key}.sbatch"), text)
    return parts


def render_text(requests, profile, runs_dir=None):
    """The script(s) a submission would write, as one text (scripts separated by a header)."""
    parts = render_plan(requests, profile, runs_dir=runs_dir)
    if len(parts) == 1:
        return parts[0][1]
    return "\n".join(f"# ===== job {spec.key} ({spec.key}.sbatch) =====\n{text}" for spec, text in parts)


def submit(requests, profile, runs_dir=None, keep_partial=False, log=_log, wait=None, wait_local=None):
    """Plan and submit a chain of requests; returns the jobs.records.RunRecord written to
    jobs.json. `wait`: None for the backend's default (local: run in the foreground; Slurm:
    never wait), False for a local run in the background (`wait_local` is its older name).
    Raises RequestError/ProfileError before anything exists, SubmitError after a failed
    submission (saying what was submitted and what became of it)."""
    from .records import SUBMITTED, RequestRecord, RunRecord

    if wait is None and wait_local is not None:
        wait = wait_local
    profile = load(profile)
    backend = backend_for(profile)
    resolved, specs = plan(requests, profile, max_array_size=backend.max_array_size(requests),
                           submitting=True)
    run_dir = _run_dir(resolved, profile, runs_dir)
    wait = backend.check(specs, run_dir, wait)
    # Created now under the next free name (another submission may have taken this one meanwhile).
    run_dir = runs_mod.new_run_dir(runs_dir or runs_mod.default_runs_dir(profile), run_name(resolved))
    for spec in specs:
        warning = lead_time_warning(spec, run_dir)
        if warning:
            log(f"warning: {warning}")
    RequestRecord(requests=[r.request.to_dict() for r in resolved], profile=profile.as_dict()).save(run_dir)
    record = RunRecord(run_dir=run_dir, profile=profile.name, profile_path=profile.path,
                       scheduler=backend.scheduler, accounting=backend.accounting(), foreground=wait)
    record.save()
    ids = {}
    for index, spec in enumerate(specs):
        try:
            jobs = backend.submit(spec, run_dir, ids, wait, log=log)
        except (SubmitError, SlurmCommandError) as exc:
            _fail(backend, record, spec, exc, keep_partial)
        ids[spec.key] = jobs[0].job_id if jobs else None
        record.jobs.extend(jobs)
        if index == len(specs) - 1 and not wait:
            record.state = SUBMITTED    # the last job of a run not waited for: one write says both
        record.save()       # after every job: a crash mid-chain still leaves the ids on disk
        failed = backend.failure(run_dir, jobs) if wait else None
        if failed:
            record.error = failed
            break
    if record.state != SUBMITTED:
        record.state = SUBMITTED
        record.save()
    return record


def _fail(backend, record, spec, exc, keep_partial):
    """Cancel (or keep) what a broken chain submitted; record and raise what really happened."""
    from .records import CANCEL_FAILED, CANCELLED_PARTIAL, PARTIAL

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
    uncertain = getattr(exc, "uncertain", False)
    what = "may or may not have been submitted" if uncertain else "not submitted"
    record.error = (f"job {spec.key!r} {what}: {exc}; submitted before it: {done}; {fate}; "
                    f"run dir {record.run_dir}")
    record.save()
    raise SubmitError(record.error, uncertain=uncertain) from None
