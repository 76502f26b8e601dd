"""`--profile local`: the same request as local processes (submitit + mpirun), no Slurm."""

import json
import os
import re
import subprocess
import sys

from submit_helpers import REPO, hello_lines


def _run(tmp_path, *args, **extra_env):
    env = dict(os.environ, RECSYS_RUNS_DIR=str(tmp_path / "runs"), OMPI_MCA_btl="self,tcp",
               OMPI_MCA_btl_tcp_if_include="lo", OMPI_MCA_oob_tcp_if_include="lo", **extra_env)
    env.pop("SLURM_CONF", None)
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=300)


def _run_dir(proc):
    return next(line[8:] for line in proc.stdout.splitlines() if line.startswith("run dir "))


SECRET = "s3cr3t-value-never-written"


def test_local_hello_two_ranks(tmp_path):
    """Also: a secret in the submitting environment (docs/profiles.md, "Secrets") is written
    nowhere in the run dir, which is private to its owner."""
    proc = _run(tmp_path, "benchmark", "--profile", "local", "--model", "hello", "--gpus-per-node", "2",
                "--time", "5", MY_API_TOKEN=SECRET)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "COMPLETED" in proc.stdout
    run_dir = _run_dir(proc)
    assert os.stat(run_dir).st_mode & 0o777 == 0o700
    for directory, _, files in os.walk(run_dir):
        for name in files:
            with open(os.path.join(directory, name), "rb") as handle:
                assert SECRET.encode() not in handle.read(), name
    ranks = sorted(hello_lines(run_dir), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [r["local_rank"] for r in ranks] == [0, 1]
    assert all(r["mpi"] and r["mpi_size"] == 2 and r["allreduce_ok"] for r in ranks)
    assert all(r["world_size"] == 2 for r in ranks)
    from jobs.profiles.binding import rank_binding
    from jobs.profiles import load_profile

    node = load_profile("local").node
    for r in ranks:
        expected = rank_binding(node, r["local_rank"], "exclusive", local_size=2).cpus
        assert r["cpus"] == expected
    record = json.load(open(os.path.join(run_dir, "jobs.json")))
    assert record["scheduler"] == "local"
    status = _run(tmp_path, "status", run_dir)
    assert "COMPLETED" in status.stdout


def test_local_failure_stops_the_chain(tmp_path):
    proc = _run(tmp_path, "train", "--profile", "local", "--model", "hello", "--then-evaluate",
                "--time", "5", "--", "--fail")
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("recsys-submit: error:")]
    assert len(errors) == 1 and "'train' failed" in errors[0], proc.stderr
    run_dir = _run_dir(proc)
    assert [r["kind"] for r in hello_lines(run_dir)] == ["train"]   # evaluate never started


def test_local_no_wait_then_cancel(tmp_path):
    import time

    proc = _run(tmp_path, "benchmark", "--profile", "local", "--model", "hello", "--gpus-per-node", "2",
                "--time", "5", "--no-wait", "--", "--sleep", "60")
    assert proc.returncode == 0, proc.stderr
    run_dir = _run_dir(proc)
    deadline = time.monotonic() + 60
    while not hello_lines(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "RUNNING" in _run(tmp_path, "status", run_dir).stdout
    assert _run(tmp_path, "cancel", run_dir).returncode == 0
    while "RUNNING" in _run(tmp_path, "status", run_dir).stdout and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "CANCELLED" in _run(tmp_path, "status", run_dir).stdout
    pids = [r["pid"] for r in hello_lines(run_dir)]
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()


def test_local_train_prints_the_engine_summary(tmp_path):
    """Waiting for a training job ends with the engine's summary (metrics, throughput, step time,
    checkpoint), read from its JSON-lines log in the run dir, not from text logs."""
    ckpt = tmp_path / "ckpt"
    proc = _run(tmp_path, "train", "--profile", "local", "--model", "dlrm", "--", "--synthetic",
                "--synthetic-rows", "4096", "--batch-size", "512", "--embedding-dim", "8",
                "--bottom-mlp", "16,8", "--top-mlp", "16,1", "--epochs", "1", "--benchmark-warmup-steps", "2",
                "--checkpoint-dir", str(ckpt))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from jobs.runs import enginelog

    run_dir = _run_dir(proc)
    summary = enginelog.summary(enginelog.job_logs(run_dir, "main"))
    assert summary is not None and summary["checkpoint"], summary
    line = next(l for l in proc.stdout.splitlines() if "samples/s" in l)
    assert f"auc {summary['auc']:.4f}" in line and f"at step {summary['eval_step']}" in line
    assert f"{summary['throughput_samples_per_s']:,.0f} samples/s" in line
    assert f"checkpoint {summary['checkpoint']}" in line and str(ckpt) in summary["checkpoint"]


def test_local_after_waits_for_a_running_local_job_and_refuses_unknown_ids(tmp_path):
    """Issue 15 item 8 on the local profile: --after takes the pid of a running local job (from
    --no-wait), waits for it to end well, then runs; an id of no local job is refused at once."""
    refused = _run(tmp_path, "benchmark", "--profile", "local", "--model", "hello", "--after", "999999")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "recsys-submit: error: --after: local knows no job 999999 (a local job id is the pid of a running "
        "local job (one started with --no-wait))"]
    first = _run(tmp_path, "benchmark", "--profile", "local", "--model", "hello", "--time", "5", "--no-wait",
                 "--name", "first", "--", "--sleep", "3")
    assert first.returncode == 0, first.stderr
    first_dir = _run_dir(first)
    first_id = json.load(open(os.path.join(first_dir, "jobs.json")))["jobs"][0]["job_id"]
    second = _run(tmp_path, "benchmark", "--profile", "local", "--model", "hello", "--time", "5",
                  "--name", "second", "--after", first_id)
    assert second.returncode == 0, second.stdout + second.stderr
    [before] = hello_lines(first_dir)
    [after] = hello_lines(_run_dir(second))
    end = max(float(line.split("end=")[1]) for path in os.listdir(os.path.join(first_dir, "logs"))
              if path.endswith(".rank0.log")
              for line in open(os.path.join(first_dir, "logs", path)) if line.startswith("BYE"))
    assert after["start"] >= end > before["start"]


def test_a_foreground_local_job_says_how_it_goes(tmp_path):
    """A long local job in the foreground prints a progress line every PROGRESS_S (30 s; 0.5 s
    here): elapsed time and the newest line of its output (issue 48 item 8: a 2 min 38 s
    preprocessing run printed nothing until it ended)."""
    from jobs.backends.local.states import PROGRESS_S, wait_for
    from jobs.runs.records import RunRecord

    assert PROGRESS_S == 30.0
    proc = _run(tmp_path, "benchmark", "--profile", "local", "--model", "hello", "--gpus-per-node", "1",
                "--time", "5", "--no-wait", "--", "--sleep", "4")
    assert proc.returncode == 0, proc.stderr
    run_dir = _run_dir(proc)
    lines = []
    state = wait_for(run_dir, RunRecord.load(run_dir).jobs[0], progress=lines.append, every=0.5)
    assert state == "COMPLETED"
    assert len(lines) >= 3, lines
    assert all(re.fullmatch(r"local job main \(pid \d+\) running 0:00:0\d(; last output: .+)?", x) for x in lines), lines
    assert any("last output: HELLO " in x for x in lines), lines
