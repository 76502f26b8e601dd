"""The report's comparison with NVIDIA's published results, the speedup to mixed precision, the
step-time breakdown (table, breakdown.csv, JSON, stacked bars) and the log-log throughput plot,
from in-memory study records (jobs.study.analysis.report). No cluster: the fast tier."""

import csv
import io
import json

import pytest

from jobs import cli
from jobs.study import measures as study_measures
from jobs.study.analysis import breakdown as report_breakdown, report as study_report, report_figure, report_table
from jobs.study.running.record import PointRecord, PointStatus, StudyRecord, StudyStatus

pytestmark = pytest.mark.fast

PHASES = study_measures.BREAKDOWN_PHASES


def _study(tmp_path, sizes, variants, model="wide_deep", batch=131072, profile_text="extends: dgxa100\n",
           repeats=1, engine_args=()):
    """A StudyRecord on a profile file (`profile_text`), `sizes` [(nodes, gpus_per_node)] x
    `variants` [dict] x repeats, strong scaling at global batch `batch`."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    profile = tmp_path / "mysite.yaml"
    profile.write_text(profile_text)
    points = []
    for nodes, gpn in sizes:
        gpus = nodes * gpn
        for variant in variants:
            label = ",".join(f"{k}={str(v).lower()}" for k, v in variant.items()) or "default"
            for r in range(repeats):
                pid = f"g{gpus}-n{nodes}x{gpn}-{label.replace('=', '-').replace(',', '_')}-r{r}"
                run_dir = tmp_path / "points" / pid
                run_dir.mkdir(parents=True)
                points.append(PointRecord(id=pid, nodes=nodes, gpus_per_node=gpn, gpus=gpus,
                                          batch_per_gpu=batch // gpus, global_batch=batch, variant=dict(variant),
                                          variant_label=label, repeat=r, runs=[str(run_dir)]))
    spec = {"name": "ref", "model": model, "scaling": "strong", "warmup_steps": 2, "steps": 5,
            "engine_args": list(engine_args)}
    return StudyRecord(name="ref", study_dir=str(tmp_path), profile="mysite", profile_path=str(profile),
                       scheduler="slurm", spec=spec, created=0.0, points=points)


def _status(record, throughput, breakdown=None):
    """Every point done; `throughput(point)` gives its samples/s, `breakdown(point)` its
    step_breakdown (None: the summary has none, as from an older engine)."""
    out = []
    for point in record.points:
        summary = {"type": "summary", "throughput_samples_per_s": throughput(point), "world_size": point.gpus}
        value = breakdown(point) if breakdown else None
        if value is not None:
            summary["step_breakdown"] = value
        out.append(PointStatus(id=point.id, state="done", job_state="COMPLETED", run_dir=point.runs[-1], job_id="9",
                               attempts=1, summary=summary))
    return StudyStatus(study_dir=record.study_dir, points=out, counts={}, done=True, calls=0, elapsed_s=0.0)


def _cell(report, gpus, variant):
    return next(r for r in report["rows"] if r["gpus"] == gpus)["variants"][variant]


def _breakdown(step, phases, slowest_step, slowest_rank=3, emb_bytes=2_000_000, grad_bytes=50_000_000):
    mean = {"step_ms": step, **{f"{p}_ms": v for p, v in zip(PHASES, phases)}}
    slow = {"rank": slowest_rank, "step_ms": slowest_step,
            **{f"{p}_ms": v * slowest_step / step for p, v in zip(PHASES, phases)}}
    return {"version": 1, "steps": 20, "method": "split step, synchronised phases", "phases": list(PHASES),
            "mean": mean, "slowest_rank": slow,
            "bytes_per_step": {"embedding_exchange": emb_bytes, "gradient_exchange": grad_bytes}}


WD_VARIANTS = [{"precision": p, "xla": x} for p in ("tf32", "amp") for x in (False, True)]


def test_cells_matching_a_published_row_show_it_and_measured_over_published(tmp_path):
    record = _study(tmp_path, [(1, 1), (1, 8)], WD_VARIANTS)
    report = study_report.build(record, _status(record, lambda p: 1_000_000.0 * p.gpus))
    assert report["version"] == 3 and report["platform"] == "dgxa100" and report["published_matches"] == 8
    cell = _cell(report, 8, "precision=amp,xla=true")
    assert (cell["precision"], cell["xla"]) == ("amp", True)
    assert cell["published"]["throughput"] == 5742941.1 and cell["published"]["table"] == "wide_deep_tf2"
    assert cell["measured_vs_published"] == pytest.approx(8_000_000 / 5742941.1)
    assert cell["published_amp_speedup"] == pytest.approx(5742941.1 / 5369859.03)
    assert _cell(report, 1, "precision=tf32,xla=false")["published"]["throughput"] == 1188653.48
    text = report_table.markdown(report)
    section = text.split("## Measured vs published")[1].split("##")[0]
    assert "| 8 | 16384 | precision=amp,xla=true | amp | on | 8,000,000 | 5,742,941 | 1.39 |" in section
    assert "Source wide_deep_tf2: NVIDIA DeepLearningExamples, TensorFlow2/Recommendation/WideAndDeep" in section
    rows = list(csv.DictReader(io.StringIO(report_table.csv_text(report))))
    assert float(rows[1]["precision=amp,xla=true published"]) == 5742941.1
    assert float(rows[1]["precision=amp,xla=true measured_vs_published"]) == pytest.approx(8e6 / 5742941.1)
    json.dumps(report)
    # another batch per GPU matches no row: the section says so and how to get a matching study
    other = _study(tmp_path / "other", [(1, 1), (1, 8)], WD_VARIANTS, batch=65536)
    report = study_report.build(other, _status(other, lambda p: 1e6))
    assert report["published_matches"] == 0
    assert "study reference --model wide_deep --profile mysite" in report_table.markdown(report)


def test_platform_from_the_recorded_profile_and_none_for_an_emulated_cluster(tmp_path):
    record = _study(tmp_path, [(1, 1)], [{}], model="dlrm", batch=65536, profile_text="extends: ci\n")
    report = study_report.build(record, _status(record, lambda p: 1e6))
    assert report["platform"] is None and report["published_matches"] == 0
    assert "is not a platform NVIDIA published results for" in report_table.markdown(report)
    # the profile a point's run recorded (request.json) wins over the file loaded again: dgx1
    (tmp_path / "points" / record.points[0].id / "request.json").write_text(
        json.dumps({"requests": [], "profile": {"name": "mysite", "node": {"name": "dgx1"}}}))
    report = study_report.build(record, _status(record, lambda p: 1e6))
    cell = _cell(report, 1, "default")
    assert report["platform"] == "dgx1" and cell["precision"] == "fp32"
    # the 23.02 table (dlrm_tf2_2302) is the one matched, and the report names its version
    assert cell["published"]["throughput"] == 663000 and cell["published"]["model_size"] == "small"
    assert cell["published"]["table"] == "dlrm_tf2_2302" and "TF2 23.02-py3" in cell["published"]["source"]


def test_amp_speedup_needs_both_precisions(tmp_path):
    record = _study(tmp_path, [(1, 1), (1, 8)], [{"amp": False}, {"amp": True}], model="dlrm", batch=65536,
                    engine_args=["--xla"])
    report = study_report.build(record, _status(record, lambda p: (1.5 if p.variant["amp"] else 1.0) * 1e6 * p.gpus))
    for gpus in (1, 8):
        amp, full = _cell(report, gpus, "amp=true"), _cell(report, gpus, "amp=false")
        assert amp["amp_speedup"] == pytest.approx(1.5) and amp["amp_speedup_vs"] == "amp=false"
        assert full["amp_speedup"] is None
        assert (amp["precision"], full["precision"], amp["xla"]) == ("amp", "tf32", True)
    assert _cell(report, 8, "amp=true")["published_amp_speedup"] == pytest.approx(13.8 / 10.9)
    text = report_table.markdown(report)
    assert "speedup to mixed precision amp=true" in text and "amp=true vs amp=false" in text
    row = next(line for line in text.splitlines() if line.startswith("| 8 |"))
    assert row.rstrip(" |").endswith("1.50")
    assert float(next(csv.DictReader(io.StringIO(report_table.csv_text(report))))["amp=true amp_speedup"]) == 1.5
    # one precision only: no speedup column
    single = _study(tmp_path / "single", [(1, 1)], [{"amp": True}], model="dlrm", batch=65536)
    report = study_report.build(single, _status(single, lambda p: 1e6))
    assert _cell(report, 1, "amp=true")["amp_speedup_vs"] is None
    assert "speedup to mixed precision" not in report_table.markdown(report).split("## Measured")[0]


def test_step_breakdown_table_csv_json_and_bars(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    record = _study(tmp_path, [(1, 1), (1, 2), (1, 4)], [{"amp": False}, {"amp": True}], model="dlrm",
                    batch=65536, repeats=3)
    record.save()
    phases = {1: [1.0, 6.0, 0.0, 0.0, 1.5, 1.5], 2: [1.0, 5.0, 1.5, 2.0, 1.0, 0.5], 4: [0.5, 4.0, 2.5, 3.0, 1.0, -0.5]}

    def breakdown(point):
        ph = phases[point.gpus]
        return _breakdown(sum(ph) + point.repeat, [v + (point.repeat if i == 1 else 0) for i, v in enumerate(ph)],
                          slowest_step=sum(ph) + point.repeat + 1.0)

    values = {0: 1000.0, 1: 1200.0, 2: 1100.0}        # repeat 2 is the median
    monkeypatch.setattr(study_report, "poll", lambda rec: _status(rec, lambda p: values[p.repeat] * p.gpus, breakdown))
    assert cli.main(["study", "report", str(tmp_path), "--plot"]) == 0
    out = capsys.readouterr().out
    report = json.load(open(tmp_path / "report" / "scaling.json"))
    b = report["rows"][1]["variants"]["amp=false"]["breakdown"]
    assert b["point"].endswith("-r2") and b["mean"]["step_ms"] == pytest.approx(sum(phases[2]) + 2)
    for row in report["rows"]:
        for cell in row["variants"].values():
            for over in (cell["breakdown"]["mean"], cell["breakdown"]["slowest_rank"]):
                assert sum(v["pct"] for v in over["phases"].values()) == pytest.approx(100.0, abs=0.01)
    # bandwidth = bytes per step / the phase's time
    assert b["exchanges"]["gradient_exchange"]["gbps_mean"] == pytest.approx(50e6 / 2.0e-3 / 1e9)
    assert b["exchanges"]["embedding_exchange"]["bytes"] == 2_000_000
    assert report["rows"][0]["variants"]["amp=false"]["breakdown"]["exchanges"]["embedding_exchange"]["gbps_mean"] \
        is None                                                         # no time in it on 1 GPU
    text = (tmp_path / "report" / "scaling.md").read_text()
    section = text.split("## Where the step time goes")[1]
    timed = report["rows"][1]["variants"]["amp=false"]["step_time_ms"]   # the throughput column's step, next to it
    assert f"| 2 | 1 x 2 | mean | 13.00 | {timed:,.2f} | {13.0 / timed:,.2f} | 1.00 (7.7%) | 7.00 (53.8%) | 1.50 (11.5%) " \
        "| 2.00 (15.4%) |" in section                                    # split / timed: the cell's timed step (v1)
    assert "| 2 | 1 x 2 | slowest (rank 3) | 14.00 |" in section
    assert "| 4 | 1 x 4 | mean | 12.50 |" in section and "-0.50 (-4.0%)" in section  # negative remainder kept
    rows = list(csv.DictReader(open(tmp_path / "report" / "breakdown.csv")))
    assert len(rows) == 2 * 3 * 2                                       # variants x sizes x (mean, slowest)
    for row in rows:
        assert sum(float(row[f"{p}_pct"]) for p in PHASES) == pytest.approx(100.0, abs=0.01)
    assert {r["ranks"] for r in rows} == {"mean", "slowest_rank"} and rows[1]["rank"] == "3"
    for name in ("breakdown-amp-false.png", "breakdown-amp-true.png", "scaling.png"):
        assert (tmp_path / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert name in out
    # the bars: one per point, one colour per phase, the negative remainder below zero
    import matplotlib.pyplot as plt

    fig = report_breakdown.breakdown_figure(report, "amp=false")
    ax = fig.axes[0]
    assert len(ax.containers) == len(PHASES) and all(len(c.patches) == 3 for c in ax.containers)
    assert len({tuple(c.patches[0].get_facecolor()) for c in ax.containers}) == len(PHASES)
    remainder = ax.containers[PHASES.index("remainder")].patches[2]
    assert remainder.get_y() == 0.0 and remainder.get_height() == pytest.approx(-0.5)
    plt.close(fig)


def test_breakdown_not_measured(tmp_path):
    record = _study(tmp_path, [(1, 1), (1, 2)], [{}], model="dlrm", batch=65536)
    report = study_report.build(record, _status(record, lambda p: 1e6))
    assert not report["breakdown_measured"] and _cell(report, 1, "default")["breakdown"] is None
    text = report_table.markdown(report)
    assert "Not measured: no point's engine summary has a `step_breakdown`" in text and "breakdown_steps: 0" in text
    assert report_breakdown.breakdown_csv_text(report).count("\n") == 1     # the header only
    # one point measured, the other not (an older engine): the table says which
    report = study_report.build(record, _status(record, lambda p: 1e6, lambda p: None if p.gpus == 2 else
                                                _breakdown(10.0, [1, 5, 1, 1, 1, 1], 11.0)))
    assert "| 2 | 1 x 2 | not measured |" in report_table.markdown(report)


def test_throughput_on_log_log_axes_efficiency_linear(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    record = _study(tmp_path, [(1, 1), (1, 8)], WD_VARIANTS)
    report = study_report.build(record, _status(record, lambda p: 1e6 * p.gpus))
    fig = report_figure.figure(report)
    ax_tp, ax_eff = fig.axes
    assert (ax_tp.get_xscale(), ax_tp.get_yscale()) == ("log", "log")
    assert ax_eff.get_yscale() == "linear"
    published = [line for line in ax_tp.get_lines() if line.get_label().endswith("NVIDIA published")]
    assert len(published) == 4 and list(published[-1].get_ydata()) == [2312149.2, 5742941.1]
    plt.close(fig)
