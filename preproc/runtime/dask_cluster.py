"""Where an NVTabular workflow runs: the dask runtime (CPU, GPU or a multinode cluster).

``choose_runtime`` is a pure function from what was asked (``--device``), what the
node has (GPUs, cores, memory, whether cudf imports) and whether a dask scheduler
was handed over (``$RECSYS_DASK_SCHEDULER_FILE``, exported by
slurm/dask-cluster.sh) to a :class:`Runtime`:

* ``multinode``: a scheduler file is given -> connect to that scheduler; its
  workers (one per node, started by slurm/dask-cluster.sh) do the work; pandas
  partitions unless the workers are dask-cuda workers (``gpus_per_node > 0``).
* ``gpu``: GPUs are visible and cudf imports (``--device auto``), or ``--device
  gpu`` -> ``dask_cuda.LocalCUDACluster``, one worker per GPU, cudf partitions.
  Host memory: each worker's ``memory_limit`` is ``NODE_MEMORY_SHARE`` of the node's
  memory divided by the workers. distributed 2023.1.1 applies a given limit to
  *every* worker process and divides only ``"auto"`` by their number
  (``distributed/worker_memory.py: parse_memory_limit``; ``LocalCUDACluster`` and
  ``dask-cuda-worker --memory-limit`` of dask-cuda 23.02 say "per process"), so the
  node's memory given as is would let 8 workers each grow to it before spilling.
  slurm/dask-cluster.sh splits the same share over a node's dask-cuda workers.
  RMM: ``$RECSYS_DASK_RMM_POOL_SIZE`` (e.g. ``60GB``, or ``0.8`` of the GPU) gives each
  worker an RMM pool of that size (dask-cuda's ``rmm_pool_size``, per worker); none
  by default.
* ``cpu``: otherwise -> dask's threaded scheduler in this process (a thread per
  core), pandas partitions (``merlin.io.Dataset(cpu=True)``).

``start`` turns a Runtime into a running ``distributed.Client`` (a context manager
that always closes what it started). Nothing here imports dask at import time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shutil
import subprocess
from typing import Iterator, Mapping

from preproc.errors import PreprocError
from slurm.common.node_memory import NODE_MEMORY_SHARE

log = logging.getLogger("preproc.nvt")
DEVICES = ("auto", "cpu", "gpu")
SCHEDULER_FILE_ENV = "RECSYS_DASK_SCHEDULER_FILE"
GPUS_ENV = "RECSYS_DASK_GPUS"
RMM_POOL_ENV = "RECSYS_DASK_RMM_POOL_SIZE"
_RMM_SIZE = re.compile(r"^[0-9]+(\.[0-9]+)?([KMGT]i?B?)?$")


@dataclasses.dataclass(frozen=True)
class Runtime:
    mode: str                 # cpu | gpu | multinode
    cpu: bool                 # pandas partitions (merlin.io.Dataset(cpu=True)); False: cudf
    workers: int              # dask workers (GPUs for gpu; nodes unknown for multinode: 0)
    threads_per_worker: int
    scheduler_file: str | None = None
    memory_limit_gb: float | None = None    # host memory limit of EACH worker process
    rmm_pool_size: str | None = None         # RMM pool per GPU worker (dask-cuda), None: no pool

    def describe(self) -> str:
        if self.mode == "multinode":
            return f"multinode dask cluster (scheduler file {self.scheduler_file}), {'pandas' if self.cpu else 'cudf'}"
        if self.mode == "gpu":
            memory = f", {self.memory_limit_gb:g} GiB host memory each" if self.memory_limit_gb else ""
            rmm = f", RMM pool {self.rmm_pool_size}" if self.rmm_pool_size else ""
            return f"GPU: dask-cuda LocalCUDACluster, {self.workers} worker(s), one per GPU{memory}{rmm}, cudf"
        return f"CPU: dask threaded scheduler, {self.threads_per_worker} thread(s), pandas"


def worker_memory_gb(node_memory_gb: float | None, workers: int) -> float | None:
    """Host memory limit of each of a node's ``workers`` dask worker processes: the node's share
    split evenly (distributed applies a given limit per worker process), at least 1 GiB."""
    if not node_memory_gb:
        return None
    return round(max(1.0, NODE_MEMORY_SHARE * float(node_memory_gb) / max(1, int(workers))), 2)


def choose_runtime(device: str, gpus: int, cores: int, cudf_available: bool, scheduler_file: str | None = None,
                   memory_gb: float | None = None, cluster_gpus: int = 0, rmm_pool_size: str | None = None) -> Runtime:
    """The runtime for a request (``memory_gb``: the node's memory); raises PreprocError (one line)
    for an impossible one."""
    if device not in DEVICES:
        raise PreprocError(f"--device: {device!r} is not one of {', '.join(DEVICES)}")
    if rmm_pool_size is not None and not _RMM_SIZE.match(str(rmm_pool_size)):
        raise PreprocError(f"${RMM_POOL_ENV}: {rmm_pool_size!r} is not a size (e.g. 60GB) or a fraction "
                           "of the GPU's memory (e.g. 0.8)")
    cores = max(1, int(cores))
    if scheduler_file:
        if device == "gpu" and cluster_gpus == 0:
            raise PreprocError("--device gpu: the dask cluster's workers have no GPUs "
                               "(start it with slurm/dask-cluster.sh --gpus-per-node G)")
        use_gpu = cluster_gpus > 0 and device != "cpu"
        return Runtime("multinode", cpu=not use_gpu, workers=0, threads_per_worker=cores,
                       scheduler_file=scheduler_file)
    if device == "gpu":
        if gpus < 1:
            raise PreprocError("--device gpu: no GPU visible on this node (CUDA_VISIBLE_DEVICES / nvidia-smi)")
        if not cudf_available:
            raise PreprocError("--device gpu: cudf does not import (install RAPIDS cudf and dask-cuda)")
    if device != "cpu" and gpus > 0 and cudf_available:
        return Runtime("gpu", cpu=False, workers=gpus, threads_per_worker=1,
                       memory_limit_gb=worker_memory_gb(memory_gb, gpus), rmm_pool_size=rmm_pool_size or None)
    return Runtime("cpu", cpu=True, workers=1, threads_per_worker=cores, memory_limit_gb=worker_memory_gb(memory_gb, 1))


def visible_gpus(environ: Mapping[str, str] | None = None) -> int:
    """GPUs this process may use: $CUDA_VISIBLE_DEVICES when set, else ``nvidia-smi -L`` lines, else 0."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() not in ("", "-1", "NoDevFiles")])
    if shutil.which("nvidia-smi") is None:
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def cudf_importable() -> bool:
    import importlib.util

    return importlib.util.find_spec("cudf") is not None and importlib.util.find_spec("dask_cuda") is not None


def detect(device: str, cores: int, memory_gb: float | None = None,
           environ: Mapping[str, str] | None = None) -> Runtime:
    """choose_runtime with this node's facts (the impure half)."""
    environ = os.environ if environ is None else environ
    scheduler_file = environ.get(SCHEDULER_FILE_ENV) or None
    cluster_gpus = int(environ.get(GPUS_ENV) or 0) if scheduler_file else 0
    gpus = 0 if device == "cpu" or scheduler_file else visible_gpus(environ)
    return choose_runtime(device, gpus, cores, cudf_available=gpus > 0 and cudf_importable(),
                          scheduler_file=scheduler_file, memory_gb=memory_gb, cluster_gpus=cluster_gpus,
                          rmm_pool_size=environ.get(RMM_POOL_ENV) or None)


def spill_directory() -> str:
    """The directory a single-node dask-cuda cluster spills to: dask's `temporary-directory`
    (DASK_TEMPORARY_DIRECTORY), else the system's temporary directory."""
    import tempfile

    import dask

    return dask.config.get("temporary-directory", None) or tempfile.gettempdir()


@contextlib.contextmanager
def start(runtime: Runtime) -> Iterator[object]:
    """A ``distributed.Client`` for ``runtime`` (None in CPU mode); what it started is closed on exit."""
    from distributed import Client

    if runtime.mode == "multinode":
        if not os.path.exists(runtime.scheduler_file):
            raise PreprocError(f"${SCHEDULER_FILE_ENV}: {runtime.scheduler_file}: no such scheduler file")
        with Client(scheduler_file=runtime.scheduler_file, timeout="60s") as client:
            workers = len(client.scheduler_info()["workers"])
            log.info("nvtabular: connected to %s, %d worker(s)", runtime.scheduler_file, workers)
            yield client
        return
    if runtime.mode == "cpu":
        # dask's threaded scheduler in this process: no scheduler or worker processes to start (an
        # in-process distributed.LocalCluster of distributed 2023.1 hands tasks their arguments
        # still wrapped in Serialize objects).
        import dask

        log.info("nvtabular: %s", runtime.describe())
        with dask.config.set(scheduler="threads", num_workers=runtime.threads_per_worker):
            yield None
        return
    memory = f"{runtime.memory_limit_gb:.2f}GiB" if runtime.memory_limit_gb else "auto"
    from dask_cuda import LocalCUDACluster

    # where the workers spill: dask's temporary-directory, which a single-node job of a profile with
    # `scratch` sets to that node-local disk (DASK_TEMPORARY_DIRECTORY, jobs.planning.plan), not the
    # container's own file system
    spill = spill_directory()
    cluster = LocalCUDACluster(n_workers=runtime.workers, memory_limit=memory, rmm_pool_size=runtime.rmm_pool_size,
                               dashboard_address=None, local_directory=spill)
    try:
        with Client(cluster) as client:
            log.info("nvtabular: %s; workers spill to %s", runtime.describe(), spill)
            yield client
    finally:
        cluster.close()
