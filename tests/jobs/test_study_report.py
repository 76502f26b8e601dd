"""The scaling report (jobs.study.analysis.report) from in-memory study records: each repeat gives one
throughput, a cell's figures all derive from their median, noisy cells and a missing baseline
are flagged, and provenance is shown once with the points that differ. No cluster: the fast tier."""

import csv
import io
import json
import statistics

import pytest

from jobs import cli
from jobs.study.analysis import report as study_report, report_figure, report_table
from jobs.study.running.record import PointRecord, PointStatus, StudyRecord, StudyStatus

pytestmark = pytest.mark.fast

PROVENANCE = {"python": "3.10.12", "tensorflow": "2.15.0", "keras": "2.15.0", "horovod": "0.28.1",
              "horovod_build": {"mpi": True, "nccl": True}, "mpi": "Open MPI 4.1.5", "numpy": "1.26.4",
              "cuda": "12.2", "cudnn": "8.9", "nccl": "2.18.3", "gpu_model": "NVIDIA H100", "cpu_model": "Xeon",
              "nodes": ["node1"], "slurm_job_id": "1", "slurm_version": "23.02.7", "git_commit": "abc123",
              "git_dirty": False, "profile": "ci", "profile_sha256": "f" * 64}


def _study(tmp_path, sizes, repeats=1, variants=("default",), batch=512, scaling="strong"):
    """A StudyRecord of `sizes` [(nodes, gpus_per_node)] x variants x repeats, with empty run dirs."""
    points = []
    for nodes, gpn in sizes:
        gpus = nodes * gpn
        for label in variants:
            for r in range(repeats):
                tag = "" if label == "default" else f"-{label.replace('=', '-')}"
                pid = f"g{gpus}-n{nodes}x{gpn}{tag}-r{r}"
                run_dir = tmp_path / "points" / pid
                run_dir.mkdir(parents=True)
                points.append(PointRecord(id=pid, nodes=nodes, gpus_per_node=gpn, gpus=gpus,
                                          batch_per_gpu=batch // gpus, global_batch=batch, variant={},
                                          variant_label=label, repeat=r, runs=[str(run_dir)]))
    spec = {"name": "t", "model": "dlrm", "scaling": scaling, "warmup_steps": 2, "steps": 5}
    return StudyRecord(name="t", study_dir=str(tmp_path), profile="ci", profile_path=None, scheduler="slurm",
                       spec=spec, created=0.0, points=points)


def _status(record, throughputs, failed=None, states=None, provenance=None):
    """A StudyStatus: point id -> throughput for done points; `failed` id -> reason; `states` id ->
    another state (pending, unknown, running); `provenance` id -> dict (default PROVENANCE, None
    for an old summary without it)."""
    failed, states, provenance = failed or {}, states or {}, provenance or {}
    out = []
    for point in record.points:
        if point.id in failed:
            out.append(PointStatus(id=point.id, state="failed", job_state="CANCELLED", run_dir=point.runs[-1],
                                   job_id="9", attempts=1, reason=failed[point.id]))
        elif point.id in states:
            out.append(PointStatus(id=point.id, state=states[point.id], job_state=None, run_dir=point.runs[-1],
                                   job_id="9", attempts=1))
        else:
            summary = {"type": "summary", "throughput_samples_per_s": throughputs[point.id],
                       "mean_step_time_ms": 1.0, "world_size": point.gpus, "global_batch_size": point.global_batch,
                       "timed_steps": 5}
            prov = provenance.get(point.id, PROVENANCE)
            if prov is not None:
                summary["provenance"] = dict(prov, slurm_job_id=point.id)     # differs per point by nature
            out.append(PointStatus(id=point.id, state="done", job_state="COMPLETED", run_dir=point.runs[-1],
                                   job_id="9", attempts=1, summary=summary))
    return StudyStatus(study_dir=record.study_dir, points=out, counts={}, done=True, calls=0, elapsed_s=0.0)


def _cell(report, gpus, variant="default"):
    return next(r for r in report["rows"] if r["gpus"] == gpus)["variants"][variant]


def test_cell_statistics_come_from_the_repeats(tmp_path):
    record = _study(tmp_path, [(1, 1), (1, 2), (2, 2)], repeats=3)
    values = {"g1-n1x1-r0": 1000.0, "g1-n1x1-r1": 1030.0, "g1-n1x1-r2": 990.0,
              "g2-n1x2-r0": 1900.0, "g2-n1x2-r1": 1850.0, "g2-n1x2-r2": 1950.0,
              "g4-n2x2-r0": 3400.0, "g4-n2x2-r1": 3600.0, "g4-n2x2-r2": 3500.0}
    report = study_report.build(record, _status(record, values))
    base = statistics.median([1000.0, 1030.0, 990.0])
    for gpus, ids in ((1, "g1-n1x1"), (2, "g2-n1x2"), (4, "g4-n2x2")):
        tps = [values[f"{ids}-r{r}"] for r in range(3)]
        cell = _cell(report, gpus)
        assert cell["throughputs"] == tps                       # repeat order
        assert cell["n"] == 3
        assert cell["throughput"] == statistics.median(tps)
        assert (cell["throughput_min"], cell["throughput_max"]) == (min(tps), max(tps))
        assert cell["cv"] == pytest.approx(statistics.stdev(tps) / statistics.mean(tps))
        assert cell["step_time_ms"] == pytest.approx(512 * 1000 / statistics.median(tps))
        assert cell["speedup"] == pytest.approx(statistics.median(tps) / base)
        assert cell["efficiency"] == pytest.approx(cell["speedup"] / gpus)
        assert cell["spread_warning"] is None                   # 3 close repeats
    assert report["version"] == study_report.REPORT_VERSION and report["warnings"] == [] and report["baseline_problems"] == []
    one = _study(tmp_path / "one", [(1, 1)])
    single = study_report.build(one, _status(one, {"g1-n1x1-r0": 5.0}))
    assert _cell(single, 1)["cv"] is None and _cell(single, 1)["n"] == 1


def test_two_far_apart_repeats_step_time_follows_the_median_and_are_flagged(tmp_path):
    record = _study(tmp_path, [(1, 1), (1, 2)], repeats=2)
    report = study_report.build(record, _status(record, {"g1-n1x1-r0": 10_332.0, "g1-n1x1-r1": 151_036.0,
                                                         "g2-n1x2-r0": 150_000.0, "g2-n1x2-r1": 152_000.0}))
    cell = _cell(report, 1)
    median = (10_332.0 + 151_036.0) / 2
    assert cell["throughput"] == median
    assert cell["step_time_ms"] == pytest.approx(512 * 1000 / median)     # not the median of the step times
    assert cell["spread_warning"] and "g1-n1x1-r0" in cell["spread_warning"] and "10,332" in cell["spread_warning"]
    assert _cell(report, 2)["spread_warning"] is None
    assert report["warnings"] == [cell["spread_warning"]]
    text = report_table.markdown(report)
    row = next(line for line in text.splitlines() if line.startswith("| 1 |"))
    assert report_table.WARN in row and f"{median:,.0f}" in row and f"{512 * 1000 / median:,.1f}" in row
    assert f"{report_table.WARN} {cell['spread_warning']}" in text.splitlines()
    rows = list(csv.DictReader(io.StringIO(report_table.csv_text(report))))
    assert rows[0]["default n"] == "2" and float(rows[0]["default cv"]) == pytest.approx(cell["cv"])
    assert rows[0]["default spread_warning"] == cell["spread_warning"] and rows[1]["default spread_warning"] == ""


def test_failed_baseline_leaves_speedup_empty_never_rebased(tmp_path):
    record = _study(tmp_path, [(1, 1), (1, 2), (2, 2)], variants=("amp=false", "amp=true"))
    values = {p.id: 100.0 * p.gpus for p in record.points}
    report = study_report.build(record, _status(record, values, failed={"g1-n1x1-amp-false-r0": "CANCELLED by 0"}))
    for gpus in (1, 2, 4):
        assert _cell(report, gpus, "amp=false")["speedup"] is None
        assert _cell(report, gpus, "amp=false")["efficiency"] is None
        assert _cell(report, gpus, "amp=true")["efficiency"] == pytest.approx(1.0)
    assert _cell(report, 2, "amp=false")["throughput"] == 200.0
    assert report["baseline"]["amp=false"] == {"gpus": 1, "nodes": 1, "gpus_per_node": 1, "throughput": None,
                                               "points": ["g1-n1x1-amp-false-r0"]}
    [problem] = report["baseline_problems"]
    assert problem.startswith("variant amp=false: baseline point g1-n1x1-amp-false-r0 failed: CANCELLED by 0")
    assert problem in report["warnings"]
    text = report_table.markdown(report)
    assert "- baseline: amp=false: 1 GPU (1 x 1) (no throughput" in text and "amp=true: 1 GPU (1 x 1)" in text
    assert problem in text


@pytest.mark.parametrize("state", ["pending", "unknown"])
def test_an_unfinished_baseline_is_a_problem_not_a_failure(tmp_path, state):
    record = _study(tmp_path, [(1, 1), (1, 2)])
    report = study_report.build(record, _status(record, {"g2-n1x2-r0": 200.0}, states={"g1-n1x1-r0": state}))
    assert report["failures"] == [] and report["pending"] == [{"point": "g1-n1x1-r0", "state": state}]
    assert _cell(report, 2)["speedup"] is None
    assert report["baseline_problems"][0].startswith(f"variant default: baseline point g1-n1x1-r0 is {state}")
    assert "- baseline: 1 GPU (1 x 1) (no throughput" in report_table.markdown(report)


def test_provenance_shown_once_and_a_differing_point_flagged(tmp_path):
    record = _study(tmp_path, [(1, 1), (1, 2), (2, 2), (4, 2)])
    values = {p.id: 100.0 * p.gpus for p in record.points}
    report = study_report.build(record, _status(record, values, provenance={
        "g4-n2x2-r0": dict(PROVENANCE, tensorflow="2.14.1", nodes=["node1", "node2"]), "g8-n4x2-r0": None}))
    expected = {k: v for k, v in PROVENANCE.items() if k not in ("nodes", "slurm_job_id")}
    assert report["provenance"] == expected
    assert report["provenance_differences"] == [{"point": "g4-n2x2-r0", "key": "tensorflow", "value": "2.14.1",
                                                 "common": "2.15.0"}]
    assert report["no_provenance"] == ["g8-n4x2-r0"]
    assert report["warnings"] == ["provenance: point g4-n2x2-r0 has tensorflow=2.14.1, the other points 2.15.0"]
    text = report_table.markdown(report)
    header = next(line for line in text.splitlines() if line.startswith("- provenance:"))
    assert "tensorflow 2.15.0" in header and "gpu_model NVIDIA H100" in header and "slurm_job_id" not in header
    assert "- `g4-n2x2-r0` tensorflow: 2.14.1 vs 2.15.0" in text
    assert "No provenance recorded (an older engine): g8-n4x2-r0" in text
    json.dumps(report)                                          # scaling.json


def test_markdown_header_and_csv_columns(tmp_path):
    record = _study(tmp_path, [(1, 1), (1, 2)], repeats=2)
    report = study_report.build(record, _status(record, {p.id: 100.0 * p.gpus + p.repeat for p in record.points}))
    lines = report_table.markdown(report).splitlines()
    assert lines[2].startswith("- profile: ci; up to 1 node(s) per point; ran on: -")
    assert "- baseline: 1 GPU (1 x 1)" in lines
    head = report_table.csv_text(report).splitlines()[0].split(",")
    assert head[:5] == ["gpus", "nodes", "gpus_per_node", "batch_per_gpu", "global_batch"]
    assert {"default n", "default cv", "default spread_warning", "default throughput"} <= set(head)


def test_plot_has_error_bars_and_an_ideal_line_only_with_a_baseline(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.container import ErrorbarContainer

    record = _study(tmp_path, [(1, 1), (1, 2), (2, 2)], repeats=2)
    values = {p.id: 100.0 * p.gpus * (1 + 0.05 * p.repeat) for p in record.points}
    report = study_report.build(record, _status(record, values))
    fig = report_figure.figure(report)
    ax_tp, ax_eff = fig.axes
    [bars] = [c for c in ax_tp.containers if isinstance(c, ErrorbarContainer)]
    data_line, _, (bar_lines,) = bars.lines
    assert list(data_line.get_ydata()) == [_cell(report, g)["throughput"] for g in (1, 2, 4)]
    assert [(seg[0][1], seg[1][1]) for seg in bar_lines.get_segments()] == \
        [(_cell(report, g)["throughput_min"], _cell(report, g)["throughput_max"]) for g in (1, 2, 4)]
    assert [line.get_label() for line in ax_tp.get_lines() if line.get_label() == "default ideal"]
    assert len(ax_eff.get_lines()) == 2                         # efficiency and the 1.0 line
    no_base = study_report.build(record, _status(record, values, failed={"g1-n1x1-r0": "x", "g1-n1x1-r1": "y"}))
    fig2 = report_figure.figure(no_base)
    assert not [line for line in fig2.axes[0].get_lines() if "ideal" in line.get_label()]
    assert len(fig2.axes[1].get_lines()) == 1                   # only the 1.0 line
    plt.close(fig)
    plt.close(fig2)
    png = tmp_path / "scaling.png"
    report_figure.plot(report, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_exit_code_and_warnings_on_stderr(tmp_path, monkeypatch, capsys):
    record = _study(tmp_path, [(1, 1), (1, 2)])
    record.save()
    values = {"g1-n1x1-r0": 100.0, "g2-n1x2-r0": 190.0}
    monkeypatch.setattr(study_report, "poll", lambda rec: _status(rec, values))
    assert cli.main(["study", "report", str(tmp_path), "--no-plot"]) == 0
    assert "warning" not in capsys.readouterr().err
    monkeypatch.setattr(study_report, "poll", lambda rec: _status(rec, values, states={"g1-n1x1-r0": "unknown"}))
    assert cli.main(["study", "report", str(tmp_path), "--no-plot"]) == 1
    err = capsys.readouterr().err
    assert "warning: variant default: baseline point g1-n1x1-r0 is unknown" in err
    saved = json.load(open(tmp_path / "report" / "scaling.json"))
    assert saved["baseline_problems"] and saved["rows"][1]["variants"]["default"]["speedup"] is None
    monkeypatch.setattr(study_report, "poll", lambda rec: _status(rec, values, failed={"g1-n1x1-r0": "CANCELLED"}))
    assert cli.main(["study", "report", str(tmp_path), "--no-plot"]) == 1
    assert "baseline point g1-n1x1-r0 failed: CANCELLED" in capsys.readouterr().err
