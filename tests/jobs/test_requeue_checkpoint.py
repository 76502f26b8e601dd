"""Issue 43 item 6: `recsys-submit requeue` of a running training job first has it save a
checkpoint (USR2 to its batch script, as the time limit does) and says how many steps it kept;
the requeued attempt restores at that step. A job that ends between the command's look and its
act is refused by Slurm itself (a signal to an ended job), in one line, and never runs again (a
plain `scontrol requeue` re-ran a COMPLETED job). Real jobs on the local Slurm cluster; the race
is made certain by `scancel`/`scontrol` shims on PATH that wait for the test before they exec the
real command."""

import os
import re
import shutil
import subprocess
import sys

import pytest

from submit_helpers import hello_lines
from tests.faults.train_helpers import ENGINE, REPO, ROWS, make_data, read_log, release_requeued, submit
from tests.waiting import wait_for

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return make_data(tmp_path_factory.mktemp("requeue-data"), rows=ROWS)


def _fields(cluster, job_id):
    words = cluster.run(["scontrol", "-o", "show", "job", str(job_id)]).stdout.split()
    return dict(w.split("=", 1) for w in words if "=" in w)


@pytest.mark.horovod
def test_requeue_of_a_running_training_job_checkpoints_first_and_keeps_its_steps(cli, slurm_cluster, data,
                                                                                 tmp_path):
    ck = tmp_path / "ck"
    run_dir, rec, _ = submit(cli, "train", "--profile", "ci", "--model", "dlrm", "--nodes", "1", "--gpus-per-node",
                             "1", "--time", "10", "--", *ENGINE, "--epochs", "20", "--data-path", data,
                             "--checkpoint-dir", ck, "--restore")     # 640 steps: still running when asked
    job = rec["jobs"][0]["job_id"]
    log = os.path.join(run_dir, "logs", f"main-{job}.engine.jsonl")
    try:
        wait_for(lambda: any(r.get("type") == "step" and r["step"] >= 3 for r in read_log(log)), timeout=400,
                 what="the first training steps", delay=0.05)
        proc = cli("requeue", run_dir, timeout=400)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        line = proc.stdout.splitlines()[0]
        match = re.fullmatch(rf"requeue: job main \({job}\): checkpoint at step (\d+) saved, requeued: "
                             r"(\d+) steps kept, (\d+) lost", line)
        assert match, proc.stdout
        saved, kept, lost = map(int, match.groups())
        assert saved == kept and 3 <= saved < 640 and lost <= 1, line
        wait_for(lambda: release_requeued(slurm_cluster, job) and any("restored_step" in r for r in read_log(log)),
                 timeout=400, what="the requeued attempt to restore")
    finally:
        slurm_cluster.run(["scancel", job])
    records = read_log(log)
    restores = [r["restored_step"] for r in records if "restored_step" in r]
    first_restore = next(i for i, r in enumerate(records) if "restored_step" in r)
    trained_before = max(r["step"] for r in records[:first_restore] if r.get("type") == "step")
    assert restores == [saved], restores
    assert trained_before - saved == lost
    assert _fields(slurm_cluster, job).get("Restarts") == "1"


def _pausing_shims(tmp_path, env):
    """(env with `scancel --signal` and `scontrol requeue` shims first on PATH that wait for a
    release file, the `waiting` file they touch, the `release` file)."""
    shim = tmp_path / "shim"
    shim.mkdir()
    waiting, release = tmp_path / "act-waiting", tmp_path / "act-release"
    for name, acts in (("scancel", '[[ " $* " == *" --signal="* ]]'), ("scontrol", '[ "${1:-}" = requeue ]')):
        real = shutil.which(name, path=env["PATH"])
        assert real, f"{name} not on PATH"
        (shim / name).write_text(
            "#!/bin/bash\n"
            f"if {acts}; then\n"
            f"  touch '{waiting}'\n"
            "  for _ in $(seq 1200); do [ -e '" + str(release) + "' ] && break; sleep 0.1; done\n"
            "fi\n"
            f"exec '{real}' \"$@\"\n")
        (shim / name).chmod(0o755)
    return dict(env, PATH=f"{shim}{os.pathsep}{env['PATH']}"), waiting, release


def test_a_job_that_ends_before_the_requeue_acts_is_refused_by_slurm_in_one_line(cli, slurm_cluster, tmp_path):
    run_dir, record = cli.submit("benchmark", "--profile", "ci", "--model", "hello", "--nodes", "1",
                                 "--gpus-per-node", "1", "--time", "5", "--", "--sleep", "6")
    job = record["jobs"][0]["job_id"]
    wait_for(lambda: hello_lines(run_dir), timeout=90, what="the step to start")
    env, waiting, release = _pausing_shims(tmp_path, cli.env)
    proc = subprocess.Popen([sys.executable, "-m", "jobs.cli", "requeue", run_dir], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: waiting.exists() or proc.poll() is not None, timeout=120, what="requeue to act")
        assert proc.poll() is None, proc.communicate()      # it saw the job running
        assert slurm_cluster.wait_job(job, timeout=120) == "COMPLETED"
        release.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 2, out + err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"recsys-submit: error: requeue: job main ({job}) was not asked to checkpoint, Slurm refused the signal "
        f"(scancel: error: Kill job error on job id {job}: ") and lines[0].endswith(
        "): it ended after it was looked at; nothing was requeued"), err
    fields = _fields(slurm_cluster, job)
    assert fields.get("JobState") == "COMPLETED" and fields.get("Restarts") == "0", fields


def test_a_job_not_started_or_submitted_with_no_requeue_is_refused_in_one_line(cli, slurm_cluster):
    hello = ["--profile", "ci", "--model", "hello", "--nodes", "1", "--gpus-per-node", "1", "--time", "5"]
    first_dir, first = cli.submit("benchmark", *hello, "--no-requeue", "--", "--sleep", "60")
    first_id = first["jobs"][0]["job_id"]
    second_dir, second = cli.submit("benchmark", *hello, "--after", first_id)
    second_id = second["jobs"][0]["job_id"]
    try:
        proc = cli("requeue", first_dir)
        assert proc.returncode == 2 and proc.stderr.splitlines() == [
            f"recsys-submit: error: requeue: job main ({first_id}) was submitted with --no-requeue: its batch script "
            "ends after the checkpoint instead of requeueing; cancel it and submit again (the engine's --restore "
            "resumes from its checkpoint)"], proc.stderr
        proc = cli("requeue", second_dir)
        assert proc.returncode == 2 and proc.stderr.splitlines() == [
            f"recsys-submit: error: requeue: run {second_dir}: not running: job main ({second_id}) is PENDING; "
            "nothing to checkpoint or requeue"], proc.stderr
        assert [_fields(slurm_cluster, j).get("Restarts") for j in (first_id, second_id)] == ["0", "0"]
    finally:
        slurm_cluster.run(["scancel", first_id, second_id])
