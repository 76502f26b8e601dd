"""Fault-injection results: one typed, versioned JSON line per fault test.

Each test in tests/faults/ appends a `FaultResult` when it finishes (pass or fail), so
`python -m tests.faults.report` can print the reliability table a user reads: fault,
trials, survived, data lost (must be 0), time to recover.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

RESULTS_ENV = "RECSYS_FAULT_RESULTS"
DEFAULT_RESULTS = Path(__file__).resolve().parents[2] / ".fault-results.jsonl"
VERSION = 1


@dataclass(frozen=True)
class FaultResult:
    """What one fault test showed: `data_lost` counts lost or half-written items (0 is the goal)."""

    fault: str                 # short name, e.g. "node lost mid-training"
    trials: int                # injections made
    survived: int              # trials after which the run ended correctly
    data_lost: int             # checkpoints/shards/steps/jobs lost or half-written over all trials
    recover_s: Optional[float]  # median seconds from the fault to the run working again
    detail: str = ""           # one line: what was checked
    version: int = VERSION

    def __post_init__(self):
        if self.trials < 1 or not 0 <= self.survived <= self.trials or self.data_lost < 0:
            raise ValueError(f"inconsistent fault result: {self}")


def results_path() -> Path:
    return Path(os.environ.get(RESULTS_ENV) or DEFAULT_RESULTS)


def record(result: FaultResult, path: Optional[Path] = None) -> None:
    """Append one result line (a single write of a whole line, so concurrent tests never interleave)."""
    target = Path(path) if path else results_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(asdict(result), sort_keys=True) + "\n"
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(line)


def load(path: Optional[Path] = None) -> list:
    """Every result in the file; for a fault recorded more than once, the last one wins."""
    target = Path(path) if path else results_path()
    if not target.exists():
        return []
    latest = {}
    for number, line in enumerate(target.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        raw = json.loads(line)
        if raw.get("version") != VERSION:
            raise ValueError(f"{target}: line {number}: unknown fault-result version {raw.get('version')!r}")
        result = FaultResult(**raw)
        latest[result.fault] = result
    return list(latest.values())
