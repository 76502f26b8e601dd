"""One-line errors of the submission layer.

Every error a user can cause (bad flag, impossible request, failed sbatch) is raised as one of
these with a single-line message naming the flag, key or job involved; the CLI prints it and
exits non-zero. Profile errors come from jobs.profiles.ProfileError (same convention). Every one
derives from slurm.common.errors.ToolkitError, the toolkit's one base class (jobs.api.ToolkitError).
"""
from slurm.common.errors import ToolkitError


class RequestError(ToolkitError, ValueError):
    """The job request is invalid; raised before anything is submitted."""


class SubmitError(ToolkitError, RuntimeError):
    """Slurm refused or failed a submission (after retries of transient failures). `uncertain`:
    the controller could not be asked whether the job went in after all."""

    def __init__(self, message, uncertain=False):
        super().__init__(message)
        self.uncertain = uncertain


class SlurmCommandError(ToolkitError, RuntimeError):
    """A scheduler command (squeue, sacct, scancel, ...) failed. `transient`: the controller did
    not answer (restarting, overloaded), so asking again later may work; the backend that ran
    the command decides (jobs.backends.slurm.commands)."""

    def __init__(self, message, transient=False):
        super().__init__(message)
        self.transient = transient


class StorageError(ToolkitError, RuntimeError):
    """A record or script could not be written (a full disk, a quota, a read-only or foreign
    directory): one line naming the file and, for a full disk, the free space left; nothing of
    the file is left behind (jobs.runs.atomic)."""


class ResultsNotSaved(UserWarning):
    """Fresh results a read could not save (results.json, a run's status.json): reading a study
    or a run never needs to write it, so the command goes on with them (a warning, not an error);
    the CLI says where and why in one line, once per command."""
