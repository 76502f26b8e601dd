"""A submitter killed while its `sbatch` still runs (issue 43, item 3): the submit lock is held by
sbatch itself, so nobody settles the run as "never submitted" while its job may still go in.

An `sbatch` shim first on PATH waits for a release file (polled, with a timeout) and then execs
the real sbatch: a slow or paused controller. The submitter (a plain `benchmark`, then a study
with one point) is SIGKILLed while the shim waits; then `status`, `cancel` and a study re-run
look at the run; then the shim is released. What must hold: the run's token is still in
jobs.json while sbatch may run, `cancel` refuses in one line instead of saying there is nothing
to cancel, the re-run submits nothing, and once sbatch has exited exactly one job carries the
token, which `status` shows and `cancel` removes. Before the fix: 2 of 2 orphans, 3 of 3
duplicates (the lock died with the submitter). Jobs are submitted held (`sbatch --hold`), so no
engine starts.
"""

import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from jobs.runs.rundir import SUBMIT_LOCK, lock_held
from tests.faults.test_submit_crash import queue_by_token
from tests.jobs.study_helpers import TINY_NCF, write_spec
from tests.waiting import wait_for
from submit_helpers import REPO

pytestmark = pytest.mark.slurm


def held_profile(tmp_path):
    path = tmp_path / "held.yaml"
    path.write_text("extends: ci\ndescription: the ci cluster, every job submitted held\n"
                    "shared_nodes: true\nsbatch_extra: [\"--hold\"]\n")
    return path


def paused_sbatch(tmp_path, env):
    """(env with a pausing sbatch first on PATH, its `waiting` file, its `release` file)."""
    real = shutil.which("sbatch", path=env["PATH"])
    assert real, "sbatch not on PATH"
    shim = tmp_path / "shim"
    shim.mkdir()
    waiting, release = tmp_path / "sbatch-waiting", tmp_path / "sbatch-release"
    (shim / "sbatch").write_text(
        "#!/bin/bash\n"
        f"touch '{waiting}'\n"
        "for _ in $(seq 1200); do\n"       # at most 120 s, then it gives up (a test that never releases)
        f"  [ -e '{release}' ] && exec '{real}' \"$@\"\n"
        "  sleep 0.1\n"
        "done\n"
        "echo 'sbatch shim: never released' >&2; exit 1\n")
    (shim / "sbatch").chmod(0o755)
    return dict(env, PATH=f"{shim}{os.pathsep}{env['PATH']}"), waiting, release


def killed_in_sbatch(cli, env, waiting, *args):
    """Run `recsys-submit ARGS` and SIGKILL it once its sbatch is waiting."""
    proc = subprocess.Popen([sys.executable, "-m", "jobs.cli", *map(str, args)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: waiting.exists() or proc.poll() is not None, timeout=120, what="the paused sbatch")
        assert proc.poll() is None, proc.communicate()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()


def jobs_json(run_dir):
    with open(os.path.join(run_dir, "jobs.json")) as handle:
        return json.load(handle)


def release_and_wait(release, run_dir):
    release.touch()
    lock = os.path.join(run_dir, SUBMIT_LOCK)
    wait_for(lambda: lock_held(lock) is False, timeout=120, what="sbatch to exit and let go of the submit lock")


def test_a_plain_run_killed_while_sbatch_runs_ends_with_its_one_job_known(slurm_cluster, cli, tmp_path):
    env, waiting, release = paused_sbatch(tmp_path, cli.env)
    killed_in_sbatch(cli, env, waiting, "benchmark", "--profile", held_profile(tmp_path), "--model", "hello",
                     "--nodes", "1")
    (run,) = [os.path.join(cli.runs_dir, d) for d in os.listdir(cli.runs_dir)]
    token = jobs_json(run)["intent"]["token"]
    assert lock_held(os.path.join(run, SUBMIT_LOCK)) is True       # sbatch holds it, its submitter is gone

    status = cli("status", run, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["jobs"] == []
    assert jobs_json(run)["intent"]["token"] == token, "settled while sbatch may still submit"
    cancel = cli("cancel", run)
    assert cancel.returncode != 0 and "still under way" in cancel.stderr, (cancel.stdout, cancel.stderr)
    assert len(cancel.stderr.strip().splitlines()) == 1, cancel.stderr

    release_and_wait(release, run)
    (job_id,) = queue_by_token(slurm_cluster)[token]
    status = cli("status", run, "--json")
    assert [(j["job_id"], j["state"]) for j in json.loads(status.stdout)["jobs"]] == [(job_id, "PENDING")]
    cancel = cli("cancel", run)
    assert cancel.returncode == 0, cancel.stderr
    assert slurm_cluster.wait_job(job_id, timeout=60) == "CANCELLED"
    assert [j["job_id"] for j in jobs_json(run)["jobs"]] == [job_id]


def test_a_study_point_killed_while_sbatch_runs_is_submitted_once(slurm_cluster, cli, tmp_path):
    env, waiting, release = paused_sbatch(tmp_path, cli.env)
    profile = held_profile(tmp_path)
    spec = write_spec(tmp_path / "inflight.yaml", version=1, name="inflight", model="ncf", scaling="weak",
                      batch_size=64, gpus=[1], warmup_steps=1, steps=2, time="00:05:00", synthetic=True,
                      engine_args=TINY_NCF)
    killed_in_sbatch(cli, env, waiting, "study", "run", spec, "--profile", profile)
    study = os.path.join(cli.runs_dir, "study-inflight")
    (run,) = [os.path.join(study, "points", d) for d in os.listdir(os.path.join(study, "points"))]
    token = jobs_json(run)["intent"]["token"]

    again = cli("study", "run", spec, "--profile", profile)      # the real sbatch: a resubmission would go in
    assert again.returncode == 0, again.stderr
    proc = cli("study", "status", study, "--json")
    assert [p["state"] for p in json.loads(proc.stdout)["points"]] == ["unknown"], proc.stdout
    assert jobs_json(run)["intent"]["token"] == token

    release_and_wait(release, run)
    again = cli("study", "run", spec, "--profile", profile)
    assert again.returncode == 0, again.stderr
    with open(os.path.join(study, "study.json")) as handle:
        runs = [os.path.join(study, r) for p in json.load(handle)["points"] for r in p["runs"]]
    queue = queue_by_token(slurm_cluster)
    tokens = {j["token"] for r in runs for j in jobs_json(r)["jobs"] + [jobs_json(r)["intent"] or {}] if j}
    ids = [i for t in tokens for i in queue.get(t, [])]
    try:
        assert len(runs) == 1 and ids == queue[token], (runs, ids)
        proc = cli("study", "status", study, "--json")
        assert [p["state"] for p in json.loads(proc.stdout)["points"]] == ["pending"], proc.stdout
    finally:
        if ids:
            slurm_cluster.run(["scancel", *ids])
