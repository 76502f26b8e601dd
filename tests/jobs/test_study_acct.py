"""A study on the local cluster WITH accounting (slurmdbd), where sacct learns of a job seconds
after sbatch: no false failure, no duplicate submission, a cap that holds, and a cancelled
baseline that is reported, named and resubmitted alone; then the study is extended with a repeat;
at the end Slurm has forgotten the first jobs (MinJobAge) and their states survive.

One sequence of real CLI calls (NCF, 1 and 2 ranks, 2 timed steps) in a module fixture; the
tests read what it saw.
"""

import json
import os
import subprocess
import sys
import time

import pytest

from study_helpers import TINY_NCF, job_ids, queued, record, report, status, study_dir, submitted, watch, \
    write_spec
from submit_helpers import REPO, Cli
from tests.waiting import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.horovod, pytest.mark.slow]

NAME = "ncf-acct"
SPEC = dict(name=NAME, model="ncf", batch_size=512, gpus=[1, 2], warmup_steps=1, steps=2, time="00:10:00",
            engine_args=TINY_NCF)


def _sample_while(proc, cluster, prefix, timeout=900):
    """Sample the queue until `proc` exits: the most jobs of the study queued or running at once."""
    most, deadline = 0, time.monotonic() + timeout
    while proc.poll() is None:
        assert time.monotonic() < deadline, "study run did not finish"
        most = max(most, len(queued(cluster, prefix)))
        time.sleep(0.2)
    return most


@pytest.fixture(scope="module")
def seen(slurm_cluster_acct, tmp_path_factory):
    pytest.importorskip("horovod.tensorflow")
    cluster = slurm_cluster_acct
    cli = Cli(cluster.env, tmp_path_factory.mktemp("acct-study-runs"))
    spec = write_spec(tmp_path_factory.mktemp("spec") / "ncf.yaml", **SPEC)
    out = {"cli": cli}
    # submit both points at once, then ask at once, before sacct has heard of them
    out["run1"] = cli("study", "run", spec, "--profile", "ci", "--max-concurrent", "2", check=True)
    directory = out["dir"] = study_dir(out["run1"])
    out["status1"] = status(cli, directory)
    out["run2"] = cli("study", "run", spec, "--profile", "ci", "--max-concurrent", "2", check=True)
    out["queue2"] = queued(cluster, NAME)
    # the baseline point is cancelled: failed with reason CANCELLED, the report cannot rebase
    baseline = next(p for p in record(directory)["points"] if p["id"] == "g1-n1x1-r0")
    out["cancelled"] = job_ids(baseline["runs"])[0]
    out["cancelled_run"] = baseline["runs"][0]
    cluster.run(["scancel", out["cancelled"]], check=True)
    out["watch1"] = watch(cli, directory)
    out["report1"] = report(cli, directory)
    out["run3"] = cli("study", "run", spec, "--profile", "ci", "--max-concurrent", "2", check=True)
    # a second repeat of every point, one point at a time; a concurrent `study run` is refused
    write_spec(spec, **dict(SPEC, repeats=2))
    env = dict(cli.env)
    run4 = subprocess.Popen([sys.executable, "-m", "jobs.cli", "study", "run", str(spec), "--profile", "ci",
                             "--max-concurrent", "1"], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lock = os.path.join(directory, "run.lock")
    wait_for(lambda: "pid" in (open(lock).read() if os.path.exists(lock) else "") or run4.poll() is not None,
             timeout=60, what="the second study run to hold the lock")
    out["run5"] = cli("study", "run", spec, "--profile", "ci")
    out["most_queued"] = _sample_while(run4, cluster, NAME)
    out["run4"] = (run4.returncode, run4.stdout.read(), run4.stderr.read())
    out["watch2"] = watch(cli, directory)
    out["report2"] = report(cli, directory)
    return out


def test_right_after_submission_points_are_pending_or_running_never_failed(seen):
    assert submitted(seen["run1"]) == (2, 2)
    rc, st = seen["status1"]
    assert rc == 0, st
    assert {p["state"] for p in st["points"]} <= {"pending", "running"}, st
    assert st["counts"]["failed"] == 0


def test_a_second_run_right_after_submits_nothing(seen):
    assert submitted(seen["run2"]) == (0, 2)
    assert len(seen["queue2"]) == 2, seen["queue2"]
    assert len(job_ids([r for p in record(seen["dir"])["points"] for r in p["runs"]])) == 2 + 1 + 2


def test_the_cancelled_baseline_is_failed_cancelled_and_the_report_does_not_rebase(seen):
    rc, st = seen["watch1"]
    by_id = {p["id"]: p for p in st["points"]}
    assert rc == 1 and by_id["g1-n1x1-r0"]["state"] == "failed"
    assert by_id["g1-n1x1-r0"]["reason"].startswith("CANCELLED"), by_id["g1-n1x1-r0"]
    assert by_id["g2-n1x2-r0"]["state"] == "done"
    proc, rep = seen["report1"]
    assert proc.returncode == 1
    cell = next(r for r in rep["rows"] if r["gpus"] == 2)["variants"]["default"]
    assert cell["throughput"] > 0 and cell["speedup"] is None and cell["efficiency"] is None
    assert rep["baseline_problems"] and "g1-n1x1-r0" in rep["baseline_problems"][0]
    assert "g1-n1x1-r0" in proc.stderr and "CANCELLED" in proc.stderr


def test_only_the_cancelled_point_is_resubmitted(seen):
    assert submitted(seen["run3"]) == (1, 2)
    assert "g1-n1x1-r0" in seen["run3"].stdout


def test_an_added_repeat_submits_only_the_new_points_one_at_a_time(seen):
    rc, stdout, stderr = seen["run4"]
    assert rc == 0, stdout + stderr
    assert "submitted 2 of 4 point(s): g1-n1x1-r1 g2-n1x2-r1" in stdout
    assert seen["most_queued"] == 1
    assert "waiting for a free slot" in stderr
    runs = {p["id"]: len(p["runs"]) for p in record(seen["dir"])["points"]}
    assert runs == {"g1-n1x1-r0": 2, "g2-n1x2-r0": 1, "g1-n1x1-r1": 1, "g2-n1x2-r1": 1}


def test_a_concurrent_run_of_the_same_study_is_refused(seen):
    proc = seen["run5"]
    assert proc.returncode == 2 and "is being submitted by" in proc.stderr and "nothing submitted" in proc.stderr


def test_a_changed_measurement_is_refused_naming_the_key(seen, tmp_path):
    spec = write_spec(tmp_path / "ncf.yaml", **dict(SPEC, steps=3))
    proc = seen["cli"]("study", "run", spec, "--profile", "ci")
    assert proc.returncode == 2 and "steps:" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_the_extended_study_reports_two_repeats_per_point(seen):
    rc, st = seen["watch2"]
    assert rc == 0 and st["counts"]["done"] == 4
    proc, rep = seen["report2"]
    assert proc.returncode == 0, proc.stderr
    assert [r["variants"]["default"]["n"] for r in rep["rows"]] == [2, 2]


def test_a_job_slurm_has_forgotten_keeps_its_state_and_reason(seen, slurm_cluster_acct):
    """After MinJobAge (10 s here) and slurmctld's purge (once a minute), scontrol no longer knows
    the cancelled job; polled the way a cluster without accounting is (squeue), its run still says
    CANCELLED with its reason, from status.json, with no Slurm call; a run never polled before is
    settled by its exit record with one call."""
    cluster, cli = slurm_cluster_acct, seen["cli"]
    job = seen["cancelled"]
    deadline = time.monotonic() + 180

    def forgotten(job_id):
        return "invalid job id" in cluster.run(["scontrol", "show", "job", job_id]).stderr.lower()

    wait_for(lambda: forgotten(job), timeout=180, what=f"Slurm to forget job {job}")
    env = dict(cli.env, RECSYS_STATUS_SOURCE="squeue")
    proc = cli("status", seen["cancelled_run"], "--json", env=env)
    assert proc.returncode == 1, proc.stderr          # a run that ended badly (issue 47, item 11)
    result = json.loads(proc.stdout)
    assert result["calls"] == 0 and result["jobs"][0]["state"] == "CANCELLED"
    assert result["jobs"][0]["reason"].startswith("CANCELLED")
    # a finished point nobody polled since it ended: forget the cache, ask again
    done = next(p for p in record(seen["dir"])["points"] if p["id"] == "g2-n1x2-r0")["runs"][0]
    done_job = job_ids([done])[0]
    wait_for(lambda: forgotten(done_job), timeout=max(0.0, deadline - time.monotonic()),
             what=f"Slurm to forget job {done_job}")
    os.remove(os.path.join(done, "status.json"))
    for expected_calls in (1, 0):
        result = json.loads(cli("status", done, "--json", env=env, check=True).stdout)
        assert result["jobs"][0]["state"] == "COMPLETED" and result["calls"] == expected_calls, result
