"""Submitting Criteo preprocessing through ``recsys-submit preprocess`` (profile ``ci``) from tests,
and reading the jobs' logs back (tests/preproc/test_criteo_slurm.py, tests/faults/test_data_preproc.py)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def submit(cluster, *args) -> tuple[dict, Path]:
    """Run the CLI on the cluster's host; ({job name: job id}, run dir)."""
    result = cluster.run([sys.executable, "-m", "jobs.cli", "preprocess", "--profile", "ci", "--dataset", "criteo",
                          *map(str, args)], cwd=str(REPO), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    jobs = dict(re.findall(r"submitted (\S+) job (\d+)", result.stdout))
    run_dir = Path(re.search(r"run dir (\S+)", result.stdout).group(1))
    assert jobs, result.stdout
    return jobs, run_dir


def logs(run_dir: Path, tail: int | None = None) -> str:
    """Every job log of the run, each under a header (its last ``tail`` characters if given)."""
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-tail if tail else 0:]}"
                     for p in sorted((run_dir / "logs").glob("*.out")))
