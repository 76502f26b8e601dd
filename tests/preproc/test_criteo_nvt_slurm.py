"""NVTabular multinode: ``recsys-submit preprocess --engine nvtabular --mode multinode`` on 2 nodes.

The job starts slurm/dask-cluster.sh (a dask scheduler + one worker per node on
the local Slurm cluster, profile ``ci``), runs ``criteo run --engine nvtabular``
against it and stops the cluster. The dataset must equal the one-node run
(in-process, dask threads) file for file and row for row, the work must have
run on the 2 registered workers, and no dask process may outlive the job.
Skipped (with the fixture's reason) only when Slurm is not installed.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.processes import live_commands

from preproc.criteo.generate import generate
from preproc.criteo.layout import MAPPINGS, day_files, parse_thresholds
from preproc.dataio.output import input_files

pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def _dask_processes(marker: str) -> list[str]:
    return live_commands(marker, "distributed.cli")


def test_multinode_dask_cluster_equals_one_node(slurm_cluster, tmp_path):
    import pandas as pd

    from preproc.criteo import nvt as criteo_nvt

    raw = tmp_path / "raw"
    generate(raw, rows=3000, days=3, seed=11)
    found = day_files(input_files(raw))
    files = [(idx, day, path) for idx, (day, path) in enumerate(found)]
    one = tmp_path / "one_node"
    criteo_nvt.run(files, found[-1][0], parse_thresholds("2"), str(one), part_rows=700)

    out = tmp_path / "multinode"
    result = slurm_cluster.run([sys.executable, "-m", "jobs.cli", "preprocess", "--profile", "ci", "--dataset",
                                "criteo", "--engine", "nvtabular", "--mode", "multinode", "--nodes", "2",
                                "--input", str(raw), "--output", str(out), "--runs-dir", str(tmp_path / "runs"),
                                "--time", "00:15:00", "--", "--threshold", "2", "--part-rows", "700"],
                               cwd=str(REPO), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    jobid = re.search(r"submitted \S+ job (\d+)", result.stdout).group(1)
    run_dir = Path(re.search(r"run dir (\S+)", result.stdout).group(1))
    state = slurm_cluster.wait_job(jobid, timeout=600)
    text = "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("*.out")))
    assert state == "COMPLETED", f"{state}\n{text[-5000:]}"
    assert "2 worker(s) on" in text and "connected to" in text and "cluster stopped" in text, text[-5000:]
    dask_logs = list((run_dir / "logs").glob("dask-*"))
    assert dask_logs and len(list(dask_logs[0].glob("worker-*.log"))) == 2
    assert not _dask_processes(str(dask_logs[0]))

    for mapping in MAPPINGS:
        mine = sorted(p.name for p in (out / mapping).glob("*.parquet"))
        assert mine == sorted(p.name for p in (one / mapping).glob("*.parquet")) and mine, mapping
        for name in mine:
            pd.testing.assert_frame_equal(pd.read_parquet(out / mapping / name), pd.read_parquet(one / mapping / name))
    assert (out / "feature_spec.yaml").read_text() == (one / "feature_spec.yaml").read_text()
    assert (out / criteo_nvt.WORKFLOW_DIR / "workflow.pkl").is_file()
