"""Unit tests of sbatch retries and partial-chain failure with `flaky_sbatch`: a PATH shim named
sbatch that injects failures and otherwise execs the real sbatch of the local cluster."""

import json
import os
import shutil
import stat

import pytest

from jobs.backends.slurm import commands as slurmcli
from jobs.api import JobRequest, submit
from jobs.errors import SubmitError

pytestmark = pytest.mark.slurm

FLAKY = r"""#!/bin/bash
# flaky_sbatch: fails according to $FLAKY_PLAN (one word per call: ok | lost | late | fatal)
count_file="$FLAKY_DIR/calls"
n=$(( $(cat "$count_file" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$count_file"
echo "$*" >> "$FLAKY_DIR/log"
read -r -a plan <<< "$FLAKY_PLAN"
what=${plan[$((n - 1))]:-ok}
case $what in
  lost)  echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation" >&2; exit 1 ;;
  late)  "$REAL_SBATCH" "$@" > /dev/null || exit 1
         echo "sbatch: error: slurm_receive_msg: Socket timed out on send/recv operation" >&2; exit 1 ;;
  fatal) echo "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified" >&2; exit 1 ;;
  *)     exec "$REAL_SBATCH" "$@" ;;
esac
"""


@pytest.fixture
def flaky_sbatch(slurm_env, tmp_path, monkeypatch):
    shim_dir = tmp_path / "shim"
    shim_dir.mkdir()
    shim = shim_dir / "sbatch"
    shim.write_text(FLAKY)
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("REAL_SBATCH", shutil.which("sbatch"))
    monkeypatch.setenv("FLAKY_DIR", str(shim_dir))
    monkeypatch.setenv("PATH", f"{shim_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("RECSYS_SBATCH_BACKOFF", "0.1")
    monkeypatch.setenv("RECSYS_RUNS_DIR", str(tmp_path / "runs"))

    def calls():
        return int((shim_dir / "calls").read_text())
    return calls


def _hello(kind="benchmark", **kw):
    return JobRequest(kind=kind, profile="ci", model="hello", nodes=1, gpus_per_node=1, time="5", **kw)


def _jobs_with_token(cluster, token):
    out = cluster.run(["squeue", "-h", "-a", "--states=all", "-o", "%i|%k"]).stdout
    return [line for line in out.splitlines() if line.endswith(f"recsys:{token}")]


def test_lost_submission_is_retried_once(flaky_sbatch, slurm_env, monkeypatch):
    monkeypatch.setenv("FLAKY_PLAN", "lost ok")
    record = submit([_hello()], "ci")
    assert flaky_sbatch() == 2
    [job] = record["jobs"]
    assert len(_jobs_with_token(slurm_env, job["token"])) == 1
    assert slurm_env.wait_job(job["job_id"]) == "COMPLETED"


def test_late_success_is_found_not_submitted_twice(flaky_sbatch, slurm_env, monkeypatch):
    monkeypatch.setenv("FLAKY_PLAN", "late ok ok")
    record = submit([_hello()], "ci")
    assert flaky_sbatch() == 1           # the retry found the job through squeue, no 2nd sbatch
    [job] = record["jobs"]
    assert len(_jobs_with_token(slurm_env, job["token"])) == 1
    assert slurm_env.wait_job(job["job_id"]) == "COMPLETED"


def test_failed_later_submission_cancels_earlier_jobs(flaky_sbatch, slurm_env, monkeypatch, tmp_path):
    monkeypatch.setenv("FLAKY_PLAN", "ok fatal")
    with pytest.raises(SubmitError) as info:
        submit([_hello(engine_args=["--sleep", "30"]), _hello(kind="evaluate")], "ci")
    message = str(info.value)
    assert "'evaluate' not submitted" in message and "Invalid account" in message
    assert "submitted before it: benchmark=" in message and "cancelled them" in message
    assert "\n" not in message
    first_id = message.split("benchmark=")[1].split(";")[0]
    assert slurm_env.wait_job(first_id) == "CANCELLED"
    [run] = os.listdir(tmp_path / "runs")
    record = json.load(open(tmp_path / "runs" / run / "jobs.json"))
    assert record["state"] == "cancelled-partial" and record["jobs"][0]["job_id"] == first_id


def test_keep_partial_keeps_them(flaky_sbatch, slurm_env, monkeypatch):
    monkeypatch.setenv("FLAKY_PLAN", "ok fatal")
    with pytest.raises(SubmitError, match="kept them"):
        submit([_hello(), _hello(kind="evaluate")], "ci", keep_partial=True)


def test_permanent_transient_failure_gives_up(flaky_sbatch, slurm_env, monkeypatch):
    monkeypatch.setenv("FLAKY_PLAN", "lost lost lost")
    with pytest.raises(SubmitError, match="still failing after 2 retries"):
        slurmcli.sbatch("/nonexistent.sbatch", "tok-none", retries=2, backoff=0.05)
    assert flaky_sbatch() == 3


FAILING_SCANCEL = """#!/bin/bash
echo "$*" >> "$FLAKY_DIR/scancel.log"
echo "scancel: error: Kill job error on job id $1: Unable to contact slurm controller" >&2
exit 1
"""


def test_failed_cancel_of_a_broken_chain_is_recorded_as_such(flaky_sbatch, slurm_env, monkeypatch, tmp_path):
    shim = tmp_path / "shim" / "scancel"
    shim.write_text(FAILING_SCANCEL)
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FLAKY_PLAN", "ok fatal")
    with pytest.raises(SubmitError) as info:
        submit([_hello(engine_args=["--sleep", "30"]), _hello(kind="evaluate")], "ci")
    message = str(info.value)
    assert "could NOT cancel them" in message and "Unable to contact" in message
    assert "cancelled them" not in message and "\n" not in message
    first_id = message.split("benchmark=")[1].split(";")[0]
    assert (tmp_path / "shim" / "scancel.log").read_text().split() == [first_id]
    [run] = os.listdir(tmp_path / "runs")
    record = json.load(open(tmp_path / "runs" / run / "jobs.json"))
    assert record["state"] == "cancel-failed" and record["error"] == message
    assert [(j["job_id"], j["outcome"]) for j in record["jobs"]] == [(first_id, "cancel-failed")]
    state = slurm_env.job_state(first_id)
    assert state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "COMPLETED"), state  # not cancelled
    slurm_env.run(["scancel", first_id])   # the cluster's own scancel (the shim is only on our PATH)


def test_cancelled_partial_records_each_job_outcome(flaky_sbatch, slurm_env, monkeypatch, tmp_path):
    monkeypatch.setenv("FLAKY_PLAN", "ok fatal")
    with pytest.raises(SubmitError, match="cancelled them"):
        submit([_hello(engine_args=["--sleep", "30"]), _hello(kind="evaluate")], "ci")
    [run] = os.listdir(tmp_path / "runs")
    record = json.load(open(tmp_path / "runs" / run / "jobs.json"))
    assert [j["outcome"] for j in record["jobs"]] == ["cancelled"]
    assert slurm_env.wait_job(record["jobs"][0]["job_id"]) == "CANCELLED"
