"""The Python API: the same operations as the `recsys-submit` CLI.

    from jobs.api import JobRequest, submit, status, watch, logs, cancel, requeue, render
    run = submit([JobRequest(kind="benchmark", model="hello", nodes=2)], "ci")
    print(watch(run["run_dir"])["jobs"])
"""

import os

from . import runs as runs_mod
from . import slurmcli
from .errors import RequestError, SlurmCommandError, SubmitError
from .request import JobRequest
from .status import log_files, poll, watch
from .submit import load, render_plan, render_text, submit

__all__ = ["JobRequest", "RequestError", "SubmitError", "SlurmCommandError", "render", "render_plan",
           "submit", "status", "watch", "logs", "cancel", "requeue", "find_run", "load_profile"]

find_run = runs_mod.find_run


def load_profile(name_or_path):
    return load(name_or_path)


def render(requests, profile):
    """The script(s) a submission would write, as one text (scripts separated by a header)."""
    if isinstance(requests, JobRequest):
        requests = [requests]
    return render_text(requests, profile)


def status(run_dir):
    """One poll: {"jobs": [{key, job_id, state, tasks}], "done": bool, "calls": n, ...}."""
    return poll(run_dir)


def logs(run_dir, rank=None, key=None):
    """Concatenated text of the run's batch logs (or one rank's logs)."""
    chunks = []
    for path in log_files(run_dir, key=key, rank=rank):
        with open(path, errors="replace") as handle:
            chunks.append(f"==> {path} <==\n{handle.read()}")
    return "\n".join(chunks)


def _job_ids(record):
    return [j["job_id"] for j in record.get("jobs", [])]


def cancel(run_dir):
    """Cancel every job of a run (one scancel call); returns the ids."""
    record = runs_mod.load_run(run_dir)
    if record.get("scheduler") == "local":
        from .local import local_cancel

        local_cancel(record)
        return _job_ids(record)
    ids = _job_ids(record)
    if ids:
        proc = slurmcli.run(["scancel"] + ids)
        if proc.returncode != 0:
            raise SlurmCommandError(f"scancel: {slurmcli.first_line(proc.stderr)}")
    return ids


def requeue(run_dir):
    """Requeue every unfinished-or-failed job of a run (one scontrol call)."""
    record = runs_mod.load_run(run_dir)
    if record.get("scheduler") == "local":
        raise RequestError("requeue: local runs are not requeued; submit again")
    ids = _job_ids(record)
    if ids:
        proc = slurmcli.run(["scontrol", "requeue", ",".join(ids)])
        if proc.returncode != 0:
            raise SlurmCommandError(f"scontrol requeue: {slurmcli.first_line(proc.stderr)}")
        cache = os.path.join(run_dir, "status.json")
        if os.path.exists(cache):
            os.remove(cache)
    return ids
