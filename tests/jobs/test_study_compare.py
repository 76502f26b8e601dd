"""Comparing studies (`recsys-submit study compare`, jobs.study.analysis.compare): points matched by
(GPUs, nodes, variant), the ratio to the first study's median and a two-sided Mann-Whitney U
verdict over the repeats, `--fail-if-slower` as a regression gate.

Fast tier: study directories written on disk as the real ones look (study.json, each point's run
directory with jobs.json, a status.json whose tasks are settled, and the engine's JSON-lines log
with its summary), so the CLI polls them without asking Slurm. One cluster test: two real NCF
studies on the `ci` profile, the second made slower on purpose by a bigger model."""

import csv
import io
import json
import os
import time

import pytest

from jobs import cli
from jobs.backends.slurm.poll import StatusCache, TaskSeen
from jobs.runs.records import SUBMITTED, JobRecord, RunRecord
from jobs.study.analysis import compare as study_compare
from jobs.study.running.record import PointRecord, StudyRecord

from study_helpers import TINY_NCF, study_dir as _study_dir, watch as _watch, write_spec as _write_spec
from submit_helpers import Cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY = ["--factors", "4", "--layers", "16,8,4"]
FAILED = "failed"          # a repeat whose job failed (no summary)
_ids = iter(range(100, 10_000))


def make_study(root, name, points, model="ncf", scaling="strong", batch=4096, engine_args=TINY, profile="ci"):
    """A finished study directory under `root`: `points` maps (nodes, gpus_per_node, variant label)
    to the repeats' throughputs; FAILED marks a repeat whose job failed, None one never submitted."""
    study_dir = os.path.join(str(root), f"study-{name}")
    records = []
    for (nodes, gpn, label), values in points.items():
        gpus = nodes * gpn
        tag = "" if label == "default" else "-" + label.replace("=", "-")
        for repeat, value in enumerate(values):
            pid = f"g{gpus}-n{nodes}x{gpn}{tag}-r{repeat}"
            variant = dict([label.split("=")]) if "=" in label else {}
            point = PointRecord(id=pid, nodes=nodes, gpus_per_node=gpn, gpus=gpus, batch_per_gpu=batch // gpus,
                                global_batch=batch, variant=variant, variant_label=label, repeat=repeat)
            if value is not None:
                point.runs.append(_point_run(study_dir, name, point, value, model))
            records.append(point)
    spec = {"name": name, "model": model, "scaling": scaling, "batch_size": batch,
            "gpus": sorted({p.gpus for p in records}), "points": None, "variants": {}, "repeats": 4,
            "warmup_steps": 5, "steps": 300, "time": "00:10:00", "data_path": None, "synthetic": None,
            "engine_args": list(engine_args), "description": "", "version": 1}
    StudyRecord(name=name, study_dir=study_dir, profile=profile, profile_path=None, scheduler="slurm", spec=spec,
                created=time.time(), points=records).save()
    return study_dir


def _point_run(study_dir, name, point, value, model):
    """One point's run directory: jobs.json, a settled status.json and the engine log."""
    job_id = str(next(_ids))
    run_dir = os.path.join(study_dir, "points", f"{name}-{point.id}-20261126-120000")
    os.makedirs(os.path.join(run_dir, "logs"))
    RunRecord(run_dir=run_dir, profile="ci", profile_path=None, scheduler="slurm", state=SUBMITTED,
              jobs=[JobRecord(key="main", name=f"{name}-{point.id}", job_id=job_id)]).save()
    state = "FAILED" if value == FAILED else "COMPLETED"
    StatusCache(tasks={job_id: TaskSeen(state=state, source="squeue", seen=time.time())}).write(run_dir)
    lines = [{"type": "startup", "time": 0.0, "phase": "first_step", "since_start_s": 3.9}]
    if value != FAILED:
        lines.append({"type": "summary", "mode": "benchmark", "model": model, "world_size": point.gpus,
                      "global_batch_size": point.global_batch, "timed_steps": 300, "excluded_warmup_steps": 5,
                      "throughput_samples_per_s": value, "mean_step_time_ms": point.global_batch * 1e3 / value,
                      "summary_version": 2, "provenance": {"tensorflow": "2.15.1", "profile": "ci",
                                                           "slurm_job_id": job_id}})
    with open(os.path.join(run_dir, "logs", f"main-{job_id}.engine.jsonl"), "w") as handle:
        handle.writelines(json.dumps(line) + "\n" for line in lines)
    return run_dir


def _compare(capsys, *args):
    rc = cli.main(["study", "compare", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def _points(out_dir):
    with open(os.path.join(out_dir, "compare.json")) as handle:
        data = json.load(handle)
    return data, {(p["gpus"], p["nodes"], p["variant"]): p["studies"] for p in data["points"]}


BASE = {(1, 1, "default"): [100_000.0, 102_000.0, 98_000.0, 101_000.0],
        (1, 2, "default"): [180_000.0, 185_000.0, 178_000.0, 183_000.0]}


def _scaled(points, factor):
    return {k: [v * factor * (1 + 0.002 * i) for i, v in enumerate(vs)] for k, vs in points.items()}


@pytest.mark.fast
def test_a_study_compared_with_itself_is_within_noise(tmp_path, capsys):
    a = make_study(tmp_path, "base", BASE)
    rc, out, err = _compare(capsys, a, a, "--no-plot", "--fail-if-slower", "1")
    assert rc == 0, err
    data, points = _points(os.path.join(a, "compare", "vs-base"))
    assert [s["name"] for s in data["studies"]] == ["base", "base (2)"]
    assert len(points) == 2 and data["unmatched"] == [] and data["slower"] == []
    for ref, other in points.values():
        assert ref["verdict"] == "reference" and ref["ratio"] == 1.0
        assert other["verdict"] == "within noise" and other["ratio"] == 1.0 and other["p_value"] == 1.0
        assert other["throughputs"] == ref["throughputs"] and other["n"] == 4
    assert "| 1 | 1 x 1 | default | base (2) | 100,500 | 98,000-102,000, n=4, cv 0.02 | 1.00 | 1 | within noise |" \
        in out


@pytest.mark.fast
def test_a_clearly_slower_copy_is_slower_and_trips_the_gate(tmp_path, capsys):
    a = make_study(tmp_path, "base", BASE)
    b = make_study(tmp_path, "slow", _scaled(BASE, 0.5))
    rc, out, err = _compare(capsys, a, b, "--no-plot", "--fail-if-slower", "10")
    assert rc == 1
    data, points = _points(os.path.join(a, "compare", "vs-slow"))
    for ref, other in points.values():
        assert other["verdict"] == "slower" and other["method"] == "exact"
        assert other["p_value"] == pytest.approx(2 / 70)           # 4 vs 4, no overlap: 2 / C(8, 4)
        assert other["ratio"] == pytest.approx(0.5, rel=0.01)
    assert len(data["slower"]) == 2 and "1 GPU (1 x 1): slow" in data["slower"][0]
    assert "slower than base by more than 10%: 1 GPU (1 x 1): slow" in err
    assert "Slower than `base` by more than 10% (verdict slower):" in out
    assert "`slow` differs from `base` in nothing a point measures" in out
    rc, out, err = _compare(capsys, a, b, "--no-plot", "--fail-if-slower", "90")
    assert rc == 0 and "slower than base" not in err
    assert "No point is slower than `base` by more than 90%" in out
    rc, out, _ = _compare(capsys, b, a, "--no-plot", "--fail-if-slower", "10")     # the other way round
    assert rc == 0 and "| faster |" in out


@pytest.mark.fast
def test_two_repeats_give_the_ratio_only(tmp_path, capsys):
    a = make_study(tmp_path, "a", {k: v[:2] for k, v in BASE.items()})
    b = make_study(tmp_path, "b", _scaled({k: v[:2] for k, v in BASE.items()}, 0.5))
    rc, out, _ = _compare(capsys, a, b, "--no-plot", "--fail-if-slower", "10")
    assert rc == 0                              # no verdict, so nothing is called slower
    _, points = _points(os.path.join(a, "compare", "vs-b"))
    for _, other in points.values():
        assert other["verdict"] == "ratio only" and other["p_value"] is None
        assert other["ratio"] == pytest.approx(0.5, rel=0.01)
    assert "2 vs 2 repeats: fewer than 3 on a side, no test (ratio only); run 4 or more repeats" in out


@pytest.mark.fast
def test_three_against_three_repeats_can_never_reach_alpha(tmp_path, capsys):
    assert study_compare.smallest_p(3, 3) == pytest.approx(0.1)
    assert study_compare.smallest_p(3, 4) == pytest.approx(2 / 35)     # > 0.05 as well
    assert study_compare.smallest_p(4, 4) < study_compare.ALPHA
    assert study_compare.repeats_for_a_verdict() == 4
    a = make_study(tmp_path, "a", {k: v[:3] for k, v in BASE.items()})
    b = make_study(tmp_path, "b", _scaled({k: v[:3] for k, v in BASE.items()}, 0.5))
    rc, out, _ = _compare(capsys, a, b, "--no-plot")
    assert rc == 0
    _, points = _points(os.path.join(a, "compare", "vs-b"))
    for _, other in points.values():          # no overlap at all, and still no verdict possible
        assert other["verdict"] == "within noise" and other["p_value"] == pytest.approx(0.1)
    note = ("3 vs 3 repeats: the smallest p the test can give is 0.10 (alpha 0.05), so it can never say "
            "faster or slower; run 4 or more repeats of each study for a verdict")
    assert f"\u2020 {note}" in out.splitlines() and "| within noise \u2020 |" in out


@pytest.mark.fast
def test_studies_that_do_not_compare_are_refused_in_one_line(tmp_path, capsys):
    a = make_study(tmp_path, "a", BASE)
    dlrm = make_study(tmp_path, "d", BASE, model="dlrm")
    weak = make_study(tmp_path, "w", BASE, scaling="weak")
    for other, word in ((dlrm, "model differs"), (weak, "scaling differs")):
        rc, out, err = _compare(capsys, a, other)
        assert rc == 2 and out == "" and len(err.splitlines()) == 1 and word in err, err
    rc, _, err = _compare(capsys, a, tmp_path / "nothing-here")
    assert rc == 2 and "is not a study directory" in err and len(err.splitlines()) == 1
    rc, _, err = _compare(capsys, a)
    assert rc == 2 and "at least two studies" in err
    assert not os.path.exists(os.path.join(a, "compare"))


@pytest.mark.fast
def test_points_without_a_partner_are_listed_and_unfinished_ones_get_no_verdict(tmp_path, capsys):
    a = make_study(tmp_path, "a", {**BASE, (2, 2, "default"): [300_000.0] * 4})
    b = make_study(tmp_path, "b", {(1, 1, "default"): [99_000.0, 101_000.0, FAILED, 100_000.0],
                                   (1, 2, "default"): [None] * 4,
                                   (4, 2, "default"): [500_000.0] * 4}, engine_args=["--factors", "8"])
    rc, out, err = _compare(capsys, a, b, "--no-plot")
    assert rc == 1                              # a failed point, as `study report`
    data, points = _points(os.path.join(a, "compare", "vs-b"))
    assert set(points) == {(1, 1, "default"), (2, 1, "default")}
    one = points[(1, 1, "default")][1]
    assert one["n"] == 3 and one["failed"] == 1 and one["verdict"] == "within noise"
    two = points[(2, 1, "default")][1]
    assert two["state"] == "pending" and two["verdict"] is None and two["ratio"] is None
    assert "| 2 | 1 x 2 | default | b | pending | - | - | - | - (pending) |" in out
    assert [(u["gpus"], u["study"], u["missing_from"]) for u in data["unmatched"]] == [(4, "a", "b"), (8, "b", "a")]
    assert "- 4 GPUs (2 x 2) of `a`: not in `b`" in out and "- 8 GPUs (4 x 2) of `b`: not in `a`" in out
    assert "`b` differs from `a` in: engine_args --factors 8 (vs --factors 4 --layers 16,8,4)" in out
    assert "warning: b: point g1-n1x1-r2 failed" in err and "warning: b: point g2-n1x2-r0 was never submitted" in err


@pytest.mark.fast
def test_outputs_are_written(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    a = make_study(tmp_path, "a", {**BASE, (1, 1, "amp=true"): [150_000.0] * 4})
    b = make_study(tmp_path, "b", _scaled({**BASE, (1, 1, "amp=true"): [150_000.0] * 4}, 0.9))
    out_dir = tmp_path / "cmp"
    rc, out, _ = _compare(capsys, a, b, "--out", out_dir, "--plot")
    assert rc == 0
    for name in ("compare.md", "compare.csv", "compare.json", "compare.png"):
        assert f"wrote {name.split('.')[1].replace('md', 'markdown').replace('png', 'plot')} {out_dir / name}" in out
    assert (out_dir / "compare.png").read_bytes()[:8] == PNG_MAGIC
    assert (out_dir / "compare.md").read_text() in out
    data = json.loads((out_dir / "compare.json").read_text())
    assert data["version"] == study_compare.COMPARE_VERSION and data["alpha"] == 0.05
    assert {(p["gpus"], p["variant"]) for p in data["points"]} == {(1, "default"), (2, "default"), (1, "amp=true")}
    rows = list(csv.DictReader(io.StringIO((out_dir / "compare.csv").read_text())))
    assert len(rows) == 6 and rows[1]["study"] == "b" and float(rows[1]["ratio"]) == pytest.approx(0.9, rel=0.01)
    assert rows[1]["verdict"] == "slower" and rows[0]["verdict"] == "reference"
    fig = study_compare.figure(data)
    assert len(fig.axes) == 2                   # one panel per variant
    assert all(ax.get_xscale() == "log" and ax.get_yscale() == "log" for ax in fig.axes)
    for ax in fig.axes:                         # one line per study
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["a", "b"]
    import matplotlib.pyplot as plt

    plt.close(fig)


# 8-10x the tiny model's step time on the 2-core test box (tiny: ~1.5 ms/step at batch 4096,
# this one ~12-17 ms), so a slower study's 4 repeats all fall below the tiny one's despite the
# box's noise: the exact test's smallest p at 4 vs 4 (0.029) needs no overlap at all
BIG_NCF = ["--factors", "32", "--layers", "256,128,64"]


@pytest.mark.slurm
@pytest.mark.horovod
@pytest.mark.slow
def test_two_real_studies_compare(slurm_cluster, tmp_path):
    """Two real NCF studies on `ci` (1 GPU, 4 repeats each, one point at a time); the second runs
    a bigger model, so it is slower on purpose."""
    pytest.importorskip("horovod.tensorflow")
    cli_ = Cli(slurm_cluster.env, tmp_path / "runs")
    dirs = []
    for name, engine_args in (("ncf-tiny", TINY_NCF), ("ncf-big", BIG_NCF)):
        spec = _write_spec(tmp_path / f"{name}.yaml", name=name, model="ncf", scaling="strong", batch_size=4096,
                           gpus=[1], repeats=4, warmup_steps=5, steps=200, time="00:10:00", engine_args=engine_args)
        dirs.append(_study_dir(cli_("study", "run", spec, "--profile", "ci", check=True, timeout=600)))
        rc, status = _watch(cli_, dirs[-1])     # measured alone: the next study starts after this one
        assert rc == 0 and status["counts"]["done"] == 4, status
    tiny, big = dirs
    same = cli_("study", "compare", tiny, tiny, "--no-plot", "--fail-if-slower", "10")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "| 1 | 1 x 1 | default | ncf-tiny (2) |" in same.stdout and "| within noise |" in same.stdout
    out_dir = tmp_path / "cmp"
    proc = cli_("study", "compare", "ncf-tiny", "ncf-big", "--fail-if-slower", "10", "--out", out_dir)
    print(proc.stdout)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "slower than ncf-tiny by more than 10%: 1 GPU (1 x 1): ncf-big" in proc.stderr
    data = json.loads((out_dir / "compare.json").read_text())
    [point] = data["points"]
    ref, other = point["studies"]
    assert (ref["n"], other["n"]) == (4, 4) and other["verdict"] == "slower", point
    assert other["p_value"] == pytest.approx(2 / 70) and other["ratio"] < 0.5
    assert data["studies"][1]["differences"][0]["key"] == "engine_args"
    assert (out_dir / "compare.png").read_bytes()[:8] == PNG_MAGIC
