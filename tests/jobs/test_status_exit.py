"""`recsys-submit status RUN` says with its exit status whether the run ended badly (issue 47,
item 11), as `study status` does: a failed run exits 1 (it exited 0), a completed one 0. Real
local jobs (`--profile local`: processes, no Slurm); a HUNG job is another state run_failed counts
(jobs.status.run_failed), on the cluster in tests/jobs/test_hang_slurm.py."""

import os
import subprocess
import sys

from submit_helpers import REPO


def _cli(tmp_path, *args):
    env = dict(os.environ, RECSYS_RUNS_DIR=str(tmp_path / "runs"), OMPI_MCA_btl="self,tcp",
               OMPI_MCA_btl_tcp_if_include="lo", OMPI_MCA_oob_tcp_if_include="lo")
    env.pop("SLURM_CONF", None)
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=300)


def _run_dir(proc):
    return next(line[8:] for line in proc.stdout.splitlines() if line.startswith("run dir "))


def test_status_of_a_failed_run_exits_1_and_of_a_completed_one_0(tmp_path):
    failed = _cli(tmp_path, "benchmark", "--profile", "local", "--model", "hello", "--time", "5", "--", "--fail")
    assert failed.returncode == 1, failed.stderr
    shown = _cli(tmp_path, "status", _run_dir(failed))
    assert shown.returncode == 1 and "FAILED" in shown.stdout, shown.stdout + shown.stderr
    assert _cli(tmp_path, "status", _run_dir(failed), "--json").returncode == 1
    done = _cli(tmp_path, "benchmark", "--profile", "local", "--model", "hello", "--time", "5")
    assert done.returncode == 0, done.stderr
    shown = _cli(tmp_path, "status", _run_dir(done))
    assert shown.returncode == 0 and "COMPLETED" in shown.stdout
