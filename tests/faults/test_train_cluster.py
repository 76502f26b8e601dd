"""Cluster faults under a running 2-node training job (recsys-submit on the local cluster): a node set
DOWN after the first checkpoint, and slurmctld restarted while `status --watch` polls. Each test
puts the session cluster back (node resumed, controller up, every node idle, checked with sinfo)
before it returns, so later tests see a healthy cluster."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.faults.record import FaultResult, record
from tests.processes import engine_ranks
from tests.faults.train_helpers import (ENGINE, REPO, STEPS, job_fields, read_log, release_requeued,
                                        step_history, submit, wait_for)

pytestmark = [pytest.mark.faults, pytest.mark.slurm, pytest.mark.horovod]

TWO_NODES = ["train", "--profile", "ci", "--model", "dlrm", "--nodes", "2", "--gpus-per-node", "1", "--time", "10"]



def _ctld_pid(cluster):
    try:
        pid = int((cluster.directory / "run" / "slurmctld.pid").read_text().strip())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None


def _healthy(cluster):
    """Controller answers and every node is idle (sinfo)."""
    if cluster.run(["scontrol", "ping"]).returncode != 0:
        return False
    states = cluster.run(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout.split("\n")
    idle = {line.split()[0] for line in states if line.strip() and line.split()[1] == "idle"}
    return idle >= set(cluster.nodes)


def _restore_cluster(cluster, timeout=180):
    """Controller up, nodes resumed, all idle: what the next test expects."""
    if _ctld_pid(cluster) is None:
        subprocess.run(["slurmctld"], env=cluster.env, check=True, timeout=60)
    wait_for(lambda: cluster.run(["scontrol", "ping"]).returncode == 0, timeout=60, what="slurmctld to answer")
    for node in cluster.nodes:
        state = cluster.run(["sinfo", "-h", "-n", node, "-o", "%T"]).stdout.strip()
        if state.startswith(("down", "drain", "fail")):
            cluster.run(["scontrol", "update", f"nodename={node}", "state=resume"])
    wait_for(lambda: _healthy(cluster), timeout=timeout, what="every node idle again")


def _summary(log):
    found = [r for r in read_log(log) if r.get("type") == "summary"]
    return found[-1] if found else {}


def test_node_lost_mid_training(cli, slurm_cluster, data, tmp_path):
    common = [*ENGINE, "--data-path", data, "--restore"]
    run_dir, rec, _ = submit(cli, *TWO_NODES, "--name", "node-lost", "--", *common, "--checkpoint-dir", tmp_path / "ck")
    ref_dir, ref, _ = submit(cli, *TWO_NODES, "--name", "reference", "--", *common, "--checkpoint-dir", tmp_path / "ck-ref")
    job, ref_job = rec["jobs"][0]["job_id"], ref["jobs"][0]["job_id"]
    log = os.path.join(run_dir, "logs", f"main-{job}.engine.jsonl")
    downed = None
    try:
        wait_for(lambda: any(r.get("type") == "checkpoint" for r in read_log(log)), timeout=400,
                 what="the first checkpoint", delay=0.05)
        nodes = slurm_cluster.run(["scontrol", "show", "hostnames", job_fields(slurm_cluster, job)["NodeList"]]).stdout.split()
        downed = nodes[-1]
        slurm_cluster.run(["scontrol", "update", f"nodename={downed}", "state=down", "reason=fault-injection"], check=True)
        t_fault = time.monotonic()
        # The emulated node's slurmd is alive, so the node returns to service at once
        # (ReturnToService=2): keep it drained, as a lost node stays away, until the test ends.
        slurm_cluster.run(["scontrol", "update", f"nodename={downed}", "state=drain", "reason=fault-injection"])

        def requeued():
            fields = job_fields(slurm_cluster, job)
            if int(fields.get("Restarts", "0")) >= 1:
                release_requeued(slurm_cluster, job)
                return True
            return False
        wait_for(requeued, timeout=200, what="Slurm to requeue the job")
        def restored():
            if any("restored_step" in r for r in read_log(log)):
                return True
            release_requeued(slurm_cluster, job)
            return False
        wait_for(restored, timeout=600, what="the requeued job to restore")
        recover_s = time.monotonic() - t_fault
        state = slurm_cluster.wait_job(job, timeout=600)
        ref_state = slurm_cluster.wait_job(ref_job, timeout=600)
    finally:
        slurm_cluster.run(["scancel", job, ref_job])
        _restore_cluster(slurm_cluster)
    records = read_log(log)
    problems, repeated, restores = step_history(records)
    saved = [r["step"] for r in records if r.get("type") == "checkpoint"]
    got, want = _summary(log), _summary(os.path.join(ref_dir, "logs", f"main-{ref_job}.engine.jsonl"))
    same_weights = got.get("weights_digest") is not None and got.get("weights_digest") == want.get("weights_digest")
    lost = int(got.get("step") != STEPS) + int(not same_weights) + len(problems)
    survived = int(state == "COMPLETED" and not lost and len(restores) == 1)
    record(FaultResult(
        fault="node lost mid-training", trials=1, survived=survived, data_lost=lost, recover_s=round(recover_s, 1),
        detail=f"2-node job, {downed} set DOWN after the checkpoint at step {saved[:1]}: requeued by Slurm, restored "
               f"at step {restores}, ended at step {got.get('step')}/{STEPS} with "
               f"{'the same' if same_weights else 'DIFFERENT'} weights as an uninterrupted 2-node run "
               f"({repeated} steps retrained, logged after the restore record)"))
    assert ref_state == "COMPLETED" and want.get("step") == STEPS, ref_state
    assert state == "COMPLETED", state
    assert len(restores) == 1 and restores[0] in saved, (restores, saved)
    assert not problems, problems
    assert got["step"] == STEPS and got["world_size"] == 2
    assert same_weights, (got.get("weights_digest"), want.get("weights_digest"))


def test_slurmctld_restart_while_training_and_watching(cli, slurm_cluster, data, tmp_path):
    run_dir, rec, _ = submit(cli, *TWO_NODES, "--name", "ctld-restart", "--", *ENGINE, "--data-path", data,
                              "--checkpoint-dir", tmp_path / "ck", "--restore")
    job = rec["jobs"][0]["job_id"]
    log = os.path.join(run_dir, "logs", f"main-{job}.engine.jsonl")
    watch_err = tmp_path / "watch.err"
    watch = subprocess.Popen([sys.executable, "-m", "jobs.cli", "status", run_dir, "--watch"], cwd=REPO,
                             env=cli.env, stdout=subprocess.PIPE, stderr=open(watch_err, "w"), text=True)
    try:
        wait_for(lambda: any(r.get("type") == "step" for r in read_log(log)), timeout=400, what="training to start")
        # the ranks pause (SIGSTOP) for the outage, so that the job's step ends after the controller
        # is back: a step ending during the outage keeps the job COMPLETING until slurmstepd's next
        # try to report it, 60 s later (measured: 45 s of this test's time, nothing else checked)
        def both_ranks():
            found = engine_ranks(str(tmp_path / "ck"))
            return found if len(found) == 2 else None
        ranks = wait_for(both_ranks, timeout=30, what="the job's two ranks")
        pid = _ctld_pid(slurm_cluster)
        t_fault = time.monotonic()
        for rank in ranks:
            os.kill(rank, signal.SIGSTOP)
        try:
            os.kill(pid, signal.SIGTERM)
            wait_for(lambda: _ctld_pid(slurm_cluster) is None, timeout=60, what="slurmctld to stop")
            wait_for(lambda: "polling again" in watch_err.read_text() or watch.poll() is not None, timeout=60,
                     what="status --watch to meet the outage")
            subprocess.run(["slurmctld"], env=slurm_cluster.env, check=True, timeout=60)
            wait_for(lambda: slurm_cluster.run(["scontrol", "ping"]).returncode == 0, timeout=60,
                     what="slurmctld back")
        finally:
            for rank in ranks:
                os.kill(rank, signal.SIGCONT)
        recover_s = time.monotonic() - t_fault
        out, _ = watch.communicate(timeout=600)
        state = slurm_cluster.wait_job(job, timeout=300)
    finally:
        if watch.poll() is None:
            watch.kill()
        slurm_cluster.run(["scancel", job])
        _restore_cluster(slurm_cluster)
    err = watch_err.read_text()
    final = [line.split() for line in out.splitlines() if line.strip().startswith("main ")]
    got = _summary(log)
    survived = int(watch.returncode == 0 and "Traceback" not in err and state == "COMPLETED"
                   and final and final[-1][-1] == "COMPLETED" and got.get("step") == STEPS)
    record(FaultResult(
        fault="slurmctld restart during training", trials=1, survived=survived,
        data_lost=int(got.get("step") != STEPS), recover_s=round(recover_s, 1),
        detail=f"2-node job running (ranks paused for the outage), slurmctld stopped and restarted: job {state} at step {got.get('step')}/{STEPS}; "
               f"status --watch waited out the outage ({err.count('polling again')} failed polls) and exited "
               f"{watch.returncode} with no traceback"))
    assert "polling again" in err and "Traceback" not in err, err
    assert watch.returncode == 0, out + err
    assert final and final[-1][-1] == "COMPLETED", out
    assert state == "COMPLETED"
    assert got.get("step") == STEPS
