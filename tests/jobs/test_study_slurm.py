"""Scaling studies on the local Slurm cluster: real benchmark jobs of the engine under
srun --mpi=pmix with Horovod (ranks = fake GPUs), one CLI call per study, the report read back.

Two studies, each shared by the assertions of its module-scoped fixture:
- DLRM strong scaling at 1 rank, 1x2, 2x2 and 4x2;
- NCF on 1 and 2 nodes x 2 variants (sparse_as_dense: false/true), with one point scancelled
  right after submission, reported failed, and resubmitted alone by a second `study run`.
"""

import json
import os
import re

import pytest

from submit_helpers import Cli

pytestmark = [pytest.mark.slurm, pytest.mark.horovod, pytest.mark.slow]

TINY_DLRM = ["--embedding-dim", "4", "--bottom-mlp", "8,4", "--top-mlp", "8,1", "--synthetic-rows", "4096"]
TINY_NCF = ["--factors", "4", "--layers", "16,8,4"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _study_dir(proc):
    match = re.search(r"^study dir (.+)$", proc.stdout, re.M)
    assert match, proc.stdout + proc.stderr
    return match.group(1).strip()


def _submitted(proc):
    match = re.search(r"^submitted (\d+) of (\d+) point", proc.stdout, re.M)
    assert match, proc.stdout + proc.stderr
    return int(match.group(1)), int(match.group(2))


def _write_spec(path, **spec):
    import yaml

    path.write_text(yaml.safe_dump(spec))
    return path


def _watch(cli, study_dir):
    proc = cli("study", "status", study_dir, "--watch", "--json", timeout=1200)
    return proc.returncode, json.loads(proc.stdout)


def _report(cli, study_dir):
    proc = cli("study", "report", study_dir, timeout=300)
    with open(os.path.join(study_dir, "report", "scaling.json")) as handle:
        return proc, json.load(handle)


@pytest.fixture(scope="module")
def study_cli(slurm_cluster, tmp_path_factory):
    pytest.importorskip("horovod.tensorflow")
    return Cli(slurm_cluster.env, tmp_path_factory.mktemp("study-runs"))


@pytest.fixture(scope="module")
def dlrm_study(study_cli, tmp_path_factory):
    spec = _write_spec(tmp_path_factory.mktemp("spec") / "dlrm.yaml", name="dlrm-strong", model="dlrm",
                       scaling="strong", batch_size=512, gpus=[1, 2, 4, 8], warmup_steps=2, steps=5,
                       time="00:10:00", engine_args=TINY_DLRM)
    proc = study_cli("study", "run", spec, "--profile", "ci", check=True)
    study_dir = _study_dir(proc)
    rc, status = _watch(study_cli, study_dir)
    return {"spec": spec, "dir": study_dir, "run": proc, "rc": rc, "status": status}


def test_dlrm_points_ran_with_their_world_size(dlrm_study):
    assert _submitted(dlrm_study["run"]) == (4, 4)
    status = dlrm_study["status"]
    assert dlrm_study["rc"] == 0, status
    by_id = {p["id"]: p for p in status["points"]}
    assert set(by_id) == {"g1-n1x1-r0", "g2-n1x2-r0", "g4-n2x2-r0", "g8-n4x2-r0"}
    for pid, point in by_id.items():
        gpus = int(pid[1:pid.index("-")])
        assert point["state"] == "done", point
        assert point["summary"]["world_size"] == gpus, point
        assert point["summary"]["global_batch_size"] == 512
        assert point["summary"]["timed_steps"] == 5


def test_dlrm_engine_log_in_run_dir_and_status_json_summary(dlrm_study, study_cli):
    point = next(p for p in dlrm_study["status"]["points"] if p["id"] == "g4-n2x2-r0")
    run_dir = point["run_dir"]
    logs = [f for f in os.listdir(os.path.join(run_dir, "logs")) if f.endswith(".engine.jsonl")]
    assert logs == [f"main-{point['job_id']}.engine.jsonl"]
    with open(os.path.join(run_dir, "logs", logs[0])) as handle:
        records = [json.loads(line) for line in handle]
    phases = [r["phase"] for r in records if r["type"] == "startup"]
    assert phases == ["horovod_init", "data", "model", "first_step"]
    proc = study_cli("status", run_dir, "--json", check=True)
    job = json.loads(proc.stdout)["jobs"][0]
    assert job["state"] == "COMPLETED"
    assert job["summary"]["world_size"] == 4
    assert job["summary"]["throughput_samples_per_s"] == point["summary"]["throughput_samples_per_s"]


def test_dlrm_report_table_comes_from_the_summaries(dlrm_study, study_cli):
    proc, report = _report(study_cli, dlrm_study["dir"])
    assert proc.returncode == 0, proc.stderr
    summaries = {p["id"]: p["summary"] for p in dlrm_study["status"]["points"]}
    rows = {row["gpus"]: row for row in report["rows"]}
    assert sorted(rows) == [1, 2, 4, 8]
    assert [(rows[g]["nodes"], rows[g]["gpus_per_node"]) for g in (1, 2, 4, 8)] == [(1, 1), (1, 2), (2, 2), (4, 2)]
    base = summaries["g1-n1x1-r0"]["throughput_samples_per_s"]
    for gpus, row in rows.items():
        cell = row["variants"]["default"]
        pid = next(p for p in summaries if p.startswith(f"g{gpus}-"))
        assert cell["throughput"] == summaries[pid]["throughput_samples_per_s"]
        assert cell["step_time_ms"] == summaries[pid]["mean_step_time_ms"]
        assert cell["speedup"] == pytest.approx(cell["throughput"] / base)
        assert cell["efficiency"] == pytest.approx(cell["speedup"] / gpus)
        assert row["batch_per_gpu"] * gpus == row["global_batch"] == 512
        assert cell["startup_s"] > 0
    text = open(os.path.join(dlrm_study["dir"], "report", "scaling.md")).read()
    header = next(line for line in text.splitlines() if line.startswith("- profile:"))
    assert header.startswith("- profile: ci; up to 4 node(s) per point; ran on: node"), header
    assert f"{rows[8]['variants']['default']['throughput']:,.0f}" in text
    csv_lines = open(os.path.join(dlrm_study["dir"], "report", "scaling.csv")).read().splitlines()
    assert len(csv_lines) == 5 and csv_lines[0].startswith("gpus,nodes,gpus_per_node")
    png = os.path.join(dlrm_study["dir"], "report", "scaling.png")
    with open(png, "rb") as handle:
        assert handle.read(8) == PNG_MAGIC
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[0] > 100


def test_dlrm_rerun_submits_nothing_and_polls_once(dlrm_study, study_cli, slurm_env):
    proc = study_cli("study", "run", dlrm_study["spec"], "--profile", "ci", check=True)
    assert _submitted(proc) == (0, 4)
    assert _study_dir(proc) == dlrm_study["dir"]
    record = json.load(open(os.path.join(dlrm_study["dir"], "study.json")))
    assert all(len(p["runs"]) == 1 for p in record["points"])
    # a whole-study poll of unfinished points is one Slurm call: forget the cached states
    from jobs.study import run as study_run

    for point in record["points"]:
        os.remove(os.path.join(point["runs"][0], "status.json"))
    status = study_run.poll(study_run.StudyRecord.load(dlrm_study["dir"]))
    assert status.calls == 1
    assert study_run.poll(study_run.StudyRecord.load(dlrm_study["dir"])).calls == 0    # cached


@pytest.fixture(scope="module")
def ncf_study(study_cli, slurm_cluster, tmp_path_factory):
    spec = _write_spec(tmp_path_factory.mktemp("spec") / "ncf.yaml", name="ncf-variants", model="ncf",
                       batch_size=1024, points=[{"nodes": 1, "gpus_per_node": 1}, {"nodes": 2, "gpus_per_node": 1}],
                       variants={"sparse_as_dense": [False, True]}, warmup_steps=2, steps=5,
                       time="00:10:00", engine_args=TINY_NCF)
    proc = study_cli("study", "run", spec, "--profile", "ci", check=True)
    study_dir = _study_dir(proc)
    record = json.load(open(os.path.join(study_dir, "study.json")))
    victim = next(p for p in record["points"] if p["id"] == "g2-n2x1-sparse_as_dense-true-r0")
    job_id = json.load(open(os.path.join(victim["runs"][0], "jobs.json")))["jobs"][0]["job_id"]
    slurm_cluster.run(["scancel", job_id], check=True)
    rc, status = _watch(study_cli, study_dir)
    first_report = _report(study_cli, study_dir)
    rerun = study_cli("study", "run", spec, "--profile", "ci", check=True)
    rc2, status2 = _watch(study_cli, study_dir)
    return {"spec": spec, "dir": study_dir, "run": proc, "victim": victim["id"], "rc": rc, "status": status,
            "first_report": first_report, "rerun": rerun, "rc2": rc2, "status2": status2}


def test_ncf_scancelled_point_is_reported_failed(ncf_study):
    assert _submitted(ncf_study["run"]) == (4, 4)
    by_id = {p["id"]: p for p in ncf_study["status"]["points"]}
    assert ncf_study["rc"] == 1                      # a failed point is not success
    assert by_id[ncf_study["victim"]]["state"] == "failed"
    assert "CANCELLED" in by_id[ncf_study["victim"]]["reason"]
    assert [p["state"] for i, p in by_id.items() if i != ncf_study["victim"]] == ["done"] * 3
    proc, report = ncf_study["first_report"]
    assert proc.returncode == 1
    assert [f["point"] for f in report["failures"]] == [ncf_study["victim"]]
    row = next(r for r in report["rows"] if r["gpus"] == 2)
    assert row["variants"]["sparse_as_dense=true"]["throughput"] is None
    assert row["variants"]["sparse_as_dense=true"]["failed"]
    assert "FAILED" in proc.stdout and ncf_study["victim"] in proc.stdout


def test_ncf_rerun_resubmits_only_the_failed_point(ncf_study, study_cli):
    assert _submitted(ncf_study["rerun"]) == (1, 4)
    assert ncf_study["victim"] in ncf_study["rerun"].stdout
    assert ncf_study["rc2"] == 0
    record = json.load(open(os.path.join(ncf_study["dir"], "study.json")))
    assert {p["id"]: len(p["runs"]) for p in record["points"]}[ncf_study["victim"]] == 2
    assert sorted(len(p["runs"]) for p in record["points"]) == [1, 1, 1, 2]
    proc, report = _report(study_cli, ncf_study["dir"])
    assert proc.returncode == 0 and not report["failures"]
    summaries = {p["id"]: p["summary"] for p in ncf_study["status2"]["points"]}
    assert report["variants"] == ["sparse_as_dense=false", "sparse_as_dense=true"]
    for row in report["rows"]:
        for label, cell in row["variants"].items():
            pid = f"g{row['gpus']}-n{row['nodes']}x1-{label.replace('=', '-')}-r0"
            assert summaries[pid]["world_size"] == row["gpus"]
            assert cell["throughput"] == summaries[pid]["throughput_samples_per_s"]
            base = summaries[f"g1-n1x1-{label.replace('=', '-')}-r0"]["throughput_samples_per_s"]
            assert cell["efficiency"] == pytest.approx(cell["throughput"] / base / row["gpus"])
    assert _submitted(study_cli("study", "run", ncf_study["spec"], "--profile", "ci", check=True)) == (0, 4)


def test_requeued_point_counts_once(ncf_study, study_cli, slurm_cluster):
    point = next(p for p in ncf_study["status2"]["points"] if p["id"] == "g1-n1x1-sparse_as_dense-false-r0")
    study_cli("requeue", point["run_dir"], check=True)
    # Slurm holds a requeued job back (BeginTime a while ahead); let it start now
    slurm_cluster.run(["scontrol", "update", f"JobId={point['job_id']}", "StartTime=now"], check=True)
    rc, status = _watch(study_cli, ncf_study["dir"])
    assert rc == 0
    again = next(p for p in status["points"] if p["id"] == point["id"])
    assert again["state"] == "done" and again["attempts"] == 1 and again["job_id"] == point["job_id"]
    log = os.path.join(point["run_dir"], "logs", f"main-{point['job_id']}.engine.jsonl")
    summaries = [json.loads(line) for line in open(log) if '"type": "summary"' in line]
    assert len(summaries) == 2                              # both runs of the job logged one
    assert again["summary"]["time"] == summaries[-1]["time"]  # the last one counts
    proc, report = _report(study_cli, ncf_study["dir"])
    cell = next(r for r in report["rows"] if r["gpus"] == 1)["variants"]["sparse_as_dense=false"]
    assert cell["repeats"] == 1 and cell["throughput"] == summaries[-1]["throughput_samples_per_s"]


def test_max_concurrent_keeps_one_point_queued(study_cli, tmp_path):
    proc = study_cli("study", "run", "--profile", "ci", "--model", "ncf", "--gpus", "1", "--batch-size", "512",
                     "--variant", "sparse_as_dense=false,true", "--warmup-steps", "1", "--steps", "2",
                     "--name", "ncf-one-at-a-time", "--max-concurrent", "1", "--", *TINY_NCF, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _submitted(proc) == (2, 2)
    record = json.load(open(os.path.join(_study_dir(proc), "study.json")))
    first, second = (p["runs"][0] for p in record["points"])
    info = [f for f in os.listdir(os.path.join(first, "logs")) if f.endswith(".info")]
    ended = int(re.search(r"^end=(\d+)$", open(os.path.join(first, "logs", info[0])).read(), re.M).group(1))
    # the second point went in only after the first had left the queue
    assert os.stat(os.path.join(second, "request.json")).st_mtime >= ended
