"""The `provenance` of a summary (recsys.monitoring.provenance), read in this process: every documented key,
the values this interpreter and checkout have, and None (never an exception) for what cannot be
read. The values from a real 2-node job are checked in tests/jobs/test_submit_train_job.py."""
import platform
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import numpy
import pytest

from recsys.monitoring import provenance

# not the fast tier: it imports TensorFlow (docs/testing.md)

REPO = Path(__file__).resolve().parents[2]
KEYS = ["python", "tensorflow", "keras", "horovod", "horovod_build", "mpi", "numpy", "cuda", "cudnn", "nccl",
        "gpu_model", "cpu_model", "nodes", "slurm_job_id", "slurm_version", "git_commit", "git_dirty", "profile",
        "profile_sha256"]


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Each test reads its own environment (the facts are cached once per process)."""
    for var in ("SLURMD_NODENAME", "SLURM_JOB_ID", "RECSYS_JOB_PROFILE", "RECSYS_JOB_PROFILE_SHA256"):
        monkeypatch.delenv(var, raising=False)
    provenance._facts.cache_clear()
    yield
    provenance._facts.cache_clear()


def _git(*args):
    proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
    return proc.stdout.strip() if proc.returncode == 0 else None


def test_this_process(monkeypatch):
    import tensorflow as tf
    monkeypatch.setenv("RECSYS_JOB_PROFILE", "ci")
    monkeypatch.setenv("RECSYS_JOB_PROFILE_SHA256", "ab" * 32)
    p = provenance.collect()
    assert list(p) == KEYS
    assert p["python"] == platform.python_version()
    assert p["tensorflow"] == tf.__version__ and p["numpy"] == numpy.__version__
    assert p["keras"] and re.match(r"\d+\.\d+", p["keras"])
    assert p["cpu_model"] and isinstance(p["cpu_model"], str)
    assert p["nodes"] == [socket.gethostname()]
    assert p["slurm_job_id"] is None and p["slurm_version"] is None      # not in a Slurm job
    assert p["profile"] == "ci" and p["profile_sha256"] == "ab" * 32
    assert p["git_commit"] == _git("rev-parse", "HEAD")
    if p["git_commit"] is not None:
        assert isinstance(p["git_dirty"], bool)
        assert p["git_dirty"] == bool(_git("status", "--porcelain", "--untracked-files=no"))
    if tf.config.list_physical_devices("GPU") == []:
        assert p["gpu_model"] is None
    # a single rank loads Horovod for its build flags too, so every point of a study records them
    import horovod.tensorflow as hvd

    import horovod

    assert p["horovod"] == horovod.__version__
    assert p["horovod_build"] == {"mpi": bool(hvd.mpi_built()), "nccl": bool(hvd.nccl_built()),
                                  "gloo": bool(hvd.gloo_built()), "cuda": bool(hvd.cuda_built())}
    assert p["nccl"] is None or hvd.nccl_built()
    if shutil.which("ompi_info"):
        assert p["mpi"]["implementation"] == "Open MPI" and re.fullmatch(r"\d+(\.\d+)+", p["mpi"]["version"])
    assert provenance.collect() == p          # read once: the same dict again, a copy
    assert provenance.collect() is not p


def test_node_names_of_all_ranks(monkeypatch):
    monkeypatch.setenv("SLURMD_NODENAME", "node2")     # Slurm's name: emulated nodes share one host
    assert provenance.collect()["nodes"] == ["node2"]
    assert provenance.nodes(lambda mine: ["node3", mine, "node3", "node1"]) == ["node1", "node2", "node3"]
    assert provenance.collect(["node1", "node2"])["nodes"] == ["node1", "node2"]


def test_what_cannot_be_read_is_none(monkeypatch, tmp_path):
    sleep, false = shutil.which("sleep"), shutil.which("false")
    monkeypatch.setattr(provenance, "COMMAND_TIMEOUT_S", 0.2)
    start = time.monotonic()
    assert provenance._run([sleep, "5"]) is None and time.monotonic() - start < 3     # too slow
    assert provenance._run([false]) is None and provenance._run([str(tmp_path / "absent")]) is None
    monkeypatch.setenv("PATH", str(tmp_path))           # no git, scontrol, ompi_info, mpirun
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    p = provenance.collect()
    assert list(p) == KEYS and p["slurm_job_id"] == "77"
    assert p["slurm_version"] is None and p["git_commit"] is None and p["git_dirty"] is None


def test_only_the_top_of_a_work_tree_is_a_checkout(tmp_path):
    """An install inside another repository (a venv in a checkout) must not report that repository."""
    assert provenance._git(REPO / "recsys") == (None, None)
    assert provenance._git(tmp_path) == (None, None)


@pytest.mark.parametrize("text,expected", [
    ("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022", ("Open MPI", "4.1.4")),
    ("MPICH Version:\t4.0.2\nMPICH Release date:\tThu Apr  7 12:34:45 CDT 2022", ("MPICH", "4.0.2")),
    ("Intel(R) MPI Library 2021.5 for Linux* OS", ("Intel(R) MPI Library", "2021.5")),
])
def test_mpi_library_version_strings(text, expected):
    assert provenance._parse_mpi(text) == {"implementation": expected[0], "version": expected[1]}
