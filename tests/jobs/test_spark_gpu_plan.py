"""Spark and dask on GPU nodes, as the submission layer plans them (issue 26, items 3 and 5).

* A RAPIDS Spark run never uses local mode (Spark schedules no GPUs there): on one node as on
  several, the job starts slurm/spark-standalone.sh inside the allocation, its workers offer the
  node's GPUs, and the driver gets the executor cores and executor/task GPU amounts of
  slurm/common/spark_layout.py (task amount 1 / executor cores), which the dry run shows.
* The driver, run with the rendered arguments, plans the same standalone cluster and amounts.
* NVTabular's dask cluster gets the node's memory share, which dask-cluster.sh splits per worker.
"""
import os
import shlex
import subprocess
import sys

import pytest

from jobs.planning.plan import plan
from jobs.planning.request import JobRequest
from jobs.profiles import load_profile
from jobs.submit import render_plan

pytestmark = pytest.mark.fast

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JAR = "/opt/rapids/rapids-4-spark_2.12-24.02.0.jar"
# DGX A100: 256 logical CPUs, 8 GPUs -> 8 executors x 32 cores, 1 GPU each, 1/32 GPU per task
AMOUNTS = ("--spark-conf spark.executor.cores=32 --spark-conf spark.executor.resource.gpu.amount=1 "
           "--spark-conf spark.task.resource.gpu.amount=0.03125")


def _request(mode, nodes=None, engine_args=(JAR,)):
    args = ["--rapids-jar", *engine_args] if engine_args else []
    return JobRequest(kind="preprocess", dataset="criteo", preprocess_mode=mode, nodes=nodes,
                      input="/data/criteo/raw", output="/data/criteo/dlrm", engine_args=args)


def _step(text):
    return next(line for line in text.splitlines() if "preproc criteo run" in line)


@pytest.mark.parametrize("mode, nodes", [("single", None), ("multinode", 2)])
def test_rapids_runs_start_a_standalone_cluster_with_the_documented_gpu_amounts(tmp_path, mode, nodes):
    profile = load_profile("dgxa100-pod-spark")
    [(spec, text)] = render_plan([_request(mode, nodes)], profile, run_dir=str(tmp_path / "run"))
    n = nodes or 1
    assert spec.launcher == "batch" and spec.nodes == n and spec.gpus_per_node == 8
    assert f"#SBATCH --nodes={n}" in text and "#SBATCH --gres=gpu:8" in text
    step = _step(text)
    # the workers offer the driver's node cores; the profile's start-up timeout and node-local scratch
    assert ('"$RECSYS_SLURM_DIR/spark-standalone.sh" --worker-cores 256 --timeout 300 --local-dirs /raid/scratch '
            '--gpus-per-node 8 -- ') in step, step
    assert f"--nodes {n} --node-cores 256 --node-memory-gb 1024 --gpus-per-node 8 {AMOUNTS}" in step, step
    assert f"--rapids-jar {JAR}" in step and "local[" not in text
    assert "spark.driver.resource" not in text


def test_a_users_spark_conf_comes_after_the_planned_amounts(tmp_path):
    profile = load_profile("dgxa100-pod-spark")
    request = _request("single", engine_args=(JAR, "--spark-conf", "spark.task.resource.gpu.amount=0.0625"))
    [(_, text)] = render_plan([request], profile, run_dir=str(tmp_path / "run"))
    step = _step(text)
    assert step.index("spark.task.resource.gpu.amount=0.03125") < step.index("spark.task.resource.gpu.amount=0.0625")


def test_cpu_spark_on_one_node_stays_in_local_mode(tmp_path):
    """No RAPIDS jar (a CPU plan even on a GPU node) or no GPUs: one process, Spark's local mode."""
    for profile, request in ((load_profile("dgxa100-pod-spark"), _request("single", engine_args=())),
                             (load_profile("ci"), _request("single", engine_args=()))):
        [(spec, text)] = render_plan([request], profile, run_dir=str(tmp_path / profile.name))
        assert spec.launcher == "srun" and "spark-standalone.sh" not in text
        assert "--spark-conf" not in _step(text)
    # a jar on a GPU-less profile is the driver's one-line error, not a standalone cluster
    _, [spec] = plan([_request("single")], load_profile("local"))
    assert "spark-standalone.sh" not in " ".join(map(str, spec.command))


@pytest.mark.parametrize("mode, nodes", [("single", None), ("multinode", 2)])
def test_the_driver_plans_what_the_script_shows(tmp_path, mode, nodes):
    """The rendered driver arguments, run with --dry-run (no master exported yet): the standalone
    cluster spark-standalone.sh starts, one executor per GPU, the amounts the script shows."""
    _, [spec] = plan([_request(mode, nodes)], load_profile("dgxa100-pod-spark"))
    command = [str(a) for a in spec.command]
    driver = command[command.index("--") + 1:]
    assert driver[:3] == ["python", "-m", "preproc"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_", "RECSYS_SPARK_"))}
    env["PYTHONPATH"] = REPO
    result = subprocess.run([sys.executable] + driver[1:] + ["--dry-run"], capture_output=True, text=True,
                            cwd=str(tmp_path), env=env, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "spark.master=spark://<first node of the job>:7077" in out, out
    assert "# mode=cluster-gpu executors_per_node=8 executor_cores=32" in out
    for line in ("spark.executor.cores=32", "spark.executor.resource.gpu.amount=1",
                 "spark.task.resource.gpu.amount=0.03125", "spark.plugins=com.nvidia.spark.SQLPlugin",
                 f"spark.cores.max={(nodes or 1) * 256}"):
        assert line in out.splitlines(), (line, out)
    assert "spark.driver.resource" not in out


def test_dask_cluster_gets_the_node_memory_share_not_a_per_worker_node_limit(tmp_path):
    (tmp_path / "nvt.yaml").write_text("extends: dgxa100-pod\ncontainer:\n  provides: [nvtabular]\n")
    profile = load_profile(str(tmp_path / "nvt.yaml"))
    request = JobRequest(kind="preprocess", dataset="criteo", preprocess_mode="multinode", nodes=2,
                         preprocess_engine="nvtabular", input="/data/raw", output="/data/out")
    [(_, text)] = render_plan([request], profile, run_dir=str(tmp_path / "run"))
    step = _step(text)
    # 85 % of the 1024 GiB node, which dask-cluster.sh splits over its 8 dask-cuda workers
    assert ('"$RECSYS_SLURM_DIR/dask-cluster.sh" --gpus-per-node 8 --node-memory-gb 870 --timeout 300 '
            '--local-directory /raid/scratch -- ') in step, step
    assert "--worker-memory-gb" not in step
    assert shlex.split(step)  # quoting intact
