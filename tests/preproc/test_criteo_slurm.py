"""Criteo preprocessing on the local Slurm cluster: array mode and a multinode standalone Spark cluster.

Both submit through ``recsys-submit preprocess`` (profile ``ci``) and compare the
result byte for byte with the same pipeline run in-process (Spark local mode),
with the default (reference) rules: training rows shuffled, so the array mode's
finalize merges the shuffle buckets of its two transform tasks.
A third test cancels a running standalone cluster and checks that no Spark
process survives it. Skipped (with the fixture's reason) only when Slurm is not
installed.
"""
from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from tests.processes import live_commands

from preproc.criteo.layout import VALIDATION_SPEC
from tests.preproc.criteo_jobs import logs, submit

pytestmark = [pytest.mark.slurm, pytest.mark.spark, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def raw_and_reference(criteo_reference, tmp_path_factory):
    """(this module's work dir, raw days, the session's in-process reference output)."""
    return (tmp_path_factory.mktemp("criteo_slurm"), *criteo_reference)


def assert_same_dataset(out: Path, reference: Path) -> None:
    from recsys.features.spec import FeatureSpec

    rows = FeatureSpec.from_yaml(str(out / "feature_spec.yaml")).validate()
    rows.update(FeatureSpec.from_yaml(str(out / VALIDATION_SPEC)).validate())
    assert sorted(rows) == ["test", "train", "validation"] and sum(rows.values()) == 3000
    bins = sorted(p.relative_to(reference) for p in reference.glob("*/*.bin"))
    assert len(bins) == 3 * 28
    for rel in bins:
        assert (out / rel).read_bytes() == (reference / rel).read_bytes(), rel


def test_array_mode_dictionary_then_capped_transform_array_then_finalize(slurm_cluster, raw_and_reference):
    base, raw, reference = raw_and_reference
    out = base / "array_out"
    jobs, run_dir = submit(slurm_cluster, "--mode", "array", "--shards", "2", "--array-parallelism", "1",
                           "--input", str(raw), "--output", str(out), "--runs-dir", str(base / "runs"),
                           "--time", "00:15:00", "--", "--threshold", "2")
    assert set(jobs) >= {"dictionary", "transform", "finalize"}, jobs
    scripts = {p.stem: p.read_text() for p in run_dir.glob("*.sbatch")}
    transform = scripts["transform"]
    assert re.search(r"#SBATCH --array=0-1%1", transform), transform[:600]
    assert f"afterok:{jobs['dictionary']}" in transform
    assert f"afterok:{jobs['transform']}" in scripts["finalize"]
    state = slurm_cluster.wait_job(jobs["finalize"], timeout=600)
    assert state == "COMPLETED", f"finalize {state}\n{logs(run_dir)[-5000:]}"
    assert_same_dataset(out, reference)
    assert not Path(f"{out}.stages").exists()


def _spark_processes(marker: str) -> list[str]:
    return live_commands(marker, "deploy")


def test_multinode_standalone_cluster_run(slurm_cluster, raw_and_reference):
    base, raw, reference = raw_and_reference
    out = base / "multinode_out"
    jobs, run_dir = submit(slurm_cluster, "--mode", "multinode", "--nodes", "2", "--input", str(raw),
                           "--output", str(out), "--runs-dir", str(base / "runs"), "--time", "00:15:00",
                           "--", "--threshold", "2")
    (key, jobid), = jobs.items()
    state = slurm_cluster.wait_job(jobid, timeout=600)
    text = logs(run_dir)
    assert state == "COMPLETED", f"{state}\n{text[-5000:]}"
    assert "2 worker(s) registered" in text and "cluster stopped" in text, text[-5000:]
    assert re.search(r"spark\.master=spark://\S+:\d+", text) or "spark://" in text
    spark_logs = list((run_dir / "logs").glob("spark-*"))
    assert spark_logs and len(list(spark_logs[0].glob("worker-*.log"))) == 2
    assert not _spark_processes(str(spark_logs[0]))
    assert_same_dataset(out, reference)


def test_cancel_always_stops_the_standalone_cluster(slurm_cluster, tmp_path):
    log_dir = tmp_path / "spark-logs"
    script = tmp_path / "hold.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=00:10:00
#SBATCH --output={tmp_path}/hold-%j.out
export RECSYS_PYTHON={sys.executable}
exec bash {REPO}/slurm/spark-standalone.sh --log-dir {log_dir} --worker-memory-gb 1 -- sleep 600
""")
    result = slurm_cluster.run(["sbatch", "--parsable", str(script)])
    assert result.returncode == 0, result.stderr
    jobid = result.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 300
    output = lambda: "\n".join(p.read_text() for p in tmp_path.glob("hold-*.out"))  # noqa: E731
    while "worker(s) registered" not in output():
        assert time.monotonic() < deadline, output()
        assert slurm_cluster.job_state(jobid) in ("PENDING", "RUNNING", "CONFIGURING"), output()
        time.sleep(1)
    assert _spark_processes(str(log_dir)), "the cluster should be running now"
    slurm_cluster.run(["scancel", jobid])
    slurm_cluster.wait_job(jobid, timeout=120)
    deadline = time.monotonic() + 60
    while _spark_processes(str(log_dir)):
        assert time.monotonic() < deadline, _spark_processes(str(log_dir))
        time.sleep(0.5)
    assert "caught SIGTERM" in output() and "cluster stopped" in output(), output()
