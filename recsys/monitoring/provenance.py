"""Where a result came from: the software, hardware, job and code of a run (docs/engine-log.md).

Two summary numbers are only comparable when they come from the same stack, so the summary
record carries the `provenance` dict built here. It is read once per process, cheaply and
without network: every external command has a short timeout, and whatever cannot be read is
None, never an error (a missing tool must not fail a finished run). Only the node list needs
the other ranks (:func:`nodes`, a collective every rank calls).
"""
from __future__ import annotations

import copy
import ctypes
import functools
import importlib.metadata
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path

# Seconds one external command (git, scontrol, ompi_info) may take before it reads as unknown.
COMMAND_TIMEOUT_S = 5.0
# The checkout the engine is imported from: the parent of the recsys/ package (this is recsys/monitoring/).
CHECKOUT = Path(__file__).resolve().parents[2]
# Large enough for any MPI's MPI_MAX_LIBRARY_VERSION_STRING (Open MPI 256, MPICH 8192).
_MPI_VERSION_BUFFER = 8192
_VERSION = r"(?P<version>\d+(?:\.\d+)+)"


def node_name() -> str:
    """This rank's node: Slurm's name for it (emulated nodes share one host), else the hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def nodes(gather=None) -> list:
    """Sorted unique node names of all ranks. ``gather`` (``Distributed.allgather_object``) is a
    collective: with more than one rank, every rank must call this."""
    mine = node_name()
    return sorted(set(gather(mine))) if gather is not None else [mine]


def collect(all_nodes=None) -> dict:
    """The provenance dict (a fresh copy); ``all_nodes`` from :func:`nodes`, else this node."""
    out = copy.deepcopy(_facts())
    out["nodes"] = list(all_nodes) if all_nodes is not None else [node_name()]
    return out


@functools.lru_cache(maxsize=None)
def _facts() -> dict:
    """What this process can tell on its own, in the documented key order (nodes filled in later)."""
    # multi-rank jobs have loaded Horovod (recsys.runtime.distributed); a single rank loads it here (about
    # 0.1 s after TensorFlow, no MPI_Init), so that every point of a study records the same build
    hvd = sys.modules.get("horovod.tensorflow") or _import_horovod()
    build = _horovod_build(hvd)
    commit, dirty = _git(CHECKOUT)
    return {
        "python": platform.python_version(),
        "tensorflow": _tf_version(),
        "keras": _keras_version(),
        "horovod": _package_version("horovod"),
        "horovod_build": build,
        "mpi": _mpi_library(),
        "numpy": _numpy_version(),
        "cuda": _tf_build_info("cuda_version"),
        "cudnn": _tf_build_info("cudnn_version"),
        "nccl": _nccl_version(hvd) if build and build["nccl"] else None,
        "gpu_model": _gpu_model(),
        "cpu_model": _cpu_model(),
        "nodes": None,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID") or None,
        "slurm_version": _slurm_version(),
        "git_commit": commit,
        "git_dirty": dirty,
        "profile": os.environ.get("RECSYS_JOB_PROFILE") or None,
        "profile_sha256": os.environ.get("RECSYS_JOB_PROFILE_SHA256") or None,
    }


def _safe(fn):
    """None instead of any exception: provenance never fails a run."""
    @functools.wraps(fn)
    def wrapper(*args):
        try:
            return fn(*args)
        except Exception:
            return None
    return wrapper


def _run(argv, cwd=None, env=None):
    """stdout of a command that exited 0, else None (missing, failed or too slow)."""
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=COMMAND_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return proc.stdout if proc.returncode == 0 else None


@_safe
def _package_version(name):
    return importlib.metadata.version(name)


@_safe
def _tf_version():
    import tensorflow as tf
    return tf.__version__


@_safe
def _keras_version():
    """The version of the package behind tf.keras (keras 2 under TF 2.15, or tf_keras)."""
    import tensorflow as tf
    top = tf.keras.__name__.split(".")[0]
    module = sys.modules.get(top)
    version = getattr(module, "__version__", None) or _package_version(top.replace("_", "-"))
    return str(version) if version else None


@_safe
def _numpy_version():
    import numpy
    return numpy.__version__


@_safe
def _tf_build_info(key):
    import tensorflow as tf
    value = tf.sysconfig.get_build_info().get(key)
    return str(value) if value else None


@_safe
def _import_horovod():
    """horovod.tensorflow when it is installed (loading it does not initialise MPI), else None."""
    import importlib.util

    if importlib.util.find_spec("horovod") is None:
        return None
    import horovod.tensorflow as hvd
    return hvd


@_safe
def _horovod_build(hvd):
    """What the loaded Horovod was built with; None when this process did not load it."""
    if hvd is None:
        return None
    return {"mpi": bool(hvd.mpi_built()), "nccl": bool(hvd.nccl_built()), "gloo": bool(hvd.gloo_built()),
            "cuda": bool(hvd.cuda_built())}


@_safe
def _nccl_version(hvd):
    """Horovod's nccl_built() is the NCCL_VERSION_CODE it was built against (0: none)."""
    code = int(hvd.nccl_built())
    if code <= 0:
        return None
    if code >= 10000:                   # NCCL >= 2.9: major*10000 + minor*100 + patch
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


@_safe
def _mpi_library():
    """The MPI the ranks use: the libmpi already loaded in this process (by an MPI-built Horovod),
    asked through MPI_Get_library_version (callable before MPI_Init); else the installed Open MPI's
    commands. {"implementation", "version"} or None."""
    text = _loaded_mpi_version()
    if text:
        return _parse_mpi(text)
    text = _run(["ompi_info", "--version"])
    if text:
        return _parse_mpi(text)
    text = _run(["mpirun", "--version"])
    if text:
        match = re.search(r"\((?P<impl>[^)]+)\)\s+" + _VERSION, text)   # mpirun (Open MPI) 4.1.4
        if match:
            return {"implementation": match.group("impl").strip(), "version": match.group("version")}
        return _parse_mpi(text)
    return None


def _loaded_mpi_version():
    try:
        with open("/proc/self/maps") as handle:
            paths = sorted({line.split()[-1] for line in handle if re.search(r"/libmpi\.so[.\d]*$", line.strip())})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)    # already loaded: no new load
            buf, length = ctypes.create_string_buffer(_MPI_VERSION_BUFFER), ctypes.c_int(0)
            if lib.MPI_Get_library_version(buf, ctypes.byref(length)) == 0:
                return buf.value[:length.value].decode("utf-8", "replace")
        except (OSError, AttributeError):
            continue
    return None


def _parse_mpi(text):
    """'Open MPI v4.1.4, package: ...' / 'MPICH Version: 4.0.2' / 'Intel(R) MPI Library 2021.5 ...'."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    match = re.match(r"\s*(?P<impl>[^\d,]+?)\s*(?:version:?)?\s*v?" + _VERSION, first, re.IGNORECASE)
    if not match:
        return None
    return {"implementation": match.group("impl").strip(), "version": match.group("version")}


@_safe
def _gpu_model():
    import tensorflow as tf
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return None
    return tf.config.experimental.get_device_details(gpus[0]).get("device_name") or None


def _cpu_model():
    try:
        with open("/proc/cpuinfo", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _slurm_version():
    """'slurm 21.08.5' -> '21.08.5'; only inside a Slurm job (outside, scontrol may look for its
    configuration over DNS)."""
    if not os.environ.get("SLURM_JOB_ID"):
        return None
    text = _run(["scontrol", "--version"])
    match = re.search(_VERSION, text or "")
    return match.group("version") if match else None


def _git(checkout):
    """(HEAD, dirty) of ``checkout`` when it is the top of a git work tree (an install inside some
    other repository is not), else (None, None)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_OPTIONAL_LOCKS="0", LC_ALL="C")       # ranks asking at once take no index lock
    out = _run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=str(checkout), env=env)
    lines = (out or "").splitlines()
    if len(lines) != 2 or not re.fullmatch(r"[0-9a-f]{40,64}", lines[1]):
        return None, None
    try:
        if not os.path.samefile(lines[0], checkout):
            return None, None
    except OSError:
        return None, None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=str(checkout), env=env)
    return lines[1], (bool(status.strip()) if status is not None else None)
