"""Records that survive a crash of the host and a move, and that cannot be made to hurt the reader
(issue 43, items 5 and 7): one temporary-file scheme (slurm/common/atomicfile.py) whose durable writes
fsync the directory after the rename, new run and study directories synced in their parent, a
killed writer's temporary removed by the next write, study.json paths relative to the study, and
records too large or nested too deep refused in one line before they cost memory."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys

import pytest

from jobs.errors import RequestError
from jobs.runs import atomic, rundir
from jobs.runs.records import RunRecord
from jobs.study.running.record import PointRecord, StudyRecord
from slurm.common import atomicfile

pytestmark = pytest.mark.fast


@pytest.fixture
def synced(monkeypatch):
    """[(what, path)] of every fsync ("file" or "dir", by the fd's kind) and rename, in order."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        events.append((kind, os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst, **kw):
        events.append(("rename", os.path.abspath(dst)))
        return real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def run_record(run_dir):
    return RunRecord(run_dir=str(run_dir), profile="ci", profile_path=None, scheduler="slurm", planned=["main"])


def study_record(study_dir, runs=()):
    point = PointRecord(id="g1", nodes=1, gpus_per_node=1, gpus=1, batch_per_gpu=64, global_batch=64, variant={},
                        variant_label="default", repeat=0, runs=list(runs))
    return StudyRecord(name="s", study_dir=str(study_dir), profile="ci", profile_path=None, scheduler="slurm",
                       spec={}, created=0.0, points=[point])


def test_a_durable_record_syncs_its_directory_after_the_rename(tmp_path, synced):
    run = tmp_path / "run"
    run.mkdir()
    run_record(run).save(durable=True)       # the intent before sbatch
    study = tmp_path / "study"
    study.mkdir()
    study_record(study).save(durable=True)   # a point's run dir before its sbatch
    for directory, name in ((run, "jobs.json"), (study, "study.json")):
        target = str(directory / name)
        mine = [e for e in synced if e[1].startswith(str(directory))]
        kinds = [k for k, _ in mine]
        assert kinds == ["file", "rename", "dir"], mine
        assert mine[1][1] == target and mine[2][1] == str(directory)


def test_a_cache_write_syncs_nothing(tmp_path, synced):
    atomic.write_json(tmp_path / "cache.json", {"a": 1})
    assert [k for k, _ in synced] == ["rename"]


def test_a_new_run_dir_is_synced_in_its_parent(tmp_path, synced):
    run = rundir.new_run_dir(str(tmp_path / "runs"), "bench")
    assert ("dir", str(tmp_path / "runs")) in synced and os.path.isdir(os.path.join(run, "logs"))


def killed_writer(path):
    """Leave the temporary of a writer of `path` that was SIGKILLed after staging it."""
    code = ("import os, signal, sys; from slurm.common import atomicfile; atomicfile.stage(sys.argv[1], b'half');"
            "os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], cwd=os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))))
    assert proc.returncode == -signal.SIGKILL
    left = [n for n in os.listdir(os.path.dirname(path)) if n.startswith(f".{os.path.basename(path)}.tmp.")]
    assert len(left) == 1
    return left[0]


def test_a_killed_writers_temporary_is_removed_by_the_next_write(tmp_path):
    study = tmp_path / "study"
    study.mkdir()
    stale = killed_writer(study / "study.json")
    live = atomicfile.stage(str(study / "study.json"), b"being written")     # this process: alive
    foreign = study / ".study.json.tmp.otherhost-1.abcdefgh"                 # another host's: by age
    foreign.write_text("x")
    study_record(study).save()
    names = set(os.listdir(study))
    assert stale not in names and os.path.basename(live) in names and foreign.name in names
    old = atomicfile.STALE_S + 60
    os.utime(foreign, (os.path.getmtime(foreign) - old,) * 2)
    study_record(study).save()
    assert foreign.name not in os.listdir(study)


def test_the_checkpoints_json_and_the_samplers_files_use_the_same_scheme(tmp_path):
    from recsys.checkpoints import atomic

    stale = killed_writer(tmp_path / "attempt.json")
    atomic.write_json(str(tmp_path / "attempt.json"), {"a": 1})
    assert sorted(os.listdir(tmp_path)) == ["attempt.json"], stale
    sampler = subprocess.run([sys.executable, "slurm/hwsample.py", "--out", str(tmp_path / "hw"), "--once",
                              "--interval", "0.05"],
                             cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                             capture_output=True, text=True, timeout=60)
    assert sampler.returncode == 0, sampler.stderr
    assert [n for n in os.listdir(tmp_path / "hw") if not n.endswith(".json")] == []


def test_a_moved_study_keeps_its_points(tmp_path):
    old = tmp_path / "a" / "study-s"
    run = old / "points" / "g1-1"
    run.mkdir(parents=True)
    run_record(run).save()
    record = study_record(old, [str(run)])
    record.points[0].allocation = {str(run): str(old / "allocations" / "x")}
    record.points[0].code = {str(run): "sha"}
    record.code = {"sha256": "sha", "dir": str(old / "code"), "source": "/checkout"}
    record.save()
    new = tmp_path / "b" / "moved"
    new.parent.mkdir()
    shutil.move(str(old), str(new))
    loaded = StudyRecord.load(str(new))
    moved_run = str(new / "points" / "g1-1")
    assert loaded.points[0].runs == [moved_run] and loaded.code["dir"] == str(new / "code")
    assert loaded.points[0].allocation == {moved_run: str(new / "allocations" / "x")}
    assert loaded.points[0].code == {moved_run: "sha"} and loaded.code["source"] == "/checkout"
    assert RunRecord.load(moved_run).run_dir == moved_run
    loaded.save()           # saved where it is now: what a later move starts from
    with open(new / "study.json") as handle:
        assert json.load(handle)["points"][0]["runs"] == [moved_run]


def test_a_study_with_paths_relative_to_it_is_read(tmp_path):
    study = tmp_path / "study-s"
    (study / "points" / "r").mkdir(parents=True)
    data = study_record("/nowhere", [os.path.join("points", "r")]).to_dict()
    (study / "study.json").write_text(json.dumps(data))
    assert StudyRecord.load(str(study)).points[0].runs == [str(study / "points" / "r")]


def one_line_refusal(run_dir, match):
    with pytest.raises(RequestError, match=match) as info:
        RunRecord.load(str(run_dir))
    assert "\n" not in str(info.value) and "jobs.json" in str(info.value)
    return str(info.value)


@pytest.mark.parametrize("depth", [100_000, 65])     # past Python's own limit; past MAX_DEPTH (64)
def test_a_record_nested_too_deep_is_one_line(tmp_path, depth):
    (tmp_path / "jobs.json").write_text("[" * depth + "]" * depth)
    one_line_refusal(tmp_path, "nested deeper")


def test_a_record_at_the_depth_limit_is_read(tmp_path):
    nested = {}
    for _ in range(atomic.MAX_DEPTH - 2):
        nested = {"x": nested}
    (tmp_path / "extra.json").write_text(json.dumps({"a": nested}))
    assert atomic.read_json(tmp_path / "extra.json")["a"]


def test_a_huge_record_is_refused_without_reading_it(tmp_path):
    with open(tmp_path / "jobs.json", "wb") as handle:
        handle.truncate(300 * 1024 * 1024)      # sparse: 300 MiB that costs no disk
    import tracemalloc

    tracemalloc.start()
    one_line_refusal(tmp_path, "larger than a record may be")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1024 * 1024, peak


def test_a_record_that_is_not_a_file_is_one_line(tmp_path):
    os.mkfifo(tmp_path / "jobs.json")       # would block a plain open() for ever
    one_line_refusal(tmp_path, "not a regular file")


def test_the_size_limit_is_a_setting_named_in_the_refusal(tmp_path, monkeypatch):
    monkeypatch.setenv("RECSYS_MAX_RECORD_MB", "0.001")
    (tmp_path / "jobs.json").write_text(json.dumps(run_record(tmp_path).to_dict()) + " " * 2000)
    one_line_refusal(tmp_path, "RECSYS_MAX_RECORD_MB")


def test_the_cli_says_one_line_for_a_deep_record(tmp_path):
    (tmp_path / "jobs.json").write_text("[" * 100_000 + "]" * 100_000)
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "status", str(tmp_path)], cwd=repo,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "nested deeper" in proc.stderr, proc.stderr
