"""The typed pieces of a job's command line that only the backend can write out.

A rendered script names the repo's slurm/ helpers and paths inside the run directory through
variables it exports ($RECSYS_SLURM_DIR, $RECSYS_RUN_DIR, $RECSYS_JOB_KEY, $RECSYS_JOB_TAG); the
local backend writes the real paths. Distinct str types, so that no user-provided string is ever
left unquoted: only these keep their variables expandable.
"""

import os
import sys

from jobs.runs.rundir import ENGINE_LOG_SUFFIX


def slurm_dir():
    """Directory of the repo's slurm/ helpers (bind.sh, spark-standalone.sh, the template).
    `slurm` is installed as a top-level package next to `jobs`, in a checkout and a wheel."""
    import slurm

    return os.path.dirname(os.path.abspath(slurm.__file__))


def job_python(profile, override=None):
    """Interpreter the ranks run: request > profile > 'python' in a container > this one."""
    if override:
        return override
    if profile.python:
        return profile.python
    if profile.container is not None:
        return "python"
    return sys.executable


class SlurmHelper(str):
    """A script of the repo's slurm/ dir, written as "$RECSYS_SLURM_DIR/<name>" in a rendered
    script."""

    def __new__(cls, name):
        return super().__new__(cls, f"$RECSYS_SLURM_DIR/{name}")

    @property
    def name(self):
        return self[len("$RECSYS_SLURM_DIR/"):]


class RunPath(str):
    """A path inside the run dir, written as "$RECSYS_RUN_DIR/<relative>" in a rendered script
    (the script exports RECSYS_RUN_DIR; the local backend writes the path out). The run dir is
    only known at submission, so what a chain hands from one job to the next (the checkpoint dir
    of a train job to its evaluate job) is named this way."""

    PREFIX = "$RECSYS_RUN_DIR/"

    def __new__(cls, relative):
        return super().__new__(cls, f"{cls.PREFIX}{relative}")

    @property
    def relative(self):
        return self[len(self.PREFIX):]

    def __getnewargs__(self):
        return (self.relative,)

    def under(self, run_dir):
        """The real path in `run_dir`."""
        return os.path.join(run_dir, self.relative)


class EngineLog(RunPath):
    """The engine's JSON-lines log of a job, logs/<key>-<tag>.engine.jsonl in its run dir.

    The submission layer passes it as `--log-path` so that every job's records (and its
    `summary`) land in the run dir without the user asking. Its tag (job id, array task, local
    pid) is only known when the job starts, so a rendered script writes it as shell variables the
    script itself exports; the local backend substitutes the path."""

    SUFFIX = ENGINE_LOG_SUFFIX

    def __new__(cls):
        return super().__new__(cls, f"logs/$RECSYS_JOB_KEY-$RECSYS_JOB_TAG{cls.SUFFIX}")

    def __getnewargs__(self):
        return ()
