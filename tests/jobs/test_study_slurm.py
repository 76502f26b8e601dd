"""Scaling studies on the local Slurm cluster: real benchmark jobs of the engine under
srun --mpi=pmix with Horovod (ranks = fake GPUs), one CLI call per study, the report read back.

Three studies, each shared by the assertions of its module-scoped fixture, run the ci profile's
default way (its nodes share this host: one point at a time):
- DLRM strong scaling at 1 rank, 1x2, 2x2 and 4x2, model-parallel tables, with the step breakdown;
- NCF on 1 and 2 nodes x 2 variants (sparse_as_dense: false/true), with one point scancelled
  right after submission, reported failed, and resubmitted alone by a second `study run`;
- NCF at 1 and 2 ranks x 3 repeats, in rounds, one repeat slowed on purpose (SIGSTOP/SIGCONT turns).
The same on a cluster with accounting: test_study_acct.py.
"""

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from study_helpers import TINY_DLRM, TINY_NCF, info, record, study_dir as _study_dir, \
    submitted as _submitted, watch as _watch, report as _report, write_spec as _write_spec
from submit_helpers import REPO, Cli
from tests.processes import engine_ranks
from tests.waiting import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.horovod, pytest.mark.slow]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def study_cli(slurm_cluster, tmp_path_factory):
    pytest.importorskip("horovod.tensorflow")
    return Cli(slurm_cluster.env, tmp_path_factory.mktemp("study-runs"))


@pytest.fixture(scope="module")
def dlrm_study(study_cli, tmp_path_factory):
    spec = _write_spec(tmp_path_factory.mktemp("spec") / "dlrm.yaml", name="dlrm-strong", model="dlrm",
                       scaling="strong", batch_size=512, gpus=[1, 2, 4, 8], warmup_steps=2, steps=5,
                       breakdown_steps=5, time="00:10:00",
                       engine_args=TINY_DLRM + ["--embedding-placement", "model_parallel"])
    # on the ci profile (shared nodes) `study run` submits the 4 points one at a time as each ends:
    # 232 s alone on the 2 cores, past 300 s beside the other worker's tests in one CI run
    proc = study_cli("study", "run", spec, "--profile", "ci", check=True, timeout=900)
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
        # every column from the one throughput figure: its step time is the batch over it
        assert cell["step_time_ms"] == pytest.approx(512 * 1000 / cell["throughput"])
        assert cell["step_time_ms"] == pytest.approx(summaries[pid]["mean_step_time_ms"])
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
    # ci has a (measured) fabric: the report projects the measured points (the next sizes up, 16
    # and more, need more than ci's 4 nodes: not projected), and the exchange bytes the projection
    # computes from the engine's own placement are the bytes this run counted
    projection = report["projection"]
    assert projection["next_sizes"] == [] and "## Projection on ci" in text
    projected = {p["gpus"]: p for p in projection["points"]}
    for gpus in (2, 4, 8):
        counted = rows[gpus]["variants"]["default"]["breakdown"]["exchanges"]
        assert projected[gpus]["embedding_bytes_mean"] == counted["embedding_exchange"]["bytes"]
        assert projected[gpus]["gradient_allreduce_bytes"] == counted["gradient_exchange"]["bytes"]
        assert projected[gpus]["measured_throughput"] == rows[gpus]["variants"]["default"]["throughput"]
    # the finished study is in the runs dir's history, with its frozen code and headline
    listed = json.loads(study_cli("study", "history", "--json", check=True).stdout)
    entry = next(e for e in listed if e["study_dir"] == os.path.abspath(dlrm_study["dir"]))
    assert (entry["name"], entry["state"], entry["points"], entry["code"]) == \
        ("dlrm-strong", "present", 4, record(dlrm_study["dir"])["code"]["sha256"])
    assert entry["headline"]["throughput"] == rows[8]["variants"]["default"]["throughput"]


def test_dlrm_step_breakdown_adds_up_and_the_exchange_share_grows(dlrm_study, study_cli):
    shares = {}
    for point in dlrm_study["status"]["points"]:
        b = point["summary"]["step_breakdown"]
        assert b["steps"] == 5 and b["phases"][-1] == "remainder", b
        for over in (b["mean"], b["slowest_rank"]):
            parts = sum(over[f"{p}_ms"] for p in b["phases"])
            assert parts == pytest.approx(over["step_ms"], rel=0.01), (point["id"], over)
        gpus = point["summary"]["world_size"]
        exchange = b["mean"]["embedding_exchange_ms"] + b["mean"]["gradient_exchange_ms"]
        shares[gpus] = exchange / b["mean"]["step_ms"]
        if gpus > 1:        # model-parallel tables: every step sends ids and vectors to the other ranks
            assert b["bytes_per_step"]["embedding_exchange"] > 0 and b["mean"]["embedding_exchange_ms"] > 0, b
    # one rank exchanges nothing; every model-parallel size does. (Beyond that the shares of the
    # emulated nodes, which share 2 cores, are not a scaling result: 8 ranks slow compute as much.)
    assert shares[1] == 0.0 and shares[4] > shares[1] and min(shares[2], shares[8]) > 0, shares
    proc, report = _report(study_cli, dlrm_study["dir"])
    cells = {row["gpus"]: row["variants"]["default"]["breakdown"] for row in report["rows"]}
    assert cells[4]["exchanges"]["embedding_exchange"]["gbps_mean"] > 0
    text = open(os.path.join(dlrm_study["dir"], "report", "scaling.md")).read()
    assert "## Where the step time goes" in text and "| 8 | 4 x 2 | mean |" in text
    with open(os.path.join(dlrm_study["dir"], "report", "breakdown-default.png"), "rb") as handle:
        assert handle.read(8) == PNG_MAGIC


def test_dlrm_rerun_submits_nothing_and_polls_once(dlrm_study, study_cli, slurm_env):
    proc = study_cli("study", "run", dlrm_study["spec"], "--profile", "ci", check=True)
    assert _submitted(proc) == (0, 4)
    assert _study_dir(proc) == dlrm_study["dir"]
    record = json.load(open(os.path.join(dlrm_study["dir"], "study.json")))
    assert all(len(p["runs"]) == 1 for p in record["points"])
    # a whole-study poll of unfinished points is one Slurm call: forget the cached states
    from jobs.study.running import run as study_run
    from jobs.study.running import record as study_record

    for point in record["points"]:
        os.remove(os.path.join(point["runs"][0], "status.json"))
    status = study_record.poll(study_record.StudyRecord.load(dlrm_study["dir"]))
    assert status.calls == 1
    assert study_record.poll(study_record.StudyRecord.load(dlrm_study["dir"])).calls == 0    # cached


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
    # `recsys-submit requeue` refuses a finished job (test_finished_run_refusals.py); Slurm itself
    # requeues it, and the point's cached COMPLETED is dropped as that command did for a live job
    slurm_cluster.run(["scontrol", "requeue", point["job_id"]], check=True)
    os.remove(os.path.join(point["run_dir"], "status.json"))
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
    assert cell["n"] == 1 and cell["throughput"] == summaries[-1]["throughput_samples_per_s"]


def test_max_concurrent_keeps_one_point_queued(study_cli, tmp_path):
    proc = study_cli("study", "run", "--profile", "ci", "--model", "ncf", "--gpus", "1", "--batch-size", "512",
                     "--variant", "sparse_as_dense=false,true", "--warmup-steps", "1", "--steps", "2",
                     "--name", "ncf-one-at-a-time", "--max-concurrent", "1", "--", *TINY_NCF, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _submitted(proc) == (2, 2)
    assert "waiting for a free slot (at most 1 point(s) queued or running; 1 to submit)" in proc.stderr
    record = json.load(open(os.path.join(_study_dir(proc), "study.json")))
    first, second = (p["runs"][0] for p in record["points"])
    info = [f for f in os.listdir(os.path.join(first, "logs")) if f.endswith(".info")]
    ended = int(re.search(r"^end=(\d+)$", open(os.path.join(first, "logs", info[0])).read(), re.M).group(1))
    # the second point went in only after the first had left the queue
    assert os.stat(os.path.join(second, "request.json")).st_mtime >= ended


@pytest.fixture(scope="module")
def repeats_study(study_cli, slurm_cluster, tmp_path_factory):
    """NCF at 1 and 2 ranks, 3 repeats each, run the ci
    profile's default way (its nodes share this host: one point at a time, in rounds). The
    1-rank point's second repeat is slowed down on purpose: from the moment its engine log says
    the first step is done until it writes its summary, its rank is stopped (SIGSTOP) half the
    time, in 0.1 s turns, a slow-down the job's own timing must show. Throttled until the summary,
    not stopped once: the 2,000 timed steps (about 2 s) start after the warm-up steps, whose time
    varies by machine, and a single 2 s stall once missed them on CI."""
    spec = _write_spec(tmp_path_factory.mktemp("spec") / "repeats.yaml", name="ncf-repeats", model="ncf",
                       batch_size=4096, gpus=[1, 2], repeats=3, warmup_steps=5, steps=2000, time="00:10:00",
                       engine_args=TINY_NCF)
    run = subprocess.Popen([sys.executable, "-m", "jobs.cli", "study", "run", str(spec), "--profile", "ci"],
                           cwd=REPO, env=study_cli.env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    slow = "ncf-repeats-g1-n1x1-r1"
    points = os.path.join(study_cli.runs_dir, "study-ncf-repeats", "points")

    def logged(text):
        for log in glob.glob(os.path.join(points, f"{slow}-*", "logs", "*.engine.jsonl")):
            with open(log) as handle:
                if text in handle.read():
                    return True
        return run.poll() is not None

    # polled every 0.1 s: the throttle starts before the timed steps (after the warm-up steps)
    wait_for(lambda: logged('"first_step"'), timeout=900, what=f"{slow} to take its first step", max_delay=0.1)
    ranks = engine_ranks(f"/{slow}-")
    stalled_at = time.time()
    turns = 0
    try:
        while not logged('"type": "summary"'):
            # the slow-down itself (the fault injected), not a wait for anything
            for pid in ranks:
                os.kill(pid, signal.SIGSTOP)
            time.sleep(0.1)
            for pid in ranks:
                os.kill(pid, signal.SIGCONT)
            time.sleep(0.1)
            turns += 1
    except ProcessLookupError:
        pass                        # the rank ended between two turns
    finally:
        for pid in ranks:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    stdout, stderr = run.communicate(timeout=1200)
    directory = _study_dir(subprocess.CompletedProcess([], run.returncode, stdout, stderr))
    rc, status = _watch(study_cli, directory)
    proc, report = _report(study_cli, directory)
    return {"run": (run.returncode, stdout, stderr), "dir": directory, "rc": rc, "status": status,
            "report": (proc, report), "slow": slow, "ranks": ranks, "stalled_at": stalled_at, "turns": turns}


def test_repeats_run_one_point_at_a_time_in_rounds(repeats_study):
    rc, stdout, stderr = repeats_study["run"]
    assert rc == 0, stdout + stderr
    assert repeats_study["rc"] == 0
    spans = []
    for point in record(repeats_study["dir"])["points"]:
        values = info(point["runs"][0])
        spans.append((int(values["start"]), int(values["end"]), point["repeat"], point["id"]))
    spans.sort()
    # rounds: every point's repeat r before any point's repeat r+1
    assert [repeat for _, _, repeat, _ in spans] == [0, 0, 1, 1, 2, 2], spans
    # measured alone: no job started before the one before it had ended
    for (_, end, _, _), (start, _, _, _) in zip(spans, spans[1:]):
        assert start >= end, spans


def test_repeat_statistics_come_from_the_summaries(repeats_study):
    import statistics

    proc, report = repeats_study["report"]
    by_id = {p["id"]: p for p in repeats_study["status"]["points"]}
    for row in report["rows"]:
        cell = row["variants"]["default"]
        values = [by_id[f"g{row['gpus']}-n1x{row['gpus']}-r{r}"]["summary"]["throughput_samples_per_s"]
                  for r in range(3)]
        assert cell["throughputs"] == values and cell["n"] == 3
        assert cell["throughput"] == statistics.median(values)
        assert (cell["throughput_min"], cell["throughput_max"]) == (min(values), max(values))
        assert cell["cv"] == pytest.approx(statistics.stdev(values) / statistics.mean(values))
        assert cell["step_time_ms"] == pytest.approx(4096 * 1000 / cell["throughput"])
    assert report["rows"][1]["variants"]["default"]["speedup"] == pytest.approx(
        report["rows"][1]["variants"]["default"]["throughput"] / report["rows"][0]["variants"]["default"]["throughput"])


def test_a_repeat_slowed_on_purpose_is_flagged(repeats_study):
    proc, report = repeats_study["report"]
    cell = report["rows"][0]["variants"]["default"]
    slowed = next(p for p in repeats_study["status"]["points"] if p["id"] == "g1-n1x1-r1")
    # its one rank was stopped while that repeat's job ran (its batch script's start and end)
    ran = info(slowed["run_dir"])
    assert len(repeats_study["ranks"]) == 1
    assert int(ran["start"]) <= repeats_study["stalled_at"] < int(ran["end"]), (ran, repeats_study["stalled_at"])
    assert repeats_study["turns"] >= 5, repeats_study["turns"]      # throttled for a second at least
    assert slowed["summary"]["throughput_samples_per_s"] == cell["throughput_min"]
    assert cell["throughput_max"] / cell["throughput_min"] > 1.25, cell
    assert cell["spread_warning"], cell
    assert proc.returncode == 0                      # a warning, not a failure
    assert "warning" in proc.stderr and "g1" in proc.stderr
    text = open(os.path.join(repeats_study["dir"], "report", "scaling.md")).read()
    assert cell["spread_warning"].split(":")[0] in text or "spread" in text.lower()
