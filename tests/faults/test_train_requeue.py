"""Requeue faults of training jobs submitted through recsys-submit on the local cluster: a preempted
(USR2 + requeue) array task resumes with no lost step, and a job whose attempts never write a
checkpoint stops requeueing after a bounded number of cycles, saying why in one line."""
from __future__ import annotations

import json
import os
import time

import pytest

from tests.faults.record import FaultResult, record
from tests.faults.train_helpers import (ENGINE, STEPS, cluster_picture, job_fields, read_log, release_requeued,
                                        step_history, submit, wait_for)

pytestmark = [pytest.mark.faults, pytest.mark.slurm, pytest.mark.horovod]




def _info(run_dir, tag):
    try:
        with open(os.path.join(run_dir, "logs", f"main-{tag}.info")) as handle:
            return [line.rstrip("\n").split("=", 1) for line in handle if "=" in line]
    except OSError:
        return []


def _count(run_dir, tag, key):
    return sum(1 for k, _ in _info(run_dir, tag) if k == key)


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def _out(run_dir, tag):
    """The last lines of the task's batch output (why a requeue did not happen)."""
    try:
        with open(os.path.join(run_dir, "logs", f"main-{tag}.out"), errors="replace") as handle:
            return "".join(handle.readlines()[-15:])
    except OSError:
        return "(no batch output)"


def test_preempted_array_task_resumes_without_lost_steps(cli, slurm_cluster, data, tmp_path):
    ck = tmp_path / "ck"
    run_dir, rec, _ = submit(cli, "train", "--profile", "ci", "--model", "dlrm", "--nodes", "1",
                              "--gpus-per-node", "1", "--array", "1", "--time", "10", "--",
                              *ENGINE, "--data-path", data, "--checkpoint-dir", ck, "--restore")
    job = rec["jobs"][0]["job_id"]
    task = f"{job}_0"
    log = os.path.join(run_dir, "logs", f"main-{task}.engine.jsonl")
    try:
        wait_for(lambda: any(r.get("type") == "step" and r["step"] >= 2 for r in read_log(log)),
                 timeout=400, what="the first training steps", delay=0.05)
        slurm_cluster.run(["scancel", "--batch", "--signal=USR2", task], check=True)
        t_signal = time.monotonic()
        wait_for(lambda: _count(run_dir, task, "requeue_requested"), timeout=200, what="the requeue request")

        def restarted():
            if _count(run_dir, task, "start") >= 2:
                return True
            assert not _count(run_dir, task, "requeue_failed"), _out(run_dir, task)
            state = release_requeued(slurm_cluster, task).get("JobState")
            assert state not in ENDED, f"{task} ended {state} instead of being requeued: {_out(run_dir, task)}"
            return False
        try:
            wait_for(restarted, timeout=200, what="the requeued task to start again")
        except TimeoutError as error:
            raise AssertionError(f"{error}: {cluster_picture(slurm_cluster, task)}") from None
        wait_for(lambda: any("restored_step" in r for r in read_log(log)), timeout=400, what="the restore")
        recover_s = time.monotonic() - t_signal
        state = slurm_cluster.wait_job(job, timeout=400)
    finally:
        slurm_cluster.run(["scancel", job])
    records = read_log(log)
    problems, repeated, restores = step_history(records)
    signal_saves = [r["step"] for r in records if r.get("type") == "checkpoint" and r.get("reason") == "signal"]
    summaries = [r for r in records if r.get("type") == "summary"]
    trained = {r["step"] for r in records if r.get("type") == "step"}
    lost = len(set(range(1, STEPS + 1)) - trained)
    final_step = summaries[-1]["step"] if summaries else None
    survived = int(state == "COMPLETED" and final_step == STEPS and not problems and restores == signal_saves[:1])
    record(FaultResult(
        fault="preemption (USR2 + requeue) of an array task", trials=1, survived=survived,
        data_lost=lost + len(problems), recover_s=round(recover_s, 1),
        detail=f"USR2 at step {signal_saves[:1]}: saved, requeued, restored at {restores}, finished at step "
               f"{final_step}/{STEPS} ({repeated} steps logged twice, each after its restore record)"))
    assert state == "COMPLETED", state
    assert len(signal_saves) == 1 and 2 <= signal_saves[0] < STEPS, signal_saves
    assert restores == signal_saves, (restores, signal_saves)
    assert not problems and lost == 0, problems
    assert final_step == STEPS
    assert summaries[0]["interrupted"] is True and summaries[-1]["interrupted"] is False


def test_requeue_without_progress_stops(cli, slurm_cluster, data, tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    # what an earlier attempt on this checkpoint dir measured: far more start-up than the job has
    (ck / "attempt.json").write_text(json.dumps({"startup_s": 900.0, "checkpoint_s": 5.0, "step": 0}))
    from jobs.planning.requeue import MAX_IDLE_REQUEUES
    run_dir, rec, err = submit(cli, "train", "--profile", "ci", "--model", "dlrm", "--nodes", "1",
                                "--gpus-per-node", "1", "--time", "5", "--signal-seconds", "60", "--",
                                *ENGINE, "--data-path", data, "--checkpoint-dir", ck, "--restore")
    job = rec["jobs"][0]["job_id"]
    warned = [ln for ln in err.splitlines() if "warning:" in ln]
    t0 = time.monotonic()
    try:
        for attempt in range(1, MAX_IDLE_REQUEUES + 1):
            def started(attempt=attempt):
                if _count(run_dir, job, "start") >= attempt:
                    return True
                release_requeued(slurm_cluster, job)
                return False
            wait_for(started, timeout=200, what=f"attempt {attempt} to start")
            # USR2 while the engine is still starting: the attempt writes no checkpoint (the batch
            # step may take a moment to be known to the controller after the script wrote start=)
            wait_for(lambda: slurm_cluster.run(["scancel", "--batch", "--signal=USR2", job]).returncode == 0,
                     timeout=60, what=f"attempt {attempt} to take USR2")
            wait_for(lambda attempt=attempt: _count(run_dir, job, "idle_attempts") >= attempt, timeout=200,
                     what=f"attempt {attempt} to be judged")
        state = slurm_cluster.wait_job(job, timeout=200)
    finally:
        slurm_cluster.run(["scancel", job])
    stopped_s = time.monotonic() - t0
    info = dict(_info(run_dir, job))
    out = open(os.path.join(run_dir, "logs", f"main-{job}.out"), errors="replace").read()
    why = [ln for ln in out.splitlines() if "not requeueing" in ln]
    status = cli("status", run_dir)
    restarts = int(job_fields(slurm_cluster, job).get("Restarts", "-1"))
    checkpoints = sorted(n for n in os.listdir(ck) if n.startswith("ckpt-"))
    survived = int(state == "FAILED" and "requeue_stopped" in info and len(why) == 1
                   and restarts == MAX_IDLE_REQUEUES - 1 and len(warned) == 1)
    record(FaultResult(
        fault="requeue without progress", trials=1, survived=survived, data_lost=0, recover_s=round(stopped_s, 1),
        detail=f"USR2 during start-up of every attempt: requeueing stopped after {info.get('idle_attempts')} idle "
               f"attempts ({restarts} requeues), job {state}, one line in the batch log; warned at submission"))
    assert len(warned) == 1 and "previous attempt" in warned[0] and "attempt.json" in warned[0], err
    assert state == "FAILED", state
    assert info.get("idle_attempts") == str(MAX_IDLE_REQUEUES) and "requeue_stopped" in info, info
    assert restarts == MAX_IDLE_REQUEUES - 1
    assert len(why) == 1 and f"{MAX_IDLE_REQUEUES} attempt(s) in a row wrote no new checkpoint" in why[0], out
    assert "not requeueing" in status.stdout, status.stdout
    assert checkpoints == [], checkpoints
