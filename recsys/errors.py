"""The engine's own errors: what a user can fix, reported as one line at the entry point.

``recsys.train.main`` prints ``recsys-train: error: <message>`` and exits with
``exit_code``: 2 for bad input (flags, data, checkpoint), 1 for a run that
diverged. Nothing below the entry point calls ``sys.exit``. Each derives from
slurm.common.errors.ToolkitError, the toolkit's one base class.
"""
from __future__ import annotations

from slurm.common.errors import ToolkitError


class EngineError(ToolkitError):
    """Bad flags, configuration or environment: one line, exit 2."""
    exit_code = 2


class DataError(EngineError):
    """Bad data in a dataset file; the message names the file (and row/column where known)."""


class DivergedError(EngineError):
    """Non-finite loss or predictions: the run stops (exit 1), the last good checkpoint stays."""
    exit_code = 1


def data_error_message(err) -> "str | None":
    """The one-line message of a reader's data error that tf.data re-raised as an OpError, else None.

    Readers run inside tf.data (``numpy_function``, ``from_generator``): their exception reaches
    the engine as ``tf.errors.OpError`` whose text holds ``DataError: <message>``.
    """
    text = getattr(err, "message", None) or str(err)
    for marker in ("DataError: ", "FeatureSpecError: "):
        at = text.find(marker)
        if at >= 0:
            return text[at + len(marker):].splitlines()[0].strip()
    return None
