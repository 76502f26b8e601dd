"""The real training engine through recsys-submit on the local cluster: 2 nodes x 1 rank,
srun --mpi=pmix, bind.sh per rank, Horovod inside (no mpirun/horovodrun in the step). Its summary
says where the numbers came from (`provenance`, docs/engine-log.md) and what they mean."""

import glob
import os
import platform
import re
import subprocess

import pytest

from jobs.profiles import load_profile
from jobs.runs import enginelog

pytestmark = [pytest.mark.slurm, pytest.mark.horovod]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _git(*args):
    proc = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
    return proc.stdout.strip() if proc.returncode == 0 else None


def _cpu_model():
    with open("/proc/cpuinfo") as handle:
        return next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))


def test_ncf_two_nodes_through_recsys_submit(cli, slurm_cluster, tmp_path):
    hvd = pytest.importorskip("horovod.tensorflow")
    import horovod
    import numpy
    import tensorflow as tf
    # a shared --checkpoint-dir also holds the synthetic data every rank reads
    run_dir, record = cli.submit("train", "--profile", "ci", "--model", "ncf", "--nodes", "2",
                                 "--gpus-per-node", "1", "--time", "10", "--",
                                 "--synthetic", "--max-steps", "4", "--benchmark-warmup-steps", "1",
                                 "--batch-size", "128", "--checkpoint-dir", tmp_path / "ckpt")
    job = record["jobs"][0]
    state = slurm_cluster.wait_job(job["job_id"], timeout=400)
    rank_logs = sorted(glob.glob(os.path.join(run_dir, "logs", "*.rank*.log")))
    text = {os.path.basename(p): open(p, errors="replace").read() for p in rank_logs}
    assert state == "COMPLETED", {k: v[-2000:] for k, v in text.items()}
    assert len(rank_logs) == 2
    summary = [line for line in text[os.path.basename(rank_logs[0])].splitlines() if "summary:" in line]
    assert summary and "ncf train on 2 ranks" in summary[-1], text

    s = enginelog.summary(enginelog.job_logs(run_dir, job["key"], [job["job_id"]]))
    assert s and s["summary_version"] == 3 and s["world_size"] == 2
    # throughput of the slowest rank: timed_steps x global batch / its seconds, the same seconds
    # as the mean step time
    assert s["timed_steps"] == 3 and s["excluded_warmup_steps"] == 1
    assert s["throughput_samples_per_s"] * s["mean_step_time_ms"] / 1000 == \
        pytest.approx(s["global_batch_size"], rel=1e-9)

    p = s["provenance"]
    with open(os.path.join(run_dir, "logs", f"{job['key']}-{job['job_id']}.info")) as handle:
        nodelist = re.search(r"^nodelist=(.+)$", handle.read(), re.M).group(1)
    nodes = slurm_cluster.run(["scontrol", "show", "hostnames", nodelist], check=True).stdout.split()
    scontrol = slurm_cluster.run(["scontrol", "--version"], check=True).stdout.split()[-1]
    ompi = subprocess.run(["ompi_info", "--version"], capture_output=True, text=True, timeout=30).stdout
    expected = {
        "python": platform.python_version(), "tensorflow": tf.__version__, "numpy": numpy.__version__,
        "horovod": horovod.__version__,
        "horovod_build": {"mpi": bool(hvd.mpi_built()), "nccl": bool(hvd.nccl_built()),
                          "gloo": bool(hvd.gloo_built()), "cuda": bool(hvd.cuda_built())},
        "mpi": {"implementation": "Open MPI", "version": re.search(r"v(\d+(?:\.\d+)+)", ompi).group(1)},
        "cuda": tf.sysconfig.get_build_info().get("cuda_version"),
        "cudnn": tf.sysconfig.get_build_info().get("cudnn_version"),
        "nccl": None if not hvd.nccl_built() else p["nccl"],
        "gpu_model": None if not tf.config.list_physical_devices("GPU") else p["gpu_model"],   # fake GPUs here
        "cpu_model": _cpu_model(), "nodes": nodes, "slurm_job_id": job["job_id"], "slurm_version": scontrol,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "profile": "ci", "profile_sha256": load_profile("ci").content_sha256(),
    }
    assert len(nodes) == 2 and p["keras"]
    assert {k: p[k] for k in expected} == expected
    assert sorted(p) == sorted(list(expected) + ["keras"])
