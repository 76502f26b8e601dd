"""NVTabular's dask runtime on GPU nodes: per-worker host memory limits and the RMM pool (issue 26, item 5).

distributed 2023.1.1 applies a given ``memory_limit`` to every worker process (only "auto" is
divided by the number of workers), so the runtime must hand each dask-cuda worker its part of
the node's memory, never the node's memory itself. The selection is pure and tested here; a
LocalCUDACluster itself needs a GPU and cudf (not on this machine).
"""
from __future__ import annotations

import pytest

from preproc.errors import PreprocError
from preproc.runtime.dask_cluster import NODE_MEMORY_SHARE, choose_runtime, detect, worker_memory_gb

pytestmark = pytest.mark.fast


def test_gpu_workers_share_the_node_memory():
    # DGX A100: 1024 GiB, 8 GPUs -> 8 workers of 0.85 * 1024 / 8 = 108.8 GiB, not 8 x 1024 GiB
    runtime = choose_runtime("auto", 8, 256, cudf_available=True, memory_gb=1024)
    assert (runtime.mode, runtime.workers) == ("gpu", 8)
    assert runtime.memory_limit_gb == 108.8
    assert runtime.workers * runtime.memory_limit_gb <= NODE_MEMORY_SHARE * 1024
    assert "8 worker(s), one per GPU, 108.8 GiB host memory each" in runtime.describe()
    assert runtime.rmm_pool_size is None


def test_distributed_applies_a_given_limit_per_worker_process():
    """The fact the split rests on, read from distributed itself: a given limit is not divided."""
    import logging

    from distributed.worker_memory import parse_memory_limit

    for workers in (1, 8):                                       # whole, whatever the worker count
        assert parse_memory_limit("1GiB", 1, total_cores=workers, logger=logging.getLogger("t")) == 2**30
    auto = parse_memory_limit("auto", 1, total_cores=8, logger=logging.getLogger("t"))
    auto_one = parse_memory_limit("auto", 1, total_cores=1, logger=logging.getLogger("t"))
    assert abs(auto * 8 - auto_one) <= 8                       # only "auto" is divided


def test_worker_memory_rule():
    assert worker_memory_gb(1024, 8) == 108.8
    assert worker_memory_gb(4, 16) == 1.0           # at least 1 GiB
    assert worker_memory_gb(None, 8) is None         # unknown: distributed's "auto"
    assert choose_runtime("cpu", 0, 4, False, memory_gb=10).memory_limit_gb == 8.5


def test_rmm_pool_from_the_environment():
    env = {"CUDA_VISIBLE_DEVICES": "", "RECSYS_DASK_RMM_POOL_SIZE": "60GB"}
    assert detect("auto", 4, 64, environ=env).mode == "cpu"           # no GPU visible: no pool used
    runtime = choose_runtime("gpu", 2, 16, cudf_available=True, memory_gb=64, rmm_pool_size="0.8")
    assert runtime.rmm_pool_size == "0.8" and "RMM pool 0.8" in runtime.describe()
    with pytest.raises(PreprocError, match=r"^\$RECSYS_DASK_RMM_POOL_SIZE: '60 GB; rm' is not a size"):
        choose_runtime("gpu", 2, 16, cudf_available=True, rmm_pool_size="60 GB; rm")


def _bash(script, *args, env=None):
    import subprocess
    return subprocess.run(["bash", "-c", script, "_", *args], capture_output=True, text=True, env=env, timeout=30)


def test_the_shell_helpers_use_the_same_memory_share_and_pool_sizes():
    """slurm/allocation-cluster.sh and slurm/dask-cluster.sh run before any Python in the job;
    their twins of NODE_MEMORY_SHARE and of the RMM size rule must say what Python says."""
    import os
    import re
    from pathlib import Path

    from preproc.runtime.dask_cluster import _RMM_SIZE
    slurm = Path(__file__).resolve().parents[2] / "slurm"
    for mem_mb in (1024 * 1024, 512000, 96 * 1024, 4096):       # DGX A100, DGX-2-ish, a small node
        out = _bash(f'source "{slurm}/allocation-cluster.sh"; default_worker_memory_gb',
                    env={**os.environ, "SLURM_MEM_PER_NODE": str(mem_mb)})
        assert int(out.stdout) == max(1, int(NODE_MEMORY_SHARE * mem_mb / 1024)), (mem_mb, out.stderr)
    pattern = re.search(r"\[\[ \$RMM_POOL =~ (\S+) \]\]", (slurm / "dask-cluster.sh").read_text()).group(1)
    for size in ("60GB", "0.8", "16GiB", "512M", "1", "60 GB", "0.8x", "GB", "-1", "60GB; rm", ""):
        in_shell = _bash(f'[[ "$1" =~ {pattern} ]]', size).returncode == 0
        assert in_shell == bool(_RMM_SIZE.match(size)), size
