"""The history of a runs directory's studies (`recsys-submit study history`, jobs.study.analysis.history):
every finished study indexed when its report is written, listed and filtered, a study whose
directory is gone listed as gone, `study compare` taking the names listed, two reports written at
once both landing in the index, and one point's throughput plotted over time with the compare
verdicts. Fast tier: the recorded study directories of the compare tests
(test_study_compare.make_study), which `study report` polls without asking Slurm. The cluster
tests of the study assert that a finished real study is listed (test_study_slurm.py)."""

import json
import multiprocessing
import os
import shutil

import pytest

from jobs import cli
from jobs.study.analysis import history
from jobs.study.running.record import StudyRecord

from test_study_compare import BASE, _scaled, make_study

pytestmark = pytest.mark.fast
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _cli(capsys, *args):
    rc = cli.main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def _reported(capsys, runs, name, points, **kwargs):
    study = make_study(runs, name, points, **kwargs)
    rc, _, err = _cli(capsys, "study", "report", study, "--no-plot")
    assert rc == 0, err
    return study


def _history(capsys, runs, *args):
    rc, out, err = _cli(capsys, "study", "history", "--runs-dir", runs, "--json", *args)
    assert rc == 0, err
    return json.loads(out)


def test_a_reported_study_is_listed_with_its_headline(tmp_path, capsys):
    study = _reported(capsys, tmp_path, "base", BASE)
    _reported(capsys, tmp_path, "dlrm-one", BASE, model="dlrm")
    entries = _history(capsys, tmp_path)
    assert [e["name"] for e in entries] == ["base", "dlrm-one"]
    base = entries[0]
    assert base["study_dir"] == os.path.abspath(study) and base["state"] == "present"
    assert (base["profile"], base["model"], base["scaling"], base["points"], base["failed"]) == \
        ("ci", "ncf", "strong", 8, 0)
    assert base["code"] is None                 # a study from before frozen code: no hash to show
    # the headline: the largest size, its median (181,500 of 178,000-185,000) and efficiency vs 1 GPU
    assert base["headline"] == {"cell": "g2-n1x2", "gpus": 2, "throughput": 181_500.0,
                                "efficiency": pytest.approx(181_500.0 / 100_500.0 / 2)}
    cell = next(c for c in base["cells"] if c["id"] == "g1-n1x1")
    assert cell["throughputs"] == BASE[(1, 1, "default")] and cell["throughput"] == 100_500.0
    with open(tmp_path / history.INDEX) as handle:
        assert json.load(handle)["version"] == history.HISTORY_VERSION
    assert [e["name"] for e in _history(capsys, tmp_path, "--model", "dlrm")] == ["dlrm-one"]
    assert _history(capsys, tmp_path, "--profile", "elsewhere") == []
    rc, out, _ = _cli(capsys, "study", "history", "--runs-dir", tmp_path)
    assert rc == 0
    row = next(line for line in out.splitlines() if "| base |" in line)
    assert "| ci | ncf strong | not frozen | 8 | g2-n1x2 | 181,500 | 0.90 | present |" in row


def test_a_study_reported_again_keeps_one_entry_with_its_frozen_code(tmp_path, capsys):
    study = _reported(capsys, tmp_path, "base", BASE)
    record = StudyRecord.load(study)
    record.code = {"sha256": "ab" * 32, "dir": os.path.join(study, "code", "abab")}
    record.save()
    rc, _, err = _cli(capsys, "study", "report", study, "--no-plot")
    assert rc == 0, err
    entries = _history(capsys, tmp_path)
    assert len(entries) == 1 and entries[0]["code"] == "ab" * 32


def test_a_gone_study_is_listed_as_gone_and_compare_says_so(tmp_path, capsys):
    base = _reported(capsys, tmp_path, "base", BASE)
    slow = _reported(capsys, tmp_path, "slow", _scaled(BASE, 0.5))
    rc, out, err = _cli(capsys, "study", "compare", "base", "slow", "--runs-dir", tmp_path, "--no-plot")
    assert rc == 0 and "| slower |" in out, err         # names from the history
    shutil.rmtree(slow)
    entries = _history(capsys, tmp_path)
    assert [(e["name"], e["state"]) for e in entries] == [("base", "present"), ("slow", "gone")]
    rc, out, _ = _cli(capsys, "study", "history", "--runs-dir", tmp_path)
    assert rc == 0 and "| gone |" in out
    rc, out, err = _cli(capsys, "study", "compare", "base", "slow", "--runs-dir", tmp_path, "--no-plot")
    assert rc == 2 and out == "" and len(err.splitlines()) == 1
    assert f"'slow' is in the history of {tmp_path} but its directory {slow} is gone" in err
    assert os.path.isdir(base)


def _add_many(runs, name, count):
    """A process that indexes `count` studies (the same record, renamed), as reports would."""
    study = os.path.join(runs, f"study-{name}")
    record = StudyRecord.load(study)
    report = {"rows": [], "variants": [], "model": "ncf", "scaling": "strong", "failures": [], "pending": []}
    for i in range(count):
        record.name, record.study_dir = f"{name}-{i}", os.path.join(runs, f"study-{name}-{i}")
        history.add(record, report)


def test_two_studies_indexed_at_once_both_land(tmp_path):
    make_study(tmp_path, "a", BASE)
    make_study(tmp_path, "b", BASE)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_add_many, args=(str(tmp_path), name, 25)) for name in ("a", "b")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(60)
        assert proc.exitcode == 0
    names = {e["name"] for e in history.load(str(tmp_path))}
    assert names == {f"{n}-{i}" for n in ("a", "b") for i in range(25)}     # none lost to the other writer
    assert not [f for f in os.listdir(tmp_path) if f.startswith(f".{history.INDEX}.tmp")]


def test_a_point_over_time_is_plotted_with_the_compare_verdicts(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _reported(capsys, tmp_path, "base", BASE)
    _reported(capsys, tmp_path, "slow", _scaled(BASE, 0.5))
    _reported(capsys, tmp_path, "fixed", BASE)
    _reported(capsys, tmp_path, "two", {k: v[:2] for k, v in BASE.items()})
    _reported(capsys, tmp_path, "dlrm-one", BASE, model="dlrm")
    entries = history.listing(str(tmp_path), model="ncf")
    points = history.series(entries, "g1-n1x1")
    assert [(p["name"], p["verdict"]) for p in points] == [
        ("base", "reference"), ("slow", "slower"), ("fixed", "faster"), ("two", "ratio only")]
    assert points[1]["ratio"] == pytest.approx(0.5, rel=0.01) and points[1]["p_value"] == pytest.approx(2 / 70)
    rc, out, err = _cli(capsys, "study", "history", "--runs-dir", tmp_path, "--model", "ncf", "--plot", "g1-n1x1")
    assert rc == 0, err
    with open(tmp_path / "history-g1-n1x1.png", "rb") as handle:
        assert handle.read(8) == PNG_MAGIC
    assert f"wrote plot {tmp_path / 'history-g1-n1x1.png'}" in out
    # bad input: one line, exit 2, nothing written
    for args, word in ((["--plot", "g1-n1x1"], "add --model"),          # ncf and dlrm studies mixed
                       (["--model", "ncf", "--plot", "../g1"], "is not a point such as g2-n1x2"),
                       (["--model", "ncf", "--plot", "g64-n8x8"], "no listed study measured point 'g64-n8x8'")):
        rc, out, err = _cli(capsys, "study", "history", "--runs-dir", tmp_path, *args)
        assert rc == 2 and len(err.splitlines()) == 1 and word in err, err
    assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".png")) == ["history-g1-n1x1.png"]


def test_an_empty_or_foreign_index(tmp_path, capsys):
    rc, out, _ = _cli(capsys, "study", "history", "--runs-dir", tmp_path)
    assert rc == 0 and "no finished studies in the history" in out
    (tmp_path / history.INDEX).write_text(json.dumps({"version": 99, "studies": []}))
    rc, out, err = _cli(capsys, "study", "history", "--runs-dir", tmp_path)
    assert rc == 2 and "is not a version 1 study index" in err and len(err.splitlines()) == 1
