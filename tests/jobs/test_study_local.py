"""`--profile local`: a study of 1 and 2 ranks (mpirun) on this machine, no Slurm: the points run
one after another in the foreground, the report comes from their engine summaries, and a re-run
submits nothing."""

import json
import os
import re
import subprocess
import sys

import pytest

from submit_helpers import REPO

pytestmark = [pytest.mark.horovod, pytest.mark.slow]


def test_local_study_one_and_two_ranks(tmp_path):
    pytest.importorskip("horovod.tensorflow")
    env = dict(os.environ, RECSYS_RUNS_DIR=str(tmp_path / "runs"), OMPI_MCA_btl="self,tcp",
               OMPI_MCA_btl_tcp_if_include="lo", OMPI_MCA_oob_tcp_if_include="lo")
    env.pop("SLURM_CONF", None)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=REPO, env=env, text=True,
                              capture_output=True, timeout=600)

    sweep = ["study", "run", "--profile", "local", "--model", "ncf", "--gpus", "1,2", "--batch-size", "512",
             "--warmup-steps", "2", "--steps", "4", "--name", "ncf-local", "--", "--factors", "4",
             "--layers", "16,8,4"]
    proc = cli(*sweep)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "submitted 2 of 2 point(s)" in proc.stdout
    study_dir = re.search(r"^study dir (.+)$", proc.stdout, re.M).group(1)
    status = cli("study", "status", study_dir, "--json")
    assert status.returncode == 0, status.stdout + status.stderr
    points = {p["id"]: p for p in json.loads(status.stdout)["points"]}
    assert {i: (p["state"], p["summary"]["world_size"]) for i, p in points.items()} == \
        {"g1-n1x1-r0": ("done", 1), "g2-n1x2-r0": ("done", 2)}
    report = cli("study", "report", study_dir, "--no-plot")
    assert report.returncode == 0, report.stderr
    table = json.load(open(os.path.join(study_dir, "report", "scaling.json")))
    for row in table["rows"]:
        cell = row["variants"]["default"]
        assert cell["throughput"] == points[f"g{row['gpus']}-n1x{row['gpus']}-r0"]["summary"]["throughput_samples_per_s"]
    assert not os.path.exists(os.path.join(study_dir, "report", "scaling.png"))
    again = cli(*sweep)
    assert again.returncode == 0 and "submitted 0 of 2 point(s)" in again.stdout, again.stdout + again.stderr
