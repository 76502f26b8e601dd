"""The order test files start in: the longest first (tests/file_seconds.json, measured), so that
under pytest-xdist (`--dist loadfile --no-loadscope-reorder`, tests/run.sh) the run does not end
on one worker's long file while the other worker is idle (longest-processing-time-first).

xdist's own reordering sorts files by their number of tests, which puts the long one-test
files (the combination matrix, the real-data trainings) last. Files without a measurement keep
their collection order, after the measured ones. Refresh the measurements after a full run:
`RECSYS_FILE_SECONDS=tests/file_seconds.json bash tests/run.sh` writes every file's seconds.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence, TypeVar

SECONDS_FILE = Path(__file__).with_name("file_seconds.json")
RECORD_ENV = "RECSYS_FILE_SECONDS"

Item = TypeVar("Item")


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def load_seconds(path: Path = SECONDS_FILE) -> dict[str, float]:
    """The measured seconds per test file; empty when the file is absent."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return {str(k): float(v) for k, v in data.get("seconds", {}).items()}


def longest_first(items: Sequence[Item], nodeid_of, seconds: Mapping[str, float]) -> list[Item]:
    """The items regrouped by file, the files ordered by measured seconds (longest first), then
    the unmeasured ones in the order they came; a file's own tests keep their order."""
    files: dict[str, list[Item]] = {}
    for item in items:
        files.setdefault(file_of(nodeid_of(item)), []).append(item)
    order = sorted(enumerate(files), key=lambda pair: (-seconds.get(pair[1], 0.0), pair[0]))
    return [item for _, path in order for item in files[path]]


def write_seconds(path: Path, seconds: Mapping[str, float], run: str) -> None:
    """Every file's seconds of one run (temporary name, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"version": 1, "run": run,
                               "seconds": {k: round(v, 1) for k, v in sorted(seconds.items())}},
                              indent=1) + "\n")
    tmp.replace(path)
