"""`requeue` and `cancel` of a run look at its jobs first (one poll): a run whose jobs have all
ended is refused with their states in one line (Slurm would otherwise run a COMPLETED job again
on `scontrol requeue`), and a cancel of a run with some jobs ended and some active cancels only
the active ones and says which it left alone. Real jobs of the built-in hello payload on the
local Slurm cluster."""

import pytest

pytestmark = pytest.mark.slurm

HELLO = ["--profile", "ci", "--model", "hello", "--nodes", "1", "--gpus-per-node", "1", "--time", "5"]


def _restarts(cluster, job_id):
    words = cluster.run(["scontrol", "show", "job", job_id]).stdout.split()
    return dict(w.split("=", 1) for w in words if "=" in w).get("Restarts")


def _one_error(proc):
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_requeue_and_cancel_of_a_finished_run_are_refused_with_its_state(cli, slurm_cluster):
    run_dir, record = cli.submit("benchmark", *HELLO)
    job_id = record["jobs"][0]["job_id"]
    watched = cli("status", run_dir, "--watch")
    assert watched.returncode == 0, watched.stdout + watched.stderr
    requeue = cli("requeue", run_dir)
    assert requeue.returncode == 2
    assert _one_error(requeue) == (f"recsys-submit: error: requeue: run {run_dir}: job main ({job_id}) is COMPLETED; "
                                   "requeue only restarts queued or running jobs; submit again")
    assert _restarts(slurm_cluster, job_id) == "0"      # Slurm was not asked to run it again
    assert slurm_cluster.job_state(job_id) == "COMPLETED"
    cancel = cli("cancel", run_dir)
    assert cancel.returncode == 2 and cancel.stdout == ""
    assert _one_error(cancel) == (f"recsys-submit: error: cancel: run {run_dir}: job main ({job_id}) is COMPLETED; "
                                  "nothing to cancel")


def test_cancel_of_a_half_finished_run_cancels_only_its_active_job(cli, slurm_cluster):
    # two jobs in one run: an array split in chunks of one task, the second after the first (--parallelism)
    env = dict(cli.env, RECSYS_MAX_ARRAY_SIZE="1")
    run_dir, record = cli.submit("benchmark", *HELLO, "--array", "2", "--parallelism", "1", "--", "--sleep", "600",
                                 env=env)
    first, second = (j["job_id"] for j in record["jobs"])
    assert [j["key"] for j in record["jobs"]] == ["main.0", "main.1"]
    slurm_cluster.run(["scancel", first], check=True)        # the first ends; the second may start now
    assert slurm_cluster.wait_job(first) == "CANCELLED"
    cancel = cli("cancel", run_dir, env=env)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    assert cancel.stdout.splitlines() == [f"cancel: left alone, already ended: job main.0 ({first}) is CANCELLED",
                                          f"cancel: {second}"]
    assert slurm_cluster.wait_job(second) == "CANCELLED"
    again = cli("cancel", run_dir, env=env)
    assert again.returncode == 2
    assert _one_error(again) == (f"recsys-submit: error: cancel: run {run_dir}: job main.0 ({first}) is CANCELLED, "
                                 f"job main.1 ({second}) is CANCELLED; nothing to cancel")
