"""Root fixtures: a real Slurm cluster on this host, started once per test session, and a local Spark.

The cluster is slurm/dev/local-cluster.sh: munged, slurmctld and one slurmd per
emulated node (4 nodes x 2 CPUs x 2 fake GPUs as GRES), in a fresh state
directory with private ports, so several test sessions can run side by side.
The `ci` cluster profile describes exactly this cluster.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.file_order import RECORD_ENV, load_seconds, longest_first, write_seconds
from tests.mpi_env import MPI_ENV

REPO = Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = REPO / "slurm" / "dev" / "local-cluster.sh"
TERMINAL_STATES = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
    "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT",
}


@dataclass
class SlurmCluster:
    """A running local cluster; pass `.env` to every subprocess that talks to it."""

    directory: Path
    accounting: bool
    nodes: list = field(default_factory=lambda: [f"node{i}" for i in range(1, 5)])
    partition: str = "debug"
    gpus_per_node: int = 2
    cpus_per_node: int = 2
    env: dict = field(default_factory=dict)

    def run(self, args, check=False, timeout=120, **kw):
        return subprocess.run(args, env=kw.pop("env", self.env), text=True,
                              capture_output=True, check=check, timeout=timeout, **kw)

    def job_state(self, jobid) -> str:
        """State of a job (squeue while it is known there, else scontrol)."""
        out = self.run(["squeue", "-h", "-j", str(jobid), "-o", "%T"]).stdout.split()
        if out:
            return out[0]
        res = self.run(["scontrol", "-o", "show", "job", str(jobid)])
        for tok in res.stdout.split():
            if tok.startswith("JobState="):
                return tok.split("=", 1)[1]
        return "UNKNOWN"

    def wait_job(self, jobid, timeout: float = 120) -> str:
        """Poll until the job (all tasks of an array) reaches a terminal state."""
        deadline = time.monotonic() + timeout
        delay = 0.1
        while True:
            states = self.run(["squeue", "-h", "-j", str(jobid), "-o", "%T"]).stdout.split()
            if not states:
                return self.job_state(jobid)
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {jobid} still {states} after {timeout}s")
            time.sleep(delay)
            delay = min(delay * 1.5, 1.0)

    def down(self):
        subprocess.run(["bash", str(CLUSTER_SCRIPT), "down", "--dir", str(self.directory)],
                       env=self.env, capture_output=True, text=True, timeout=120)


def _start_cluster(directory: Path, accounting: bool, extra=()) -> SlurmCluster:
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        pytest.skip("Slurm is not installed here: run `bash tests/install.sh` (apt: slurm-wlm, munge)")
    directory.mkdir(parents=True, exist_ok=True)
    args = ["bash", str(CLUSTER_SCRIPT), "up", "--dir", str(directory)]
    if accounting:
        args.append("--accounting")
    args += list(extra)
    # up to 300 s of it waiting for another cluster's bring-up (local-cluster.sh's port lock)
    res = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise RuntimeError(f"local Slurm cluster failed to start:\n{res.stderr[-3000:]}")
    env = dict(os.environ)
    env.update(MPI_ENV)
    env["SLURM_CONF"] = str(directory / "etc" / "slurm.conf")
    # the GRES GPUs are fake device files (Slurm sets CUDA_VISIBLE_DEVICES for them): every
    # recsys-train launched here is a CPU run (recsys.runtime.devices; the ci profile says the same)
    env["RECSYS_DEVICE"] = "cpu"
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    for var in [k for k in env if k.startswith(("SLURM_JOB", "SLURM_STEP", "SLURM_PROCID"))]:
        env.pop(var)
    return SlurmCluster(directory=directory, accounting=accounting, env=env)


@pytest.fixture(autouse=True)
def _umask_restored():
    """Each test ends with the umask it began with: a runs_group directory sets the process's
    umask (jobs.runs.rundir.group_umask) for the commands run in-process, which must not leak
    into the next test."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    os.umask(before)


def _controller(config) -> bool:
    """The process that reports the run: pytest itself, or pytest-xdist's controller (not a worker)."""
    return not hasattr(config, "workerinput")


def pytest_configure(config):
    """One fault-results file per run (tests/faults), emptied once before any test: by pytest, or
    under pytest-xdist by the controller before its workers start; every worker appends to it."""
    if _controller(config):
        from tests.faults.record import RESULTS_ENV, results_path
        path = results_path()
        path.unlink(missing_ok=True)
        os.environ[RESULTS_ENV] = str(path)


_FILE_SECONDS: dict = {}
FILE_TABLE_ROWS = 30


def pytest_runtest_logreport(report):
    """Seconds per test file (setup, call and teardown; under xdist the controller gets every
    worker's reports): where the suite's time goes, printed at the end."""
    path = report.nodeid.split("::", 1)[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_collection_modifyitems(config, items):
    """The longest test files first (tests/file_order.py), so that the workers end together."""
    items[:] = longest_first(items, lambda item: item.nodeid, load_seconds())


def _file_table(terminalreporter):
    total = sum(_FILE_SECONDS.values())
    if not total:
        return
    terminalreporter.section(f"time per test file (top {FILE_TABLE_ROWS}; {total:.0f} s in all, "
                             f"summed over the workers)")
    for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:FILE_TABLE_ROWS]:
        terminalreporter.write_line(f"{seconds:8.1f} s {100 * seconds / total:5.1f} %  {path}")


@pytest.hookimpl(trylast=True)         # after the slowest durations: the end of CI's output
def pytest_terminal_summary(terminalreporter, config):
    """The reliability table of the faults this run injected, and the time per test file,
    printed once (by the controller)."""
    if _controller(config):
        _file_table(terminalreporter)
        if os.environ.get(RECORD_ENV) and _FILE_SECONDS:
            write_seconds(Path(os.environ[RECORD_ENV]), _FILE_SECONDS,
                          run=time.strftime("%Y-%m-%d", time.gmtime()))
        from tests.faults.record import load
        from tests.faults.report import markdown
        results = load()
        if results:
            terminalreporter.section("fault injection (tests/faults)")
            terminalreporter.write_line(markdown(results))


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """The local Slurm cluster without accounting (sacct answers with an error)."""
    cluster = _start_cluster(tmp_path_factory.mktemp("slurm"), accounting=False)
    yield cluster
    cluster.down()


# the accounting cluster forgets finished jobs soon (MinJobAge), so the studies' tests can see
# what a poll does once Slurm no longer knows a job
ACCT_MIN_JOB_AGE = 10


@pytest.fixture(scope="session")
def slurm_cluster_acct(tmp_path_factory):
    """The local Slurm cluster with MariaDB + slurmdbd, so `sacct` works; one per test session
    (its bring-up is the slow one), forgetting finished jobs after ACCT_MIN_JOB_AGE s."""
    cluster = _start_cluster(tmp_path_factory.mktemp("slurm-acct"), accounting=True,
                             extra=["--min-job-age", str(ACCT_MIN_JOB_AGE)])
    yield cluster
    cluster.down()


@pytest.fixture(scope="session")
def venv_python() -> str:
    """The interpreter running the tests; jobs on the local cluster use it too."""
    return sys.executable


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


# Spark, for the preprocessing tests (tests/preproc) and the preprocessing faults (tests/faults):
# one local[2] SparkSession per test session (the JVM starts once, about 4-8 s), built through
# preproc.runtime.spark.get_session with the settings spark_settings derives for a 2-core, 4 GiB "node",
# so the tests exercise the CLI's code path; pipelines called from tests get it back from getOrCreate.
@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    pytest.importorskip("pyspark", reason="PySpark is not installed (pip install .[preproc])")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime (java on PATH or JAVA_HOME) for PySpark")
    from preproc.runtime.spark import ClusterShape, get_session, spark_settings

    scratch = tmp_path_factory.mktemp("spark-local")
    settings = spark_settings(ClusterShape(node_cores=2, node_memory_gb=4, local_dirs=str(scratch),
                                           shuffle_partitions=4, master="local[2]"))
    settings.conf.update({"spark.ui.enabled": "false", "spark.sql.adaptive.enabled": "true",
                          "spark.default.parallelism": "4"})
    session = get_session(settings, "recsys-preproc-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def criteo_reference(spark, tmp_path_factory):
    """(raw days, reference output) that the Criteo Slurm tests and the preprocessing fault tests
    compare with: 3000 generated rows over 3 days and one uninterrupted in-process run with the
    reference rules (stages kept, for the fault tests' damaged-shard cases); built once per session."""
    from preproc.criteo import pipeline as criteo
    from preproc.criteo.generate import generate
    from preproc.criteo.layout import day_files, parse_thresholds
    from preproc.dataio.output import input_files

    base = tmp_path_factory.mktemp("criteo_reference")
    raw = base / "raw"
    generate(raw, rows=3000, days=3, seed=11)
    found = day_files(input_files(raw))
    files = [(idx, day, path) for idx, (day, path) in enumerate(found)]
    reference = base / "reference"
    criteo.run(spark, files, found[-1][0], parse_thresholds("2"), str(reference), keep_stages=True)
    return raw, reference
