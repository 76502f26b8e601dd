"""Spark configuration derived from the node shape, and the session built from it.

``spark_settings(shape)`` is a pure function (no pyspark import) from the cluster
shape (nodes, cores and memory per node, GPUs per node, RAPIDS jar, scratch dirs,
master URL) to the master URL, the ``spark.*`` properties and the environment.
The stages log it, and ``--dry-run`` prints it and exits before Spark starts.

Sizing rules (the reference runs of hpc-facts.md section 6 fall out of them):

* Master: ``--spark-master``, else ``$SPARK_MASTER_URL`` (exported by
  slurm/spark-standalone.sh), else ``local[<node cores>]`` for one node. Several
  ``--nodes`` without a master: ``--dry-run`` plans the standalone cluster (master
  ``PLANNED_MASTER``), a real run is refused.
* Executors per node (cluster mode): with GPUs and a RAPIDS jar, one executor per
  GPU with ``node_cores // gpus`` cores (DGX-2: 80 cores, 16 GPUs -> 16 x 5;
  DGX A100: 256 cores, 8 GPUs -> 8 x 32); on CPUs, 5-core executors
  (``node_cores // 5``, at least one executor; 80 cores -> 16 x 5).
* Memory: the driver gets ``min(32, 5 % of node memory)`` GiB (at least 1). Of
  the node memory, ``NODE_MEMORY_SHARE`` (85 %, slurm/common/node_memory.py) minus the driver is
  shared by the executors of the node; each executor's share is split 90 % heap
  (``spark.executor.memory``) and 10 % ``memoryOverhead``, plus the RAPIDS pinned pool
  (``min(16, 10 % of share)`` GiB) in the overhead when on GPUs. In local mode the driver JVM does all the work
  and gets 50 % of the node memory (Python workers need the rest).
* ``spark.sql.shuffle.partitions``: on a cluster ``max(2 x total cores, input
  bytes / 2 GiB)`` when the stage knows its input size (the reference's 600 for
  the ~1.3 TB Criteo text is about 2 GiB each), else ``max(600, 2 x total
  cores)``; ``2 x cores`` locally. Too many partitions for a small input costs a
  task per partition per shuffle.
  ``spark.sql.files.maxPartitionBytes=1g`` on a cluster (the reference), Spark's
  default locally. ``spark.network.timeout=1800s``, ``spark.locality.wait=0s``.
* Python: executors run ``$PYSPARK_PYTHON``, else the driver's interpreter
  (exported as ``PYSPARK_PYTHON``; on a cluster it must exist at that path on every node).
* Scratch: ``--local-dirs`` else ``$SPARK_LOCAL_DIRS`` else Spark's default
  (``/tmp``); exported as ``SPARK_LOCAL_DIRS`` and set as ``spark.local.dir``.
  Shuffle of the full Criteo run needs about 3 TB there.
* GPUs without a RAPIDS jar: a CPU plan (logged as such). With the jar:
  ``spark.plugins=com.nvidia.spark.SQLPlugin``, ``spark.jars``, and the executor
  cores and executor/task GPU amounts of ``slurm/common/spark_layout.py`` (the one rule,
  which the submission layer also writes into the job script: one GPU per
  executor, task amount ``1 / executor cores``), ``spark.rapids.sql.concurrentGpuTasks=2``,
  the pinned pool above, and the GPU discovery script shipped as
  ``preproc/runtime/gpu-discovery.sh``.
* GPUs are never requested in local mode: Spark does not schedule GPUs there
  (spark-rapids maintainers, NVIDIA/spark-rapids#4873, #8651: resource requests
  hang it, and it uses one GPU at most). A RAPIDS run needs a standalone master
  (``slurm/spark-standalone.sh``, which ``recsys-submit preprocess`` starts for it
  even on one node); without one it is refused, and ``--dry-run`` plans that
  standalone cluster (``PLANNED_MASTER``).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import sys
from pathlib import Path

from preproc.errors import PreprocError
from slurm.common.node_memory import NODE_MEMORY_SHARE
from slurm.common.spark_layout import gpu_executors, gpu_resource_conf

log = logging.getLogger("preproc.spark")

DISCOVERY_SCRIPT = str(Path(__file__).resolve().with_name("gpu-discovery.sh"))
CPU_EXECUTOR_CORES = 5
PARTITION_INPUT_BYTES = 2 * 2**30
# The master of a --dry-run plan for several nodes when no URL is known yet (the standalone
# cluster that slurm/spark-standalone.sh starts on the job's first node).
PLANNED_MASTER = "spark://<first node of the job>:7077"  # the reference's 600 partitions for ~1.3 TB of raw Criteo text


@dataclasses.dataclass(frozen=True)
class ClusterShape:
    """What the user (or the submitting profile) says about the machines."""

    node_cores: int
    node_memory_gb: float
    nodes: int = 1
    gpus_per_node: int = 0
    rapids_jar: str | None = None
    local_dirs: str | None = None
    master: str | None = None
    shuffle_partitions: int | None = None
    input_bytes: int | None = None


@dataclasses.dataclass(frozen=True)
class SparkSettings:
    """The effective configuration: master URL, spark properties, environment."""

    master: str
    conf: dict
    env: dict
    mode: str  # "local-cpu", "cluster-cpu", "cluster-gpu" (never GPUs in local mode)
    executors_per_node: int
    executor_cores: int

    def describe(self) -> str:
        """Human/grep-friendly listing, one setting per line (what --dry-run prints)."""
        lines = [f"spark.master={self.master}", f"# mode={self.mode} executors_per_node={self.executors_per_node}"
                 f" executor_cores={self.executor_cores}"]
        lines += [f"{key}={value}" for key, value in sorted(self.conf.items())]
        lines += [f"env {key}={value}" for key, value in sorted(self.env.items())]
        return "\n".join(lines)


def _gib(value: float) -> str:
    return f"{max(1, int(value))}g"


def spark_settings(shape: ClusterShape, environ: dict | None = None, plan_only: bool = False) -> SparkSettings:
    """Derive the Spark configuration from the cluster shape (pure; see module docstring).

    ``plan_only`` (--dry-run): several nodes without a master URL are planned as the
    standalone cluster slurm/spark-standalone.sh would start (master ``PLANNED_MASTER``);
    a real run refuses them (one machine's local mode would ignore --nodes)."""
    environ = os.environ if environ is None else environ
    if shape.node_cores < 1:
        raise PreprocError(f"--node-cores: must be >= 1, got {shape.node_cores}")
    if shape.node_memory_gb < 1:
        raise PreprocError(f"--node-memory-gb: must be >= 1, got {shape.node_memory_gb}")
    if shape.nodes < 1:
        raise PreprocError(f"--nodes: must be >= 1, got {shape.nodes}")
    if shape.gpus_per_node < 0:
        raise PreprocError(f"--gpus-per-node: must be >= 0, got {shape.gpus_per_node}")
    if shape.rapids_jar and not shape.gpus_per_node:
        raise PreprocError("--rapids-jar: given but --gpus-per-node is 0")
    if shape.gpus_per_node and shape.node_cores < shape.gpus_per_node:
        raise PreprocError(f"--node-cores: {shape.node_cores} cores cannot feed {shape.gpus_per_node} GPUs")
    master = shape.master or environ.get("SPARK_MASTER_URL")
    gpu = bool(shape.gpus_per_node and shape.rapids_jar)
    if not master and shape.nodes > 1:
        if not plan_only:
            raise PreprocError(f"--nodes: {shape.nodes} nodes need a Spark standalone cluster: give --spark-master "
                               f"URL, or submit with `recsys-submit preprocess --mode multinode` (its "
                               f"slurm/spark-standalone.sh exports $SPARK_MASTER_URL)")
        master = PLANNED_MASTER
    if not master and gpu and plan_only:
        master = PLANNED_MASTER      # what recsys-submit starts for a RAPIDS run on one node
    master = master or f"local[{shape.node_cores}]"
    local = master.startswith("local")
    if local and gpu:
        raise PreprocError(f"--rapids-jar: Spark's local mode ({master}) schedules no GPUs (it hangs on GPU "
                           "requests and uses one GPU at most): run under a standalone master, e.g. "
                           "`recsys-submit preprocess` (starts slurm/spark-standalone.sh on the job's node), "
                           "slurm/spark-standalone.sh --gpus-per-node G -- <this command>, or --spark-master URL")
    if shape.gpus_per_node and not shape.rapids_jar:
        log.info("%d GPUs per node but no RAPIDS jar (--rapids-jar): CPU plan", shape.gpus_per_node)

    conf: dict[str, str] = {
        "spark.network.timeout": "1800s",
        "spark.locality.wait": "0s",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # let adaptive execution coalesce the shuffle partitions of cached plans too
        "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
    }
    driver_gb = min(32.0, max(1.0, 0.05 * shape.node_memory_gb))
    if local:
        executors, cores = 1, shape.node_cores
        conf["spark.driver.memory"] = _gib(0.5 * shape.node_memory_gb)
        partitions = 2 * shape.node_cores
        share_gb = 0.5 * shape.node_memory_gb
    else:
        if gpu:
            executors, cores = gpu_executors(shape.node_cores, shape.gpus_per_node)
        else:
            cores = min(CPU_EXECUTOR_CORES, shape.node_cores)
            executors = max(1, shape.node_cores // cores)
        share_gb = max(1.0, (NODE_MEMORY_SHARE * shape.node_memory_gb - driver_gb) / executors)
        heap_gb = 0.9 * share_gb
        overhead_gb = share_gb - int(heap_gb)
        conf.update({
            "spark.driver.memory": _gib(driver_gb),
            "spark.executor.cores": str(cores),
            "spark.executor.memory": _gib(heap_gb),
            "spark.cores.max": str(shape.nodes * executors * cores),
            "spark.sql.files.maxPartitionBytes": "1g",
        })
        if gpu:
            overhead_gb += min(16.0, 0.1 * share_gb)
        conf["spark.executor.memoryOverhead"] = _gib(overhead_gb)
        total_cores = shape.nodes * executors * cores
        if shape.input_bytes is None:
            partitions = max(600, 2 * total_cores)
        else:
            partitions = max(2 * total_cores, math.ceil(shape.input_bytes / PARTITION_INPUT_BYTES))
    conf["spark.sql.shuffle.partitions"] = str(shape.shuffle_partitions or partitions)
    if gpu:
        pinned = _gib(min(16.0, 0.1 * share_gb))
        conf.update({
            "spark.plugins": "com.nvidia.spark.SQLPlugin",
            "spark.jars": shape.rapids_jar,
            "spark.rapids.sql.enabled": "true",
            "spark.rapids.sql.concurrentGpuTasks": "2",
            "spark.rapids.memory.pinnedPool.size": pinned,
            "spark.executor.resource.gpu.discoveryScript": DISCOVERY_SCRIPT,
            "spark.rapids.sql.explain": "NOT_ON_GPU",
        })
        conf.update(gpu_resource_conf(shape.node_cores, shape.gpus_per_node))
    # executors run the same interpreter as the driver (a shared venv/container path on clusters)
    env = {"PYSPARK_PYTHON": environ.get("PYSPARK_PYTHON") or sys.executable}
    local_dirs = shape.local_dirs or environ.get("SPARK_LOCAL_DIRS")
    if local_dirs:
        env["SPARK_LOCAL_DIRS"] = local_dirs
        conf["spark.local.dir"] = local_dirs
    mode = f"{'local' if local else 'cluster'}-{'gpu' if gpu else 'cpu'}"
    return SparkSettings(master=master, conf=conf, env=env, mode=mode,
                         executors_per_node=executors, executor_cores=cores)


def detect_node() -> tuple[int, float]:
    """(usable cores, memory GiB) of this process: its CPU affinity mask, and the Slurm
    allocation's memory (``SLURM_MEM_PER_NODE``, MiB) capped by /proc/meminfo."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        cores = os.cpu_count() or 1
    memory_gb = 4.0
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    memory_gb = int(line.split()[1]) / 2**20
                    break
    except OSError:  # pragma: no cover
        pass
    slurm_mb = os.environ.get("SLURM_MEM_PER_NODE", "")
    if slurm_mb.isdigit() and int(slurm_mb) > 0:
        memory_gb = min(memory_gb, int(slurm_mb) / 1024)
    return cores, memory_gb


def add_spark_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster-shape flags of CONTRACT.md plus --dry-run."""
    group = parser.add_argument_group("spark", "cluster shape; Spark settings are derived from it")
    group.add_argument("--spark-master", default=None,
                       help="master URL (default: $SPARK_MASTER_URL, else local[<node cores>])")
    group.add_argument("--node-cores", type=int, default=None, help="cores per node (default: this machine's)")
    group.add_argument("--node-memory-gb", type=float, default=None,
                       help="memory per node in GiB (default: this machine's)")
    group.add_argument("--gpus-per-node", type=int, default=None,
                       help="GPUs per node, RAPIDS only with --rapids-jar (default: $RECSYS_SPARK_GPUS, else 0)")
    group.add_argument("--rapids-jar", default=None, help="RAPIDS accelerator jar: enables the GPU settings")
    group.add_argument("--nodes", type=int, default=None,
                       help="nodes of the standalone cluster (default: $RECSYS_SPARK_NODES, else 1)")
    group.add_argument("--local-dirs", default=None, help="Spark scratch dirs (default: $SPARK_LOCAL_DIRS)")
    group.add_argument("--shuffle-partitions", type=int, default=None, help="override spark.sql.shuffle.partitions")
    group.add_argument("--spark-conf", action="append", default=[], metavar="KEY=VALUE",
                       help="extra spark property (repeatable; wins over the derived ones)")
    group.add_argument("--dry-run", action="store_true",
                       help="print the Spark configuration and the plan for the flags given and start nothing; "
                            "checks only the flags (the input, output and jar need not exist yet)")


def settings_from_args(args: argparse.Namespace, environ: dict | None = None,
                       input_bytes: int | None = None) -> SparkSettings:
    """SparkSettings for parsed ``add_spark_arguments`` flags.

    Unset flags come from what slurm/spark-standalone.sh exports (``RECSYS_SPARK_NODES``,
    ``RECSYS_SPARK_WORKER_CORES``, ``RECSYS_SPARK_WORKER_MEMORY_GB``, ``RECSYS_SPARK_GPUS``),
    else from this machine.
    """
    environ = os.environ if environ is None else environ
    cores, memory_gb = detect_node()

    def pick(flag, variable, fallback, kind):
        if flag is not None:
            return flag
        value = environ.get(variable)
        if value in (None, ""):
            return fallback
        try:
            return kind(value)
        except ValueError:
            raise PreprocError(f"${variable}: {value!r} is not a number") from None

    dry_run = bool(getattr(args, "dry_run", False))
    if args.rapids_jar and not os.path.isfile(args.rapids_jar) and not dry_run:  # a plan names it only
        raise PreprocError(f"--rapids-jar: {args.rapids_jar}: no such file")
    shape = ClusterShape(node_cores=pick(args.node_cores, "RECSYS_SPARK_WORKER_CORES", cores, int),
                         node_memory_gb=pick(args.node_memory_gb, "RECSYS_SPARK_WORKER_MEMORY_GB", memory_gb, float),
                         nodes=pick(args.nodes, "RECSYS_SPARK_NODES", 1, int),
                         gpus_per_node=pick(args.gpus_per_node, "RECSYS_SPARK_GPUS", 0, int),
                         rapids_jar=args.rapids_jar, local_dirs=args.local_dirs, master=args.spark_master,
                         shuffle_partitions=args.shuffle_partitions, input_bytes=input_bytes)
    settings = spark_settings(shape, environ, plan_only=dry_run)
    for item in args.spark_conf:
        key, sep, value = item.partition("=")
        if not sep or not key.startswith("spark."):
            raise PreprocError(f"--spark-conf: expected spark.KEY=VALUE, got {item!r}")
        settings.conf[key] = value
    return settings


def get_session(settings: SparkSettings, app_name: str):
    """Build (or reuse) the SparkSession for ``settings``; logs the effective configuration.

    Settings that only apply at JVM start (driver memory) are ignored by Spark when a
    session already exists in this process (the tests share one).
    """
    from pyspark.sql import SparkSession

    os.environ.update(settings.env)
    log.info("spark configuration:\n%s", settings.describe())
    builder = SparkSession.builder.appName(app_name).master(settings.master)
    for key, value in settings.conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session


def session_or_plan(settings: SparkSettings, app_name: str, dry_run: bool, plan: list):
    """For --dry-run print the effective configuration and the plan and return None;
    otherwise start (or reuse) the session. Every stage command goes through here."""
    if dry_run:
        print(settings.describe())
        for line in plan:
            print(f"# {line}")
        return None
    return get_session(settings, app_name)
