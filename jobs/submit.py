"""Submission: render a plan into a run directory and sbatch it job by job.

Jobs of a chain are submitted in order, each with the ids of the jobs it waits for. If one
sbatch fails (after transient retries), the error says exactly which jobs went in; they are
cancelled unless keep_partial, and jobs.json records both.
"""

import os
import sys

from . import runs as runs_mod
from . import slurmcli
from .errors import SlurmCommandError, SubmitError
from .plan import plan, run_name
from .render import render


def _log(message):
    print(f"recsys-submit: {message}", file=sys.stderr)


def load(profile):
    """A Profile from a name, a path or an already loaded Profile."""
    if hasattr(profile, "node"):
        return profile
    from .profiles import load_profile

    return load_profile(profile)


def _max_array(requests, profile):
    """The cluster's MaxArraySize, asked of Slurm only when the plan has an array."""
    if profile.scheduler != "slurm" or not any(r.array or r.shards for r in requests):
        return getattr(profile, "max_array_size", 1001)
    return slurmcli.max_array_size(getattr(profile, "max_array_size", 1001))


def render_plan(requests, profile, run_dir=None, max_array_size=None):
    """[(spec, script text)] without submitting; dependencies show as <key> placeholders."""
    profile = load(profile)
    resolved, specs = plan(requests, profile, max_array_size=max_array_size or _max_array(requests, profile))
    run_dir = run_dir or runs_mod.new_run_dir(runs_mod.default_runs_dir(profile), run_name(resolved), create=False)
    return [(spec, render(spec, run_dir, os.path.join(run_dir, f"{spec.key}.sbatch"), token="<token>"))
            for spec in specs]


def render_text(requests, profile):
    """The script(s) a submission would write, as one text (scripts separated by a header)."""
    parts = render_plan(requests, profile)
    if len(parts) == 1:
        return parts[0][1]
    return "\n".join(f"# ===== job {spec.key} ({spec.key}.sbatch) =====\n{text}" for spec, text in parts)


def _record(run_dir, profile, submitted, state, error=None):
    data = {
        "run_dir": run_dir,
        "profile": profile.name,
        "profile_path": getattr(profile, "path", None),
        "scheduler": profile.scheduler,
        "accounting": slurmcli.accounting_enabled() if profile.scheduler == "slurm" else False,
        "state": state,             # submitting | submitted | partial | cancelled-partial
        "jobs": submitted,
    }
    if error:
        data["error"] = error
    runs_mod.write_json(os.path.join(run_dir, "jobs.json"), data)
    return data


def submit(requests, profile, runs_dir=None, keep_partial=False, log=_log, wait_local=True):
    """Plan, render and submit a chain of requests; returns the jobs.json record.
    Raises RequestError/ProfileError before anything is submitted, SubmitError after a
    failed sbatch (saying what was submitted and whether it was cancelled)."""
    profile = load(profile)
    if profile.scheduler == "local":
        from .local import submit_local

        return submit_local(requests, profile, runs_dir=runs_dir, log=log, wait=wait_local)
    resolved, specs = plan(requests, profile, max_array_size=_max_array(requests, profile))
    run_dir = runs_mod.new_run_dir(runs_dir or runs_mod.default_runs_dir(profile), run_name(resolved))
    runs_mod.write_json(os.path.join(run_dir, "request.json"),
                        {"requests": [r.request.to_dict() for r in resolved],
                         "profile": _profile_dict(profile)})
    submitted, ids = [], {}
    for index, spec in enumerate(specs):
        token = os.urandom(8).hex()
        script = os.path.join(run_dir, f"{spec.key}.sbatch")
        text = render(spec, run_dir, script, ids=ids, token=token)
        with open(script, "w") as handle:
            handle.write(text)
        try:
            job_id = slurmcli.sbatch(script, token, log=log)
        except (SubmitError, SlurmCommandError) as exc:
            _fail(run_dir, profile, submitted, spec, exc, keep_partial)
        ids[spec.key] = job_id
        submitted.append({"key": spec.key, "name": spec.name, "job_id": job_id,
                          "array_size": spec.array_size, "task_offset": spec.task_offset,
                          "script": script, "token": token,
                          "after_ok": [ids[k] for k in spec.after_ok] + list(spec.external_after),
                          "after_any": [ids[k] for k in spec.after_any]})
        # jobs.json after every sbatch: a crash mid-chain still leaves the ids on disk
        record = _record(run_dir, profile, submitted,
                         "submitted" if index == len(specs) - 1 else "submitting")
    return record


def _fail(run_dir, profile, submitted, spec, exc, keep_partial):
    done = ", ".join(f"{j['key']}={j['job_id']}" for j in submitted) or "none"
    if submitted and not keep_partial:
        proc = slurmcli.run(["scancel"] + [j["job_id"] for j in submitted])
        fate = "cancelled them" if proc.returncode == 0 else \
            f"could NOT cancel them ({slurmcli.first_line(proc.stderr)})"
        state = "cancelled-partial"
    else:
        fate = "kept them (--keep-partial)" if submitted else "nothing to cancel"
        state = "partial"
    message = (f"job {spec.key!r} not submitted: {exc}; submitted before it: {done}; {fate}; "
               f"run dir {run_dir}")
    _record(run_dir, profile, submitted, state, error=message)
    raise SubmitError(message) from None


def _profile_dict(profile):
    try:
        return profile.as_dict()
    except Exception:   # a profile object without as_dict (tests): record the name only
        return {"name": profile.name}
