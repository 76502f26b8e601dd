"""The Python API: the same operations as the `recsys-submit` CLI.

    from jobs.api import JobRequest, build_chain, submit, status, watch, logs, cancel, requeue
    run = submit([JobRequest(kind="benchmark", model="hello", nodes=2)], "ci")
    chain = build_chain("train", model="dlrm", preprocess_from="/raw", data_path="/data",
                        then_evaluate=True, profile="ci")      # preprocess -> train -> evaluate
    print(watch(submit(chain, "ci")["run_dir"])["jobs"])
"""

from . import runs as runs_mod
from .backends import backend_class
from .errors import RequestError, SlurmCommandError, SubmitError
from .request import JobRequest, build_chain
from .status import log_files, poll, watch
from .submit import load, render_plan, render_text, submit

__all__ = ["JobRequest", "build_chain", "RequestError", "SubmitError", "SlurmCommandError", "render",
           "render_plan", "submit", "status", "watch", "logs", "log_files", "cancel", "requeue",
           "find_run", "load_profile"]

find_run = runs_mod.find_run


def load_profile(name_or_path):
    return load(name_or_path)


def render(requests, profile, runs_dir=None):
    """The script(s) a submission would write, as one text (scripts separated by a header)."""
    if isinstance(requests, JobRequest):
        requests = [requests]
    return render_text(requests, profile, runs_dir=runs_dir)


def status(run_dir):
    """One poll (jobs.records.StatusResult): result["jobs"][i]["state"], ["done"], ["calls"]."""
    return poll(run_dir)


def logs(run_dir, rank=None, key=None):
    """Concatenated text of the run's batch logs (or one rank's logs)."""
    chunks = []
    for path in log_files(run_dir, key=key, rank=rank):
        with open(path, errors="replace") as handle:
            chunks.append(f"==> {path} <==\n{handle.read()}")
    return "\n".join(chunks)


def _backend(run_dir):
    record = runs_mod.load_run(run_dir)
    return backend_class(record.scheduler)(), record


def cancel(run_dir):
    """Cancel every job of a run (one scancel call on Slurm); returns the ids."""
    backend, record = _backend(run_dir)
    backend.cancel(run_dir, record.jobs)
    return [j.job_id for j in record.jobs]


def requeue(run_dir):
    """Requeue every job of a run (one scontrol call on Slurm); returns the ids."""
    backend, record = _backend(run_dir)
    return backend.requeue(run_dir, record.jobs) or []
