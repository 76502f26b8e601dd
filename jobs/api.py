"""The Python API: the same operations as the `recsys-submit` CLI.

    from jobs.api import JobRequest, build_chain, submit, status, watch, logs, cancel, requeue
    run = submit([JobRequest(kind="benchmark", model="hello", nodes=2)], "ci")
    chain = build_chain("train", model="dlrm", preprocess_from="/raw", data_path="/data",
                        then_evaluate=True, profile="ci")      # preprocess -> train -> evaluate
    print(watch(submit(chain, "ci")["run_dir"])["jobs"])          # finished jobs carry ["summary"]
    record, submitted = run_study(load_spec("docs/studies/dlrm-strong.yaml"), "ci")
    report, paths = report_study(record.study_dir)                  # scaling.{md,csv,json,png}
"""

from . import runs as runs_mod
from .backends import backend_class
from .errors import RequestError, SlurmCommandError, SubmitError
from .request import JobRequest, build_chain
from .status import log_files, poll, watch
from .submit import load, render_plan, render_text, submit

__all__ = ["JobRequest", "build_chain", "RequestError", "SubmitError", "SlurmCommandError", "render",
           "render_plan", "submit", "status", "watch", "logs", "log_files", "cancel", "requeue",
           "find_run", "load_profile", "load_spec", "run_study", "study_status", "report_study"]

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


def load_spec(path):
    """A validated jobs.study.StudySpec from a study YAML file."""
    from .study import load_spec as _load

    return _load(path)


def run_study(spec, profile, runs_dir=None, max_concurrent=None):
    """Submit the missing or failed points of a study: (StudyRecord, [point ids submitted])."""
    from .study_run import run

    return run(spec, profile, runs_dir=runs_dir, max_concurrent=max_concurrent)


def study_status(study_dir):
    """One poll of every point of a study (one Slurm call): a jobs.study_run.StudyStatus."""
    from .study_run import StudyRecord, poll

    return poll(StudyRecord.load(study_dir))


def report_study(study_dir, out_dir=None, plot=None):
    """Write the study's scaling table and plot; returns (report dict, {kind: path})."""
    from .study_report import write

    return write(study_dir, out_dir=out_dir, want_plot=plot)
