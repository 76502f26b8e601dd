"""Fault 10: the runs directory's file system is full when a job is submitted.

The runs dir is a small tmpfs (root mounts it). Too little room before the submission: refused
in one line naming the runs dir and the free space, nothing submitted, no run dir left. Room at
the check, but the disk fills up between `sbatch` and the record of the job id (the fault point
`sbatch-returned` runs a command that fills the tmpfs): one line saying the job went in and how
it is found, exit 1, no temporary file left; once there is room again `status` shows the job
and `cancel` removes it, and a study re-run submits nothing twice. Jobs are submitted held.
"""
from __future__ import annotations

import json
import os

import pytest

from tests.faults.record import FaultResult, record
from tests.faults.test_submit_crash import held_profile, queue_by_token, tokens_of
from tests.tmpfs import fill_command, small_tmpfs
from tests.jobs.study_helpers import TINY_NCF, write_spec

pytestmark = [pytest.mark.faults, pytest.mark.slurm]


@pytest.fixture
def small_fs(tmp_path):
    with small_tmpfs(tmp_path / "small", "1m") as mount:
        yield mount


@pytest.fixture
def roomy_fs(tmp_path):
    """Room for a study's frozen code copy (about 0.6 MB of recsys/ and slurm/, and growing): the
    fault fills the file system itself at the point it injects, so its size only has to fit that."""
    with small_tmpfs(tmp_path / "small", "4m") as mount:
        yield mount


def temporaries(root):
    return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files if ".tmp." in f]


def test_no_room_for_the_records_refuses_before_submitting(slurm_cluster, cli, small_fs, tmp_path):
    env = dict(cli.env, RECSYS_RUNS_DIR=str(small_fs / "runs"))
    before = queue_by_token(slurm_cluster)
    proc = cli("benchmark", "--profile", held_profile(tmp_path, True), "--model", "hello", env=env)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "free on its file system" in lines[0] and "nothing submitted" in lines[0], lines
    assert str(small_fs / "runs") in lines[0]
    assert queue_by_token(slurm_cluster) == before
    assert not os.path.exists(small_fs / "runs") or os.listdir(small_fs / "runs") == []


def test_disk_full_between_sbatch_and_the_record(slurm_cluster, cli, roomy_fs, tmp_path):
    small_fs = roomy_fs
    runs = small_fs / "runs"
    env = dict(cli.env, RECSYS_RUNS_DIR=str(runs), RECSYS_MIN_FREE_MB="0.2",
               RECSYS_FAULT_AT="sbatch-returned", RECSYS_FAULT_CMD=fill_command(small_fs))
    proc = cli("benchmark", "--profile", held_profile(tmp_path, True), "--model", "hello", env=env)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "could not be recorded" in lines[0] and "No space left on device" in lines[0], lines
    assert temporaries(small_fs) == []
    (run,) = [os.path.join(runs, d) for d in os.listdir(runs)]
    (token,) = tokens_of(run)
    (job_id,) = queue_by_token(slurm_cluster)[token]
    assert f"main={job_id}" in lines[0]
    os.remove(small_fs / "filler")
    status = cli("status", run, "--json", env=dict(cli.env, RECSYS_RUNS_DIR=str(runs)))
    assert [(j["job_id"], j["state"]) for j in json.loads(status.stdout)["jobs"]] == [(job_id, "PENDING")]
    assert cli("cancel", run).returncode == 0
    assert slurm_cluster.wait_job(job_id, timeout=60) == "CANCELLED"

    # a study whose disk fills up after its first point's sbatch: one line, then a re-run with
    # room submits the other points and never the first again
    spec = write_spec(tmp_path / "full.yaml", version=1, name="full", model="ncf", scaling="weak",
                      batch_size=64, gpus=[1, 2], warmup_steps=1, steps=2, time="00:05:00", synthetic=True,
                      engine_args=TINY_NCF)
    profile = held_profile(tmp_path, True)
    study_env = dict(env, RECSYS_FAULT_AT="sbatch-returned:1")
    first = cli("study", "run", spec, "--profile", profile, "--max-concurrent", "10", env=study_env)
    assert first.returncode == 1 and len(first.stderr.strip().splitlines()) == 1, first.stderr
    assert "Traceback" not in first.stderr and temporaries(small_fs) == []
    os.remove(small_fs / "filler")
    again = cli("study", "run", spec, "--profile", profile, "--max-concurrent", "10",
                env=dict(cli.env, RECSYS_RUNS_DIR=str(runs), RECSYS_MIN_FREE_MB="0.2"))
    assert again.returncode == 0, again.stderr
    with open(runs / "study-full" / "study.json") as handle:
        points = json.load(handle)["points"]
    queue = queue_by_token(slurm_cluster)
    per_point = [[j for r in p["runs"] for t in tokens_of(r) for j in queue.get(t, [])] for p in points]
    slurm_cluster.run(["scancel", *[j for jobs in per_point for j in jobs]])
    assert [len(jobs) for jobs in per_point] == [1, 1], per_point
    record(FaultResult(fault="runs dir full at submission", trials=3, survived=3, data_lost=0, recover_s=None,
                       detail="no room: refused before sbatch; full after sbatch: one line, the job found by its "
                              "token by status/cancel and a study re-run (one job per point), no temporary left"))
