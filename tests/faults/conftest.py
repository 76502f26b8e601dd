"""Fault-injection tests share the session's local Slurm cluster (tests/conftest.py).

Every test module here marks itself `pytestmark = [pytest.mark.faults, ...]` so the suite can be
run alone (`bash tests/run.sh -m faults`), and records a `tests.faults.record.FaultResult`. This
run starts with an empty results file and prints the reliability table at the end (tests/conftest.py:
pytest_configure and pytest_terminal_summary, once per run, pytest-xdist workers included).
"""
from __future__ import annotations

import pytest

from tests.faults.train_helpers import ROWS, make_data
from tests.jobs.submit_helpers import Cli


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The training faults' small DLRM dataset (3 epochs of 32 steps at batch 512), one per module."""
    return make_data(tmp_path_factory.mktemp("train-data"), rows=ROWS)


@pytest.fixture
def cli(slurm_cluster, tmp_path):
    """`recsys-submit` against the session cluster, run directories under the test's tmp dir."""
    return Cli(slurm_cluster.env, tmp_path / "runs")
