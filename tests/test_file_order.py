"""The suite's start order (tests/file_order.py): the measured longest files first, each file's
tests together and in their own order, the unmeasured files after, as collected."""
from __future__ import annotations

import json

import pytest

from tests.file_order import SECONDS_FILE, load_seconds, longest_first, write_seconds

pytestmark = pytest.mark.fast


def test_longest_files_first_and_a_files_tests_stay_together_in_order():
    ids = ["a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "d.py::t1", "b.py::t2"]
    seconds = {"b.py": 300.0, "c.py": 20.0}
    assert longest_first(ids, str, seconds) == ["b.py::t1", "b.py::t2", "c.py::t1",
                                                "a.py::t1", "a.py::t2", "d.py::t1"]


def test_written_seconds_read_back_and_no_temporary_file_is_left(tmp_path):
    path = tmp_path / "file_seconds.json"
    write_seconds(path, {"tests/x.py": 12.345, "tests/a.py": 1.0}, run="2026-11-30")
    assert load_seconds(path) == {"tests/a.py": 1.0, "tests/x.py": 12.3}
    assert json.loads(path.read_text())["version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["file_seconds.json"]
    assert load_seconds(tmp_path / "absent.json") == {}


def test_the_measured_files_exist():
    """A renamed or removed test file must not keep a stale place at the front."""
    root = SECONDS_FILE.parent.parent
    missing = [path for path in load_seconds() if not (root / path).is_file()]
    assert not missing, f"tests/file_seconds.json names files that are gone: {missing}"
