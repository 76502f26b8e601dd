"""preproc.runtime.spark.spark_settings: Spark configuration derived from the node shape (pure function)."""
from __future__ import annotations

import pytest

from preproc.errors import PreprocError
from preproc.runtime.spark import DISCOVERY_SCRIPT, ClusterShape, spark_settings

pytestmark = pytest.mark.fast

JAR = "/opt/rapids/rapids-4-spark_2.12-24.02.0.jar"


def test_dgx2_gpu_reference_sizing():
    s = spark_settings(ClusterShape(node_cores=80, node_memory_gb=1536, nodes=2, gpus_per_node=16, rapids_jar=JAR,
                                    master="spark://n1:7077", local_dirs="/raid/spark"), environ={})
    assert (s.mode, s.executors_per_node, s.executor_cores) == ("cluster-gpu", 16, 5)
    c = s.conf
    assert c["spark.executor.cores"] == "5" and c["spark.cores.max"] == "160"
    assert c["spark.plugins"] == "com.nvidia.spark.SQLPlugin" and c["spark.jars"] == JAR
    assert c["spark.executor.resource.gpu.amount"] == "1"
    assert c["spark.task.resource.gpu.amount"] == "0.2"
    assert c["spark.executor.resource.gpu.discoveryScript"] == DISCOVERY_SCRIPT
    assert c["spark.rapids.sql.concurrentGpuTasks"] == "2"
    assert c["spark.rapids.memory.pinnedPool.size"] == "7g"  # 10 % of the 79.6 GiB executor share, floored
    assert c["spark.driver.memory"] == "32g"
    # (0.85 * 1536 - 32) / 16 = 79.6 GiB per executor: 71g heap, the rest overhead + pinned pool
    assert c["spark.executor.memory"] == "71g" and c["spark.executor.memoryOverhead"] == "16g"
    assert c["spark.sql.shuffle.partitions"] == "600" and c["spark.sql.files.maxPartitionBytes"] == "1g"
    assert c["spark.network.timeout"] == "1800s" and c["spark.locality.wait"] == "0s"
    assert s.env["SPARK_LOCAL_DIRS"] == "/raid/spark" and c["spark.local.dir"] == "/raid/spark"


def test_dgxa100_gpu_reference_sizing():
    s = spark_settings(ClusterShape(node_cores=256, node_memory_gb=2048, nodes=4, gpus_per_node=8, rapids_jar=JAR,
                                    master="spark://n1:7077"), environ={})
    assert (s.executors_per_node, s.executor_cores) == (8, 32)
    assert s.conf["spark.task.resource.gpu.amount"] == "0.03125"
    assert s.conf["spark.rapids.memory.pinnedPool.size"] == "16g"  # capped at the reference 16g
    assert s.conf["spark.sql.shuffle.partitions"] == str(2 * 4 * 256)  # 1024 cores: 2 x cores beats 600


def test_gpus_without_jar_is_a_cpu_plan():
    s = spark_settings(ClusterShape(node_cores=80, node_memory_gb=1536, gpus_per_node=16,
                                    master="spark://n1:7077"), environ={})
    assert s.mode == "cluster-cpu" and (s.executors_per_node, s.executor_cores) == (16, 5)
    assert not any(k.startswith("spark.rapids") or "gpu" in k for k in s.conf)
    assert "spark.plugins" not in s.conf


def test_local_mode_and_master_from_environment():
    s = spark_settings(ClusterShape(node_cores=2, node_memory_gb=8), environ={})
    assert s.master == "local[2]" and s.mode == "local-cpu"
    assert s.conf["spark.driver.memory"] == "4g" and s.conf["spark.sql.shuffle.partitions"] == "4"
    assert "spark.executor.cores" not in s.conf and "SPARK_LOCAL_DIRS" not in s.env
    env = {"SPARK_MASTER_URL": "spark://node1:7177", "SPARK_LOCAL_DIRS": "/scratch/job1", "PYSPARK_PYTHON": "/v/py"}
    s = spark_settings(ClusterShape(node_cores=2, node_memory_gb=4), environ=env)
    assert s.master == "spark://node1:7177" and s.mode == "cluster-cpu"
    assert s.env == {"SPARK_LOCAL_DIRS": "/scratch/job1", "PYSPARK_PYTHON": "/v/py"}
    assert s.conf["spark.executor.cores"] == "2" and s.conf["spark.cores.max"] == "2"
    assert "spark.master=spark://node1:7177" in s.describe()


def test_gpus_are_never_requested_in_local_mode():
    """spark-rapids: local mode schedules no GPUs (resource requests hang it, one GPU at most): a
    RAPIDS run without a standalone master is refused, a dry run plans the standalone cluster."""
    shape = ClusterShape(node_cores=16, node_memory_gb=64, gpus_per_node=1, rapids_jar=JAR, shuffle_partitions=64)
    with pytest.raises(PreprocError, match=r"^--rapids-jar: Spark's local mode \(local\[16\]\) schedules no GPUs"):
        spark_settings(shape, environ={})
    with pytest.raises(PreprocError, match="^--rapids-jar: Spark's local mode"):
        spark_settings(ClusterShape(node_cores=4, node_memory_gb=8, gpus_per_node=1, rapids_jar=JAR,
                                    master="local[4]"), environ={})
    from preproc.runtime.spark import PLANNED_MASTER
    s = spark_settings(shape, environ={}, plan_only=True)
    assert s.master == PLANNED_MASTER and s.mode == "cluster-gpu"
    assert s.conf["spark.executor.cores"] == "16" and s.conf["spark.task.resource.gpu.amount"] == "0.0625"
    assert not any(k.startswith("spark.driver.resource") for k in s.conf)
    assert s.conf["spark.sql.shuffle.partitions"] == "64"
    # the standalone master slurm/spark-standalone.sh exports makes the same shape a real GPU run
    s = spark_settings(shape, environ={"SPARK_MASTER_URL": "spark://n1:7077"})
    assert s.mode == "cluster-gpu" and s.conf["spark.executor.resource.gpu.amount"] == "1"
    # CPUs only: local mode as before
    assert spark_settings(ClusterShape(node_cores=16, node_memory_gb=64), environ={}).master == "local[16]"


@pytest.mark.parametrize("cores, amount", [(1, "1"), (2, "0.5"), (3, "0.333333"), (5, "0.2"), (7, "0.142857"),
                                           (32, "0.03125"), (100, "0.01"), (128, "0.0078125")])
def test_task_gpu_amount_gives_one_task_slot_per_executor_core(cores, amount):
    """spark.task.resource.gpu.amount = 1/spark.executor.cores (spark-rapids FAQ); Spark makes
    floor(1/amount) slots of a GPU, so the amount is rounded down, never up (0.1429 would give 6)."""
    import math

    from slurm.common.spark_layout import task_gpu_amount
    assert task_gpu_amount(cores) == amount
    assert math.floor(1 / float(amount)) == cores
    s = spark_settings(ClusterShape(node_cores=cores * 4, node_memory_gb=256, gpus_per_node=4, rapids_jar=JAR,
                                    master="spark://n1:7077"), environ={})
    assert s.conf["spark.executor.cores"] == str(cores) and s.conf["spark.task.resource.gpu.amount"] == amount


@pytest.mark.parametrize("shape, flag", [
    (dict(node_cores=0, node_memory_gb=4), "--node-cores"),
    (dict(node_cores=4, node_memory_gb=0.5), "--node-memory-gb"),
    (dict(node_cores=4, node_memory_gb=8, rapids_jar=JAR), "--rapids-jar"),
    (dict(node_cores=4, node_memory_gb=8, gpus_per_node=8, rapids_jar=JAR), "--node-cores"),
    (dict(node_cores=4, node_memory_gb=8, nodes=0), "--nodes"),
])
def test_bad_shapes_are_one_line_errors(shape, flag):
    with pytest.raises(PreprocError, match=f"^{flag}"):
        spark_settings(ClusterShape(**shape), environ={})


def test_shuffle_partitions_follow_the_input_size_on_a_cluster():
    shape = dict(node_cores=2, node_memory_gb=4, nodes=2, master="spark://n1:7077")
    assert spark_settings(ClusterShape(**shape, input_bytes=10 * 2**20), environ={}).conf[
        "spark.sql.shuffle.partitions"] == "8"  # tiny input: 2 x 4 cores, not 600
    assert spark_settings(ClusterShape(**shape, input_bytes=1300 * 2**30), environ={}).conf[
        "spark.sql.shuffle.partitions"] == "650"  # ~1.3 TB: about the reference's 600


def test_several_nodes_without_master_plan_a_standalone_cluster_or_are_refused():
    from preproc.runtime.spark import PLANNED_MASTER
    shape = ClusterShape(node_cores=80, node_memory_gb=1500, nodes=4)
    s = spark_settings(shape, environ={}, plan_only=True)
    assert s.master == PLANNED_MASTER and s.mode == "cluster-cpu"
    assert (s.executors_per_node, s.executor_cores) == (16, 5) and s.conf["spark.cores.max"] == "320"
    with pytest.raises(PreprocError, match="^--nodes: 4 nodes need a Spark standalone cluster"):
        spark_settings(shape, environ={})
    assert spark_settings(shape, environ={"SPARK_MASTER_URL": "spark://n1:7077"}).master == "spark://n1:7077"
