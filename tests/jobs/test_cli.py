"""Every `recsys-submit` subcommand once, against the local cluster; status call counting."""

import json
import os

import pytest

from jobs import status as status_mod
from jobs.api import JobRequest, submit

from submit_helpers import hello_lines

pytestmark = pytest.mark.slurm
HELLO = ["--profile", "ci", "--model", "hello", "--nodes", "1", "--time", "5"]


def test_profiles_subcommands(cli, tmp_path):
    listed = cli("profiles", "list", check=True).stdout
    for name in ("ci", "local", "dgx1", "dgx2", "dgxa100"):
        assert f"\n{name} " in "\n" + listed
    shown = cli("profiles", "show", "dgxa100", check=True).stdout
    assert "48" in shown and "gpu_cores" in shown
    assert cli("profiles", "validate", check=True).stdout.count("ok ") >= 5
    bad = tmp_path / "bad.yaml"
    bad.write_text("scheduler: slurm\nnode: dgxa100\nmax_nodes: 2\nbogus_key: 1\n")
    proc = cli("profiles", "validate", str(bad))
    assert proc.returncode == 2 and "bogus_key" in proc.stderr


def test_render_prints_and_submits_nothing(cli, slurm_cluster):
    proc = cli("render", "train", *HELLO, "--array", "3", "--parallelism", "1", check=True)
    assert proc.stdout.startswith("#!/bin/bash") and "#SBATCH --array=0-2%1" in proc.stdout
    assert not os.path.exists(cli.runs_dir)
    dry = cli("train", *HELLO, "--dry-run", check=True)
    assert "srun --mpi=pmix" in dry.stdout and not os.path.exists(cli.runs_dir)


def test_render_o_writes_the_scripts_it_tells_you_to_sbatch(cli, slurm_cluster, tmp_path):
    """Issue 15 item 7: without -o the printed script promises no file; with -o DIR the script is
    written as DIR/<key>.sbatch (DIR is its run dir) and submitting it by hand runs the job."""
    printed = cli("render", "benchmark", *HELLO, "--gpus-per-node", "1", check=True).stdout
    assert "Submit by hand with" not in printed and "Printed only, not written" in printed
    out = tmp_path / "scripts"
    proc = cli("render", "benchmark", *HELLO, "--gpus-per-node", "1", "-o", out, check=True)
    script = out / "main.sbatch"
    assert proc.stdout.splitlines() == [f"wrote {script}", f"Submit by hand with: sbatch {script}"]
    assert f"# Submit by hand with: sbatch {script}" in script.read_text()
    assert f"export RECSYS_RUN_DIR={out}" in script.read_text()
    assert not os.path.exists(cli.runs_dir)
    job_id = slurm_cluster.run(["sbatch", "--parsable", str(script)], check=True).stdout.strip().split(";")[0]
    assert slurm_cluster.wait_job(job_id) == "COMPLETED"
    assert [r["kind"] for r in hello_lines(str(out))] == ["benchmark"]
    chain = cli("render", "train", *HELLO, "--then-evaluate", "-o", tmp_path / "chain", check=True).stdout
    assert "then the others in order" in chain
    assert "# Submit by hand with: sbatch --dependency=afterok:<train> " in (tmp_path / "chain" / "evaluate.sbatch").read_text()


def test_train_status_logs(cli, slurm_cluster):
    run_dir, record = cli.submit("train", *HELLO, "--", "--sleep", "1")
    assert os.path.isfile(os.path.join(run_dir, "request.json"))
    assert os.path.isfile(os.path.join(run_dir, "main.sbatch"))
    followed = cli("logs", run_dir, "--follow", "--rank", "1", check=True)
    assert "HELLO " in followed.stdout and '"local_rank": 1' in followed.stdout
    watched = cli("status", run_dir, "--watch", check=True)
    assert "COMPLETED" in watched.stdout
    as_json = json.loads(cli("status", "--json", check=True).stdout)   # newest run by default
    assert as_json["jobs"][0]["state"] == "COMPLETED" and as_json["run_dir"] == run_dir
    assert as_json["calls"] == 0                       # terminal states are cached
    batch = cli("logs", run_dir, check=True).stdout
    assert "main-" in batch


def test_evaluate_and_preprocess_submit(cli, slurm_cluster, tmp_path):
    run_dir, record = cli.submit("evaluate", *HELLO, "--ntasks-per-node", "1")
    assert slurm_cluster.wait_job(record["jobs"][0]["job_id"]) == "COMPLETED"
    assert [r["kind"] for r in hello_lines(run_dir)] == ["evaluate"]
    run_dir, record = cli.submit("preprocess", "--profile", "ci", "--dataset", "movielens",
                                 "--input", tmp_path / "raw", "--output", tmp_path / "out",
                                 "--time", "5", "--", "--dry-run")
    script = open(os.path.join(run_dir, "preprocess.sbatch")).read()
    assert "-m preproc movielens run --input" in script
    assert slurm_cluster.wait_job(record["jobs"][0]["job_id"]) in ("COMPLETED", "FAILED")


def test_cancel_subcommand(cli, slurm_cluster):
    run_dir, record = cli.submit("benchmark", *HELLO, "--array", "3", "--", "--sleep", "60")
    out = cli("cancel", run_dir, check=True).stdout
    assert record["jobs"][0]["job_id"] in out
    assert slurm_cluster.wait_job(record["jobs"][0]["job_id"]) == "CANCELLED"
    status = cli("status", run_dir, "--json")
    assert status.returncode == 1       # a cancelled run did not complete: `status RUN && next` stops
    final = json.loads(status.stdout)
    assert set(final["jobs"][0]["tasks"].values()) == {"CANCELLED"} and final["done"]


def test_status_is_one_squeue_call_per_poll(slurm_env, tmp_path, monkeypatch):
    monkeypatch.setenv("RECSYS_RUNS_DIR", str(tmp_path / "runs"))
    requests = [JobRequest(kind="benchmark", model="hello", nodes=1, gpus_per_node=1, time="5",
                           engine_args=["--sleep", "1"], array=4, array_parallelism=2),
                JobRequest(kind="evaluate", model="hello", nodes=1, gpus_per_node=1, time="5")]
    record = submit(requests, "ci")
    assert record["accounting"] is False
    polls = []
    final = status_mod.watch(record["run_dir"], on_poll=polls.append, first=0.2, ceiling=1)
    assert len(polls) >= 2
    assert [p["calls"] for p in polls] == [1] * len(polls)
    assert {p["source"] for p in polls} == {"squeue"}
    assert final["done"] and not status_mod.run_failed(final)
    assert len(final["jobs"][0]["tasks"]) == 4
