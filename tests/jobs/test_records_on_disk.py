"""The records a run or study keeps on disk (issue 33): written exclusively and all or nothing,
one line for a full disk, private to their owner, and read back with one line for a record that
is valid JSON with wrong fields. No cluster: the writer, the records and the run directories."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest

from jobs.errors import RequestError, StorageError
from jobs.runs import atomic, rundir
from jobs.runs.records import RequestRecord, RunRecord
from jobs.study.running.record import StudyRecord
from tests.tmpfs import fill, small_tmpfs

pytestmark = pytest.mark.fast

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_planted_symlink_at_a_predictable_temporary_name_is_never_followed(tmp_path):
    """Anyone who can write into a shared run dir could plant `<file>.tmp.<pid>` -> a file of the
    owner's: the writer must create its temporary exclusively under a name nobody can guess."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    run = tmp_path / "run"
    run.mkdir()
    for pid in {os.getpid(), os.getpid() + 1}:
        (run / f"jobs.json.tmp.{pid}").symlink_to(victim)
    (run / "request.json").symlink_to(victim)           # the target itself a planted symlink
    atomic.write_json(run / "jobs.json", {"a": 1})
    atomic.write_text(run / "request.json", "{}\n")
    atomic.write_group({run / "jobs.json": "{}\n", run / "table.md": "x"})
    assert victim.read_text() == "precious\n"
    assert not (run / "request.json").is_symlink() and (run / "request.json").read_text() == "{}\n"
    left = sorted(p.name for p in run.iterdir() if ".tmp." in p.name and not p.is_symlink())
    assert left == []


def test_the_file_mode_follows_the_umask_not_the_temporary(tmp_path):
    atomic.write_text(tmp_path / "script", "echo\n", mode=0o755)
    atomic.write_json(tmp_path / "record.json", {})
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(tmp_path / "script").st_mode) == 0o755 & ~umask
    assert stat.S_IMODE(os.stat(tmp_path / "record.json").st_mode) == 0o666 & ~umask


@pytest.fixture
def full_fs(tmp_path):
    with small_tmpfs(tmp_path / "full", "64k") as mount:
        yield mount


def test_a_full_disk_is_one_line_with_the_free_space_and_leaves_nothing(full_fs):
    atomic.write_json(full_fs / "jobs.json", {"old": True})
    fill(full_fs)
    for write in (lambda: atomic.write_json(full_fs / "jobs.json", {"new": "x" * 20000}),
                  lambda: atomic.write_text(full_fs / "main.sbatch", "y" * 20000),
                  lambda: atomic.write_group({full_fs / "jobs.json": "z" * 20000, full_fs / "t.md": "t"})):
        with pytest.raises(StorageError) as caught:
            write()
        message = str(caught.value)
        assert "\n" not in message and "No space left on device" in message and "free on its file system" in message
        assert str(full_fs) in message
    assert json.loads((full_fs / "jobs.json").read_text()) == {"old": True}
    assert sorted(os.listdir(full_fs)) == ["filler", "jobs.json"]


def test_run_and_study_directories_are_private_to_their_owner_or_the_profiles_group(tmp_path):
    run = rundir.new_run_dir(str(tmp_path / "runs"), "train-dlrm")
    assert stat.S_IMODE(os.stat(run).st_mode) == 0o700
    shared = rundir.new_run_dir(str(tmp_path / "runs"), "train-ncf", group="daemon")
    info = os.stat(shared)
    import grp

    assert stat.S_IMODE(info.st_mode) == 0o2750 and info.st_gid == grp.getgrnam("daemon").gr_gid
    with pytest.raises(RequestError, match="defaults.runs_group: no Unix group 'no-such-group'"):
        rundir.new_run_dir(str(tmp_path / "runs"), "x", group="no-such-group")


def test_a_runs_dir_with_a_percent_sign_is_refused_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "benchmark", "--profile", "ci", "--model", "hello",
                           "--runs-dir", str(tmp_path / "runs-%j")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--runs-dir" in proc.stderr and "'%'" in proc.stderr
    assert not os.path.exists(tmp_path / "runs-%j")


GOOD_RUN = {"version": 1, "run_dir": "/r", "profile": "ci", "profile_path": None, "scheduler": "slurm",
            "state": "submitted", "jobs": [{"key": "main", "name": "m", "job_id": "7"}]}
BAD_RUNS = [
    ({"jobs": "main"}, "'jobs' is a string"),
    ({"jobs": [3]}, "'jobs': item 0 is a number"),
    ({"jobs": [{"key": "main"}]}, "'jobs[].name' is missing"),
    ({"jobs": [{"key": "main", "name": "m", "job_id": 7}]}, "'jobs[].job_id' is a number"),
    ({"jobs": [{"key": "main", "name": "m", "job_id": "7", "array_size": "4"}]}, "'jobs[].array_size' is a string"),
    ({"jobs": [{"key": "main", "name": "m", "job_id": "7", "after_ok": "5"}]}, "'jobs[].after_ok' is a string"),
    ({"state": None}, "'state' is null"),
    ({"scheduler": ["slurm"]}, "'scheduler' is a list"),
    ({"accounting": "yes"}, "'accounting' is a string"),
    ({"intent": "main"}, "'intent' is a string"),
    ({"intent": {"key": "main", "name": "m", "job_id": None, "submitted_at": "now"}}, "'intent.submitted_at'"),
    ({"planned": "main"}, "'planned' is a string"),
]


@pytest.mark.parametrize("change,expected", BAD_RUNS, ids=[e for _, e in BAD_RUNS])
def test_a_run_record_with_wrong_fields_is_one_line_naming_the_field(tmp_path, change, expected):
    (tmp_path / "jobs.json").write_text(json.dumps(dict(GOOD_RUN, **change)))
    with pytest.raises(RequestError) as caught:
        RunRecord.load(str(tmp_path))
    assert expected in str(caught.value) and "jobs.json" in str(caught.value) and "\n" not in str(caught.value)


def test_a_record_without_a_required_field_is_one_line(tmp_path):
    data = dict(GOOD_RUN)
    del data["run_dir"]
    (tmp_path / "jobs.json").write_text(json.dumps(data))
    with pytest.raises(RequestError, match="field 'run_dir' is missing"):
        RunRecord.load(str(tmp_path))
    (tmp_path / "request.json").write_text(json.dumps({"version": 1, "requests": {}, "profile": {}}))
    with pytest.raises(RequestError, match="'requests' is an object"):
        RequestRecord.load(str(tmp_path))
    (tmp_path / "study.json").write_text(json.dumps({"version": 1, "name": "s", "study_dir": "/s", "profile": "ci",
                                                     "profile_path": None, "scheduler": "slurm", "spec": {},
                                                     "created": 1.0, "points": [{"id": "g1"}]}))
    with pytest.raises(RequestError, match="'points\\[\\].nodes' is missing"):
        StudyRecord.load(str(tmp_path))


def test_the_cli_says_one_line_for_a_damaged_record(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "jobs.json").write_text(json.dumps(dict(GOOD_RUN, jobs=[{"key": "main"}])))
    for command in (["status", str(run)], ["cancel", str(run)], ["requeue", str(run)]):
        proc = subprocess.run([sys.executable, "-m", "jobs.cli", *command], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert "jobs.json: field 'jobs[].name' is missing" in proc.stderr
