"""The one exception type the preprocessing CLI turns into a one-line error.

Raise ``PreprocError("<file|flag>: <problem>")`` for anything the user can fix
(bad flags, missing input, an existing output, bad rows under ``--bad-rows
fatal``); ``preproc.cli.main`` prints it as ``preproc: error: <message>`` and
exits with status 2, before Spark starts whenever the check does not need data.
``OutputError`` (a ``PreprocError``) is a failure to write the output that is not
the input's fault, e.g. a full disk: same one line, exit status 1. Both derive from
slurm.common.errors.ToolkitError, the toolkit's one base class.
"""
from slurm.common.errors import ToolkitError


class PreprocError(ToolkitError, ValueError):
    """A user-facing problem, reported as one line naming the file, key or flag."""


class OutputError(PreprocError):
    """Writing an output failed (no space left on the device): one line, exit status 1."""

    exit_status = 1
