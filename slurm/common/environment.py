"""Every ``RECSYS_*`` environment variable the toolkit reads, with its meaning: one declaration,
so a site can look a variable up and a test can check that none is read without being declared
here (tests/test_environment.py scans the tree) and that docs/environment.md is this table.

Kinds: ``setting``: a user or site may set it; ``job``: the submission layer sets it for the code
inside a job (a contract between jobs/ and slurm/, recsys/, preproc/: setting it by hand is not
supported); ``test hook``: read by product code, set only by the tests (fault and slow-down
injection); ``test tooling``: read by tests/, bench/ or .ci/ only, never by the product.

Why the test hooks are variables and not pytest fixtures (monkeypatching in the test's process):
each one has to reach a process the test does not run in. ``RECSYS_FAULT_AT``/``RECSYS_FAULT_CMD``
kill or stall a ``recsys-submit`` the test starts as a command (the fault is its death);
``RECSYS_TEST_NONFINITE_SHARD_GRAD`` and ``RECSYS_TEST_UNSAMPLED_DRIFT`` reach the ranks of an
``mpirun``; the ``RECSYS_TEST_SLOW_*`` and ``RECSYS_TEST_SYNC_*`` hooks reach slurm/screen-rank.sh
inside a Slurm job. A hook that needs no process boundary belongs in a fixture, not here.

Pure data, importable from every layer (this is the shared leaf)."""
from __future__ import annotations

from typing import Dict, NamedTuple


class Variable(NamedTuple):
    kind: str
    read_by: str
    meaning: str


KINDS = ("setting", "job", "test hook", "test tooling")
_S, _J, _H, _T = KINDS

VARIABLES: Dict[str, Variable] = {
    # --- settings: the login node (recsys-submit) -------------------------------------------------
    "RECSYS_PROFILE": Variable(_S, "jobs/cli/parser.py", "the profile when `--profile` is not given"),
    "RECSYS_PROFILE_PATH": Variable(_S, "jobs/profiles/loader.py", "more profile directories (`:`-separated), after the built-in and ~/.config/recsys-submit/profiles"),
    "RECSYS_RUNS_DIR": Variable(_S, "jobs/runs/rundir.py", "where run and study directories go (default ./recsys-runs)"),
    "RECSYS_POLL_FIRST": Variable(_S, "jobs/polling.py", "seconds before the first scheduler poll of a watch (backed off from there)"),
    "RECSYS_POLL_MAX": Variable(_S, "jobs/polling.py", "the longest wait between two scheduler polls of a watch"),
    "RECSYS_STATUS_SOURCE": Variable(_S, "jobs/backends/slurm/poll.py", "`sacct` or `squeue`: where job states are read (default sacct with accounting)"),
    "RECSYS_WATCH_OUTAGE_S": Variable(_S, "jobs/status.py", "seconds a watch keeps polling through a scheduler outage before it gives up (900)"),
    "RECSYS_STUDY_START_GRACE_S": Variable(_S, "jobs/study/running/watch.py", "seconds a study watch treats a study without records yet as starting"),
    "RECSYS_SBATCH_RETRIES": Variable(_S, "jobs/backends/slurm/commands.py", "retries of an sbatch the controller did not answer"),
    "RECSYS_SBATCH_BACKOFF": Variable(_S, "jobs/backends/slurm/commands.py", "seconds before the first sbatch retry (doubled each time)"),
    "RECSYS_MAX_ARRAY_SIZE": Variable(_S, "jobs/backends/slurm/commands.py", "the cluster's MaxArraySize, instead of asking scontrol"),
    "RECSYS_MAX_RECORD_MB": Variable(_S, "jobs/runs/atomic.py", "the largest JSON record read from a run directory (64 MiB)"),
    "RECSYS_MIN_FREE_MB": Variable(_S, "jobs/runs/rundir.py", "free space a runs directory must have before a submission writes (0: no check)"),
    # --- settings: the engine, the job and the installers --------------------------------------------
    "RECSYS_DEVICE": Variable(_S, "recsys/runtime/devices.py", "`auto`, `cpu` or `gpu` when recsys-train's --device is not given (the ci profile sets cpu)"),
    "RECSYS_EMBEDDING_MEMORY_GB": Variable(_S, "recsys/configuration/train_config.py", "a rank's memory budget for embedding tables (a profile's job environment sets it)"),
    "RECSYS_HANG_TIMEOUT": Variable(_S, "recsys/monitoring/watchdog.py", "seconds without a step before the watchdog ends a rank (a profile's defaults.hang_timeout)"),
    "RECSYS_STARTUP_TIMEOUT": Variable(_S, "recsys/monitoring/watchdog.py", "seconds a rank may take to its first step (a profile's defaults.startup_timeout)"),
    "RECSYS_ALLOW_UNSUPPORTED_TF": Variable(_S, "recsys/runtime/tfcompat.py", "1: run on a TensorFlow outside the supported range (warned)"),
    "RECSYS_HW_SAMPLE": Variable(_S, "slurm/job.sbatch.tmpl", "0: no hardware sampler in the job (a profile's defaults.hw_sample)"),
    "RECSYS_MIN_MEMLOCK_KB": Variable(_S, "slurm/node-check.sh", "the locked-memory limit InfiniBand needs, checked per node (else: unlimited)"),
    "RECSYS_BIND_MODE": Variable(_S, "slurm/bind.sh", "bind.sh's --mode default (exclusive)"),
    "RECSYS_BIND_HT": Variable(_S, "slurm/bind.sh", "bind.sh's --ht default: 1 binds the hyper-thread siblings too"),
    "RECSYS_BIND_STRICT": Variable(_S, "slurm/bind.sh", "0: warn and run unbound when the host cannot honour the binding"),
    "RECSYS_BIND_VERBOSE": Variable(_S, "slurm/bind.sh", "1: print each rank's binding line"),
    "RECSYS_CLUSTER_START_SECONDS": Variable(_S, "slurm/dask-cluster.sh, slurm/spark-standalone.sh", "seconds to wait for an in-job Dask or Spark cluster to start (120)"),
    "RECSYS_DASK_RMM_POOL_SIZE": Variable(_S, "preproc/runtime/dask_cluster.py", "RMM pool per GPU worker of an in-job Dask cluster"),
    "RECSYS_VENV": Variable(_S, "install/user-env.sh", "the venv user-env.sh builds"),
    "RECSYS_WHEEL_CACHE": Variable(_S, "install/user-env.sh", "where user-env.sh caches the Horovod wheel it builds"),
    "RECSYS_HOROVOD_GPU": Variable(_S, "install/user-env.sh", "0: build Horovod without NCCL even where a GPU stack is installed"),
    # --- set by the submission layer for the job -----------------------------------------------------
    "RECSYS_RUN_DIR": Variable(_J, "slurm/job.sbatch.tmpl, recsys/, preproc/", "the run directory of the job"),
    "RECSYS_SLURM_DIR": Variable(_J, "slurm/job.sbatch.tmpl", "the toolkit's slurm/ directory (in-job helpers) as the job sees it"),
    "RECSYS_JOB_KEY": Variable(_J, "slurm/job.sbatch.tmpl", "the job's key in its run (main, evaluate, ...)"),
    "RECSYS_JOB_TAG": Variable(_J, "slurm/job.sbatch.tmpl", "the job's tag (its Slurm id, or local<pid>): with the key, its log names"),
    "RECSYS_JOB_PROFILE": Variable(_J, "recsys/monitoring/provenance.py", "the profile the job was rendered from (recorded in the engine's provenance)"),
    "RECSYS_JOB_PROFILE_SHA256": Variable(_J, "recsys/monitoring/provenance.py", "that profile's content hash"),
    "RECSYS_TASK_INDEX": Variable(_J, "preproc/, jobs/cli/parser.py", "the index of an array task or a task of a multi-task step"),
    "RECSYS_TASK_COUNT": Variable(_J, "preproc/", "the number of those tasks"),
    "RECSYS_NNODES": Variable(_J, "slurm/bind.sh", "the job's node count"),
    "RECSYS_STEP_NODES": Variable(_J, "slurm/job.sbatch.tmpl, slurm/node-check.sh", "the nodes a study point's step runs on inside an allocation"),
    "RECSYS_PYTHON": Variable(_J, "slurm/dask-cluster.sh, slurm/spark-standalone.sh", "the Python interpreter of the job (a profile's python:, else the submitter's)"),
    "RECSYS_CONTAINER_SRUN_FLAGS": Variable(_J, "slurm/*.sh", "the srun flags that start a step in the profile's container (pyxis)"),
    "RECSYS_HANG_MARKER": Variable(_J, "recsys/monitoring/watchdog.py", "the file the watchdog creates when it ends a hung rank (the job script reports it)"),
    "RECSYS_RANK_LOG_PREFIX": Variable(_J, "jobs/backends/local/launch.py", "the local backend's per-rank log name prefix"),
    "RECSYS_BIND_CPUS": Variable(_J, "slurm/bind.sh, slurm/hwsample.py", "per local rank, its CPU list (the profile's binding)"),
    "RECSYS_BIND_CORES": Variable(_J, "slurm/bind.sh", "per local rank, its physical cores"),
    "RECSYS_BIND_GPUS": Variable(_J, "slurm/bind.sh", "per local rank, its GPU"),
    "RECSYS_BIND_MEMS": Variable(_J, "slurm/bind.sh", "per local rank, its memory node"),
    "RECSYS_BIND_NICS": Variable(_J, "slurm/bind.sh", "per local rank, its NIC"),
    "RECSYS_BIND_NUMA": Variable(_J, "slurm/bind.sh", "per local rank, its NUMA node"),
    "RECSYS_HT_OFFSET": Variable(_J, "slurm/bind.sh", "the CPU-number offset of the hyper-thread siblings (empty without HT)"),
    "RECSYS_DASK_SCHEDULER_FILE": Variable(_J, "preproc/runtime/dask_cluster.py", "the in-job Dask cluster's scheduler file (slurm/dask-cluster.sh)"),
    "RECSYS_DASK_GPUS": Variable(_J, "preproc/runtime/dask_cluster.py", "GPUs per Dask worker node of that cluster"),
    "RECSYS_DASK_NODES": Variable(_J, "slurm/dask-cluster.sh", "the nodes of that cluster"),
    "RECSYS_DASK_LOG_DIR": Variable(_J, "slurm/dask-cluster.sh", "where its daemons log"),
    "RECSYS_SPARK_NODES": Variable(_J, "preproc/runtime/spark.py", "the nodes of the in-job Spark standalone cluster (slurm/spark-standalone.sh)"),
    "RECSYS_SPARK_GPUS": Variable(_J, "preproc/runtime/spark.py", "GPUs per Spark worker"),
    "RECSYS_SPARK_WORKER_CORES": Variable(_J, "preproc/runtime/spark.py", "cores per Spark worker"),
    "RECSYS_SPARK_WORKER_MEMORY_GB": Variable(_J, "preproc/runtime/spark.py", "memory per Spark worker"),
    "RECSYS_SPARK_LOG_DIR": Variable(_J, "slurm/spark-standalone.sh", "where the Spark daemons log"),
    "RECSYS_NODE_CHECK_IB_ROOT": Variable(_J, "slurm/node-check.sh", "where the node check looks for InfiniBand devices (/sys/class/infiniband)"),
    # --- test hooks: read by product code, set only by tests ----------------------------------------
    "RECSYS_FAULT_AT": Variable(_H, "jobs/faultpoints.py", "NAME[:N]: a fault at the N-th arrival at a named point (tests/faults)"),
    "RECSYS_FAULT_CMD": Variable(_H, "jobs/faultpoints.py", "the command a fault point runs instead of killing the process"),
    "RECSYS_TEST_NONFINITE_SHARD_GRAD": Variable(_H, "recsys/engine", "makes one rank's table-shard gradient non-finite (the guard's test)"),
    "RECSYS_TEST_UNSAMPLED_DRIFT": Variable(_H, "recsys/engine", "makes replicas drift in weights the sampled digest does not cover"),
    "RECSYS_TEST_SLOW_NODE": Variable(_H, "jobs/study/running/screen.py, slurm/screen-rank.sh", "the node study screen's test slows on purpose"),
    "RECSYS_TEST_SLOW_PERIOD_MS": Variable(_H, "slurm/screen-rank.sh", "the slowed node's stop-and-go period"),
    "RECSYS_TEST_SLOW_RUN_MS": Variable(_H, "slurm/screen-rank.sh", "the slowed node's running share of that period"),
    "RECSYS_TEST_SYNC_COUNT": Variable(_H, "slurm/screen-rank.sh", "ranks the screen's test holds together before timing"),
    "RECSYS_TEST_SYNC_S": Variable(_H, "slurm/screen-rank.sh", "the longest that hold (120 s)"),
    # --- test tooling: tests/, bench/, .ci/ only -----------------------------------------------------
    "RECSYS_TEST_WORKERS": Variable(_T, "tests/run.sh", "pytest-xdist workers of the suite (2; 0: one process)"),
    "RECSYS_FILE_SECONDS": Variable(_T, "tests/file_order.py", "a path: write every test file's seconds of this run there"),
    "RECSYS_UPDATE_GOLDEN": Variable(_T, "tests/jobs/test_golden_render.py", "1: rewrite the golden renders"),
    "RECSYS_TEST_USER_INSTALL": Variable(_T, "tests/test_user_install.py", "1: run the user install end to end as nobody"),
    "RECSYS_DE_SOURCE": Variable(_T, "tests/recsys", "a checkout of distributed-embeddings for the tests that run its layers"),
    "RECSYS_FAULT_RESULTS": Variable(_T, "tests/faults", "the file the fault tests' results table is collected in"),
    "RECSYS_FAULT_KILL_TRIALS": Variable(_T, "tests/faults/test_train_checkpoint.py", "kills of a checkpoint writer to try"),
    "RECSYS_PYXIS_STANDIN_NS": Variable(_T, "tests/pyxis_standin", "set inside the pyxis stand-in's namespace"),
    "RECSYS_COMPAT_CACHE": Variable(_T, "tests/compat/run.sh", "where the compatibility matrix keeps its venvs"),
    "RECSYS_COMPAT_OUT": Variable(_T, "tests/compat/run.sh", "where it writes its results"),
    "RECSYS_COMPAT_PYTHON": Variable(_T, "tests/compat/run.sh", "the Python it builds them with"),
    "RECSYS_RUN_ROOT": Variable(_T, "tests/docs/test_examples.py", "removed from the docs examples' environment"),
    "RECSYS_BENCH_CALLS": Variable(_T, "bench/bench_submit.py", "the file the submission benchmark's command stand-ins count calls in"),
}

# Names the tree writes that are not variables of their own: prefixes of a family, and values the
# tests put into a profile's `env:` (a profile's environment passes any name through).
NOT_VARIABLES = frozenset({"RECSYS_", "RECSYS_BIND", "RECSYS_BIND_", "RECSYS_SPARK", "RECSYS_SPARK_", "RECSYS_HT",
                           "RECSYS_SECRET", "RECSYS_SITE_MARK", "RECSYS_PROFILE_EDITED"})


def markdown_table() -> str:
    """docs/environment.md's table: one row per variable, by kind then name."""
    rows = ["| variable | kind | read by | meaning |", "|---|---|---|---|"]
    for kind in KINDS:
        for name in sorted(n for n, v in VARIABLES.items() if v.kind == kind):
            v = VARIABLES[name]
            rows.append(f"| `{name}` | {kind} | {v.read_by} | {v.meaning} |")
    return "\n".join(rows) + "\n"
