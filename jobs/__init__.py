"""recsys-submit: cluster profiles -> Slurm jobs (or local runs) for the recsys engines.

The public API lives in jobs.api (submit, render, status, watch, logs, cancel, requeue,
JobRequest, build_chain, the study operations); it is re-exported here lazily so that
`import jobs.profiles` (data only) never loads the execution layer. The package layout and its
one-way layers: docs/architecture.md.
"""

# `jobs.submit` and `jobs.status` are modules (the orchestrator, status polling), never these
# re-exports: their functions are jobs.api.submit and jobs.api.status.
_API = ("JobRequest", "build_chain", "render", "render_plan", "watch", "logs", "cancel",
        "requeue", "find_run", "load_profile", "RequestError", "SubmitError", "SlurmCommandError",
        "load_spec", "run_study", "study_status", "report_study", "compare_studies", "reference_study")


def __getattr__(name):
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'jobs' has no attribute {name!r}")


__all__ = list(_API)
