"""What ``--run-mode predict`` writes and where it may write it (pure Python: checked before TensorFlow).

``--predictions DIR`` is a new or an empty directory, never written over; rank ``r`` writes
``DIR/part-RRRRR.parquet`` (recsys.engine.predict) with the dataset's key columns, then :data:`COLUMNS`.
"""
from __future__ import annotations

import os
from typing import Callable

COLUMNS = ("file", "row", "score")


def part_name(rank: int) -> str:
    """The file rank ``rank`` writes in DIR."""
    return f"part-{rank:05d}.parquet"


def check_flags(mode: str, model: str, predictions: str | None, fail: Callable[[str], None]) -> None:
    """--run-mode predict and --predictions go together; NCF's test mapping is no rows to score."""
    if predictions and mode != "predict":
        fail(f"--predictions needs --run-mode predict (the run mode is {mode})")
    if mode != "predict":
        return
    if model == "ncf":
        fail("--run-mode predict: NCF's test mapping is a ranking set (each user's held-out item among "
             "sampled negatives), not rows to score; predict scores DLRM and Wide & Deep datasets")
    if not predictions:
        fail("--run-mode predict needs --predictions DIR (a new or empty directory for the scores)")


def check_directory(predictions: str, fail: Callable[[str], None]) -> None:
    """DIR is new, or an empty directory: a run never mixes its files with another's."""
    if os.path.exists(predictions):
        if not os.path.isdir(predictions):
            fail(f"--predictions {predictions}: exists and is not a directory")
        if os.listdir(predictions):
            fail(f"--predictions {predictions}: not empty (give a new or empty directory; "
                 "predictions are never written over)")
