"""Fault-injection tests share the session's local Slurm cluster (tests/conftest.py).

Every test module here marks itself `pytestmark = [pytest.mark.faults, ...]` so the suite can be
run alone (`bash tests/run.sh -m faults`), and records a `tests.faults.record.FaultResult`. This
file starts each session with an empty results file and prints the reliability table at the end.
"""
from __future__ import annotations

import os

import pytest

from tests.faults.record import RESULTS_ENV, load, results_path
from tests.faults.report import markdown


@pytest.fixture(scope="session", autouse=True)
def fault_results_file():
    path = results_path()
    if path.exists():
        path.unlink()
    os.environ[RESULTS_ENV] = str(path)
    yield path


def pytest_terminal_summary(terminalreporter):
    results = load()
    if results:
        terminalreporter.section("fault injection (tests/faults)")
        terminalreporter.write_line(markdown(results))
