"""A report is written as a whole or not at all (`study report`, `study compare`): on a file
system with room for the new tables but not the new plot, the command exits 1 with one line
naming the file and the free space, leaves no temporary, and the previous report's files are
byte-identical (no new table beside an old plot).

Fast tier: the studies are written on disk as real ones look (test_study_compare.make_study, no
Slurm call), the full disk is a real tmpfs (mounting needs root, which the suite runs as)."""

import os
import re

import pytest

from jobs import cli

from test_study_compare import BASE, make_study

pytestmark = pytest.mark.fast
from tests.tmpfs import fill, small_tmpfs

ROOM = 16 * 1024        # what is left free: the new tables fit, the new plot does not


@pytest.fixture
def small_fs(tmp_path):
    """A 256 KiB tmpfs, unmounted at the end."""
    with small_tmpfs(tmp_path / "small", "256k") as mnt:
        yield mnt


def _files(out):
    return {name: (out / name).read_bytes() for name in sorted(os.listdir(out))}


@pytest.mark.parametrize("action", ["report", "compare"])
def test_a_report_on_a_full_disk_leaves_the_previous_one_whole(action, tmp_path, small_fs, capsys):
    study = make_study(tmp_path, "base", BASE)
    out = small_fs / "out"
    args = ["study", action] + ([study] if action == "report" else [study, study]) + ["--out", str(out), "--plot"]
    assert cli.main(args) == 0, capsys.readouterr().err
    capsys.readouterr()
    before = _files(out)
    png = "scaling.png" if action == "report" else "compare.png"
    assert before[png][:8] == b"\x89PNG\r\n\x1a\n" and len(before[png]) > ROOM
    fill(small_fs, ROOM)

    assert cli.main(args) == 1
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert re.fullmatch(rf"recsys-submit: error: cannot write {re.escape(str(out))}/\S+: No space left on device "
                        r"\(\d[\d.]* (B|KiB) free on its file system\); nothing of it was left", lines[0]), lines[0]
    assert "Traceback" not in captured.err and captured.out == ""     # nothing printed as written
    assert _files(out) == before        # the same names (no temporary left) and the same bytes
