"""`$(...)` and `;` in a job name, a path or an engine argument are never executed."""

import os
import subprocess

import pytest

from submit_helpers import Cli, hello_lines

pytestmark = pytest.mark.slurm


def test_injection_is_inert_through_render_and_a_real_job(slurm_cluster, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    marker = work / "PWNED"
    evil = f"$(touch {marker}); touch {marker}2; `touch {marker}3`"
    runs_dir = tmp_path / f"runs $(touch {marker}4);x"
    cli = Cli(slurm_cluster.env, runs_dir)
    proc = subprocess.run(  # render through a shell, as a user would, then submit for real
        ["bash", "-c", 'python -m jobs.cli render benchmark "$@" > script.sh', "render",
         "--profile", "ci", "--model", "hello", "--name", evil, "--nodes", "1", "--",
         "--tag", evil], cwd=work, env=dict(cli.env, PYTHONPATH=os.getcwd()), text=True,
        capture_output=True)
    assert proc.returncode == 0, proc.stderr
    script = (work / "script.sh").read_text()
    assert "PWNED" in script
    run_dir, record = cli.submit("benchmark", "--profile", "ci", "--model", "hello", "--name", evil,
                                 "--nodes", "1", "--gpus-per-node", "1", "--time", "5", "--",
                                 "--tag", evil, env=dict(cli.env))
    assert slurm_cluster.wait_job(record["jobs"][0]["job_id"]) == "COMPLETED"
    ranks = hello_lines(run_dir)
    assert ranks and ranks[0]["extra_args"] == ["--tag", evil]   # reached the program verbatim
    assert "$(touch" in run_dir
    for suffix in ("", "2", "3", "4"):
        assert not os.path.exists(f"{marker}{suffix}"), suffix
    for root, dirs, files in os.walk(tmp_path):
        assert not any(f.startswith("PWNED") for f in files), (root, files)
