"""Fault 8: jobs submitted through the Python API while the real slurmctld is stopped and restarted.

The controller of the session cluster is stopped with `local-cluster.sh stop-ctld` (SIGTERM: it
saves its state, as `systemctl stop` does), kept down for OUTAGE_S seconds and started again from
its state directory (`start-ctld`, which returns once it answers and every node responds). Five
jobs go in before the outage; the other fifteen are submitted from five threads while the
controller is down (the same request each time, so concurrent runs share a name); the five have
ended before the controller stops. Every job must then be in the queue exactly once (one queue entry per
submission token, `--comment=recsys:<token>`), no job may be in the queue that the API did not
report, and every job must run to COMPLETED. With the sbatch retries turned off the same outage
must instead give one clear error line per submission that did not go in, and nothing of those
may be in the queue.
"""
from __future__ import annotations

import re
import subprocess
import threading
import time

import pytest

from jobs.backends.slurm import commands as slurmcli
from jobs.api import JobRequest, submit
from jobs.errors import SubmitError
from tests.conftest import CLUSTER_SCRIPT
from tests.faults.record import FaultResult, record

pytestmark = [pytest.mark.faults, pytest.mark.slurm]

N_JOBS = 20
BEFORE = 5          # submitted before the outage
THREADS = 5         # submitters during the outage
OUTAGE_S = 10


@pytest.fixture
def api_env(slurm_cluster, monkeypatch, tmp_path):
    """In-process API calls talk to the session cluster; the controller is healthy again after."""
    for key, value in slurm_cluster.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("RECSYS_RUNS_DIR", str(tmp_path / "runs"))
    slurmcli.reset_cache()
    yield slurm_cluster
    slurmcli.reset_cache()
    controller(slurm_cluster, "start-ctld")     # no-op when it runs; restores it after a failed test


def controller(cluster, action: str) -> float:
    """stop-ctld / start-ctld of the cluster under test; returns when done, with its duration."""
    start = time.monotonic()
    proc = subprocess.run(["bash", str(CLUSTER_SCRIPT), action, "--dir", str(cluster.directory)],
                          env=cluster.env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"{action}: {proc.stderr[-2000:]}"
    return time.monotonic() - start


def hello(index: int) -> JobRequest:
    """The same request every time, as a sweep script submits it: concurrent runs share a name."""
    return JobRequest(kind="benchmark", profile="ci", model="hello", nodes=1, gpus_per_node=1, time="5",
                      name="outage")


def queue_by_token(cluster) -> dict:
    """{token: [job ids]} of every job the controller knows (pending, running or recently ended)."""
    out = cluster.run(["squeue", "-h", "-a", "--states=all", "-o", "%i|%k"], check=True).stdout
    found = {}
    for line in out.splitlines():
        job_id, _, comment = line.partition("|")
        if comment.startswith("recsys:"):
            found.setdefault(comment[len("recsys:"):], []).append(job_id)
    return found


def run_with_outage(cluster):
    """Submit N_JOBS one-job runs, the last N_JOBS-BEFORE of them during an outage of OUTAGE_S.
    Returns ({index: record}, {index: error}, seconds from restarting the controller to the last answer)."""
    records, errors, lock = {}, {}, threading.Lock()

    def one(index):
        try:
            result = submit([hello(index)], "ci")
            with lock:
                records[index] = result
        except SubmitError as exc:
            with lock:
                errors[index] = str(exc)
        except Exception as exc:    # anything else is a defect: keep it for the assertion
            with lock:
                errors[index] = f"UNEXPECTED {type(exc).__name__}: {exc}"

    for index in range(BEFORE):
        one(index)
    assert len(records) == BEFORE, errors
    # The jobs before the outage end first: a batch script whose `srun` starts while the controller
    # is down fails at once ("srun: error: Unable to confirm allocation ... Unable to contact slurm
    # controller"; docs/reliability.md). On a loaded box they had not reached their step when the
    # controller stopped (CI of 297fb3a: 4 of 5 FAILED). This test is about the submissions.
    for rec in records.values():
        assert cluster.wait_job(rec["jobs"][0]["job_id"], timeout=300) == "COMPLETED"
    controller(cluster, "stop-ctld")
    down_at = time.monotonic()
    rest = list(range(BEFORE, N_JOBS))
    threads = [threading.Thread(target=lambda part=rest[i::THREADS]: [one(k) for k in part])
               for i in range(THREADS)]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))    # the outage itself, not a sync
    back_at = time.monotonic()      # the controller is being started again
    controller(cluster, "start-ctld")
    for thread in threads:
        thread.join(timeout=600)
        assert not thread.is_alive(), "a submission is still hanging 10 min after the controller returned"
    return records, errors, time.monotonic() - back_at


def account(cluster, records: dict, errors: dict) -> tuple[list[str], list[str], list[str], list[str]]:
    """(missing, duplicated, unreported, unclear) descriptions, checked against the controller's queue.
    An error must be one line naming the run and the job's token; if it says the job was not
    submitted, the token must not be in the queue; if it says it cannot tell, at most once."""
    queue = queue_by_token(cluster)
    missing, duplicated, unreported, unclear = [], [], [], []
    for index, rec in records.items():
        [job] = rec["jobs"]
        ids = queue.get(job["token"], [])
        if ids != [job["job_id"]]:
            (duplicated if len(ids) > 1 else missing).append(f"job {index}: reported {job['job_id']}, queue {ids}")
    for index, message in errors.items():
        token = re.search(r"recsys:([0-9a-f]{16})", message)
        if "\n" in message or not token or "runs/outage-" not in message:
            unclear.append(f"job {index}: {message}")
            continue
        ids = queue.get(token.group(1), [])
        if len(ids) > 1:
            duplicated.append(f"job {index}: {ids}: {message}")
        elif ids and "may or may not" not in message:
            unreported.append(f"job {index}: error says not submitted, queue has {ids}: {message}")
    return missing, duplicated, unreported, unclear


def test_twenty_submissions_across_a_controller_restart(api_env):
    cluster = api_env
    records, errors, recover = run_with_outage(cluster)
    missing, duplicated, unreported, unclear = account(cluster, records, errors)
    unfinished = []
    for index, rec in sorted(records.items()):
        state = cluster.wait_job(rec["jobs"][0]["job_id"], timeout=300)
        if state != "COMPLETED":
            unfinished.append(f"job {index}: {state}")
    lost = len(missing) + len(duplicated) + len(unreported) + len(unfinished) + len(errors)
    record(FaultResult(
        fault="slurmctld stopped 10 s during 20 API submissions", trials=1,
        survived=int(lost == 0), data_lost=lost, recover_s=round(recover, 1),
        detail=f"{BEFORE} jobs before, {N_JOBS - BEFORE} from {THREADS} threads during the outage: each "
               "token once in the queue, none unreported, all COMPLETED"))
    assert not errors, errors
    assert not missing and not duplicated and not unreported, (missing, duplicated, unreported)
    assert not unfinished, unfinished
    assert not unclear, unclear
    assert len(records) == N_JOBS


def test_outage_beyond_the_retries_names_what_did_not_go_in(api_env, monkeypatch):
    cluster = api_env
    monkeypatch.setenv("RECSYS_SBATCH_RETRIES", "0")
    records, errors, recover = run_with_outage(cluster)
    missing, duplicated, unreported, unclear = account(cluster, records, errors)
    lost = len(missing) + len(duplicated) + len(unreported)
    record(FaultResult(
        fault="slurmctld stopped 10 s, sbatch retries off", trials=1,
        survived=int(lost == 0 and not unclear), data_lost=lost, recover_s=round(recover, 1),
        detail=f"{len(records)} went in exactly once; {len(errors)} one-line errors, none of those in the queue"))
    for rec in records.values():
        cluster.run(["scancel", rec["jobs"][0]["job_id"]])
    assert errors, "with no retries, submissions during the outage should fail"
    assert not unclear, unclear
    assert not missing and not duplicated and not unreported, (missing, duplicated, unreported)
    assert len(records) + len(errors) == N_JOBS
