"""A one-node Spark standalone cluster with GPU resource scheduling, on the local Slurm cluster.

What ``recsys-submit preprocess`` starts for a RAPIDS run on one node (Spark's local mode
schedules no GPUs): slurm/spark-standalone.sh over the job's one node with ``--gpus-per-node``
(the worker offers the node's GPUs through preproc/runtime/gpu-discovery.sh), and the driver
with the executor cores and executor/task GPU amounts of slurm/common/spark_layout.py, as the plan
hands them over (``--spark-conf``). The test cluster's GPUs are fake devices and there is no
RAPIDS jar, so Spark's own GPU scheduling runs for real (worker offer, one GPU per executor,
task slots from the task amount) under a CPU plan: the job must not hang, every executor must
be granted a GPU address, and the output must equal the in-process reference byte for byte.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from slurm.common.spark_layout import gpu_resource_conf
from tests.preproc.test_criteo_slurm import assert_same_dataset

pytestmark = [pytest.mark.slurm, pytest.mark.spark, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
GPUS, CORES = 2, 2          # the ci cluster's nodes (slurm/dev/local-cluster.sh defaults)


def test_one_node_standalone_with_gpu_scheduling(slurm_cluster, criteo_reference, tmp_path):
    raw, reference = criteo_reference
    out, log_dir = tmp_path / "out", tmp_path / "spark-logs"
    conf = gpu_resource_conf(CORES, GPUS)
    assert conf == {"spark.executor.cores": "1", "spark.executor.resource.gpu.amount": "1",
                    "spark.task.resource.gpu.amount": "1"}
    driver = [sys.executable, "-m", "preproc", "criteo", "run", "--input", str(raw), "--output", str(out),
              "--threshold", "2", "--nodes", "1", "--node-cores", str(CORES), "--node-memory-gb", "3",
              "--gpus-per-node", str(GPUS)]
    for key, value in conf.items():
        driver += ["--spark-conf", f"{key}={value}"]
    script = tmp_path / "gpu-standalone.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task={CORES}
#SBATCH --gres=gpu:{GPUS}
#SBATCH --time=00:15:00
#SBATCH --output={tmp_path}/job-%j.out
export RECSYS_PYTHON={sys.executable}
export PYTHONPATH={REPO}
cd {tmp_path}
echo "batch CUDA_VISIBLE_DEVICES=${{CUDA_VISIBLE_DEVICES:-unset}}"
exec bash {REPO}/slurm/spark-standalone.sh --log-dir {log_dir} --gpus-per-node {GPUS} -- {' '.join(driver)}
""")
    result = slurm_cluster.run(["sbatch", "--parsable", str(script)])
    assert result.returncode == 0, result.stderr
    jobid = result.stdout.strip().split(";")[0]
    state = slurm_cluster.wait_job(jobid, timeout=600)
    text = "\n".join(p.read_text(errors="replace") for p in tmp_path.glob("job-*.out"))
    worker = "\n".join(p.read_text(errors="replace") for p in log_dir.glob("worker-*.log"))
    executors = "\n".join(p.read_text(errors="replace") for p in log_dir.glob("work-*/*/*/stderr"))
    assert state == "COMPLETED", f"{state}\n{text[-4000:]}\n{worker[-3000:]}"
    assert "1 worker(s) registered" in text and f"x {GPUS} GPU(s)" in text, text[-3000:]
    assert "spark.task.resource.gpu.amount=1" in text and "spark.master=spark://" in text, text[-3000:]
    # the worker offered both (fake) GPUs, as CUDA ordinals 0..n-1 of its visible devices
    assert re.search(r"gpu -> \[name: gpu, addresses: 0,1\]", worker), worker[-3000:]
    # two 1-core executors, each granted one GPU of its own
    granted = sorted(re.findall(r"gpu -> \[name: gpu, addresses: (\d)\]", executors))
    assert granted == ["0", "1"], executors[-3000:]
    assert_same_dataset(out, reference)
