"""`status` on a cluster with accounting (MariaDB + slurmdbd): one sacct call per poll, and one
squeue call more while sacct has not heard of a fresh job (it learns of it seconds after sbatch):
the job is then pending, never unknown or failed."""

import os

import pytest

from jobs.backends.slurm import commands as slurmcli
from jobs import status as status_mod
from jobs.api import JobRequest, submit

from submit_helpers import Cli

pytestmark = pytest.mark.slurm


@pytest.fixture
def acct_env(slurm_cluster_acct, monkeypatch, tmp_path):
    for key, value in slurm_cluster_acct.env.items():
        if os.environ.get(key) != value:
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("RECSYS_RUNS_DIR", str(tmp_path / "runs"))
    slurmcli.reset_cache()
    yield slurm_cluster_acct
    slurmcli.reset_cache()


def test_status_uses_one_sacct_call_per_poll(acct_env):
    assert slurmcli.accounting_enabled()
    hello = dict(model="hello", nodes=1, gpus_per_node=1, time="5")
    record = submit([JobRequest(kind="benchmark", array=3, array_parallelism=2,
                                engine_args=["--sleep", "1"], **hello)], "ci")
    assert record["accounting"] is True
    polls = []
    final = status_mod.watch(record["run_dir"], on_poll=polls.append, first=0.3, ceiling=1, timeout=120)
    assert final["done"]
    for p in polls:
        assert (p["source"], p["calls"]) in {("sacct", 1), ("sacct+squeue", 2)}, p
        assert set(p["jobs"][0]["tasks"].values()) <= {"PENDING", "RUNNING", "COMPLETED"}, p
    assert polls[-1]["source"] == "sacct"
    assert set(final["jobs"][0]["tasks"].values()) == {"COMPLETED"}
    assert status_mod.poll(record["run_dir"])["calls"] == 0      # finished: cached, no call


def test_failed_job_through_sacct_and_cli(acct_env, tmp_path):
    record = submit([JobRequest(kind="benchmark", model="hello", nodes=1, gpus_per_node=1, time="5",
                                engine_args=["--fail"])], "ci")
    acct_env.wait_job(record["jobs"][0]["job_id"])
    cli = Cli(acct_env.env, tmp_path / "runs")
    proc = cli("status", record["run_dir"], "--watch")
    assert proc.returncode == 1 and "FAILED" in proc.stdout and "sacct" in proc.stdout
