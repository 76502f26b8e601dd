"""Does TensorFlow see the GPUs this rank was given? The pre-flight check of ``recsys-train``.

A CPU-only TensorFlow (``tensorflow-cpu``, the [train] extra) or a node without a visible NVIDIA
driver / CUDA libraries trains on the CPUs without a word on a GPU node. :func:`expected_gpus`
reads what this process was given without TensorFlow: ``CUDA_VISIBLE_DEVICES`` (Slurm sets it
for a step with GPUs; ``""`` / ``-1`` hide every GPU), Slurm's ``SLURM_STEP_GPUS``,
``SLURM_JOB_GPUS``, ``SLURM_GPUS_ON_NODE``, else the GPUs ``nvidia-smi -L`` lists.
:func:`check` is the pure decision from that, the device mode (``--device`` /
``$RECSYS_DEVICE``) and what TensorFlow reports; ``recsys.train.run`` applies it right after
importing TensorFlow and stops with one line (exit 2) when GPUs were given but TensorFlow sees
none, unless the run is declared a CPU run (``--device cpu`` or ``RECSYS_DEVICE=cpu``, which the
``ci`` profile and the test cluster set: their GRES GPUs are fake device files).

``python -m recsys.runtime.devices --expected`` prints the expectation on a node without importing
TensorFlow (tests/gpu_node_check.sh). docs/engine.md, "GPUs: the device check".
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from typing import Mapping, Optional, Tuple

from slurm.common.cpulist import parse_cpulist

DEVICE_ENV = "RECSYS_DEVICE"
MODES = ("auto", "cpu", "gpu")
# What the [gpu] extra installs (at install/constraints.txt's release): the fix offered for a CPU-only TensorFlow.
GPU_INSTALL = "pip install 'recsys-submit[gpu]' (tensorflow[and-cuda]==2.15.1) instead of the [train] extra"
# Distributions that are CPU-only builds by name.
CPU_DISTRIBUTIONS = ("tensorflow-cpu", "tf-nightly-cpu", "tensorflow-cpu-aws", "intel-tensorflow",
                     "tensorflow-intel", "tensorflow-macos")
# DLRM --synthetic --run-mode benchmark (100 timed steps, global batch 512), one process on this
# project's 2-core AMD EPYC test VM, TF 2.15.1 CPU: fp32 vs --amp steps/s (docs/engine.md).
AMP_CPU_MEASURE = {"tensorflow": "2.15.1", "fp32_steps_per_s": 129, "amp_steps_per_s": 5.7}


@dataclasses.dataclass(frozen=True)
class Expected:
    """GPUs this process was given: ``count`` (None: nothing says; 0: GPUs explicitly hidden)
    and ``source``, the variable or command that says so, for the error line."""
    count: Optional[int]
    source: str = ""


def _count_list(value: str) -> int:
    """Entries of a GPU list: indices as Slurm writes them ("0,1", "0-3": the cpulist syntax, read
    by the project's one parser of it), else one per entry ("GPU-uuid,MIG-uuid")."""
    try:
        return len(parse_cpulist(value))
    except ValueError:
        return sum(1 for v in value.split(",") if v.strip())


def count_nvidia_smi(output: Optional[str]) -> Optional[int]:
    """GPUs in ``nvidia-smi -L`` output (lines "GPU 0: NVIDIA H100 ... (UUID: ...)"); None: no output."""
    if output is None:
        return None
    return sum(1 for line in output.splitlines() if re.match(r"GPU \d+:", line.strip()))


def expected_gpus(env: Mapping[str, str], nvidia_smi_output: Optional[str] = None) -> Expected:
    """The GPUs this process was given, most specific source first (pure)."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        cvd = cvd.strip()
        if cvd == "" or cvd.startswith("-1") or cvd.lower() in ("none", "nodevfiles"):
            return Expected(0, f"CUDA_VISIBLE_DEVICES={cvd!r}")
        return Expected(_count_list(cvd), f"CUDA_VISIBLE_DEVICES={cvd}")
    for name in ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"):
        value = (env.get(name) or "").strip()
        if value:
            return Expected(_count_list(value), f"{name}={value}")
    on_node = (env.get("SLURM_GPUS_ON_NODE") or "").strip()
    if on_node.isdigit() and int(on_node) > 0:
        return Expected(int(on_node), f"SLURM_GPUS_ON_NODE={on_node}")
    listed = count_nvidia_smi(nvidia_smi_output)
    if listed:
        return Expected(listed, f"nvidia-smi -L lists {listed}")
    return Expected(None, "")


def nvidia_smi_list(timeout: float = 20) -> Optional[str]:
    """``nvidia-smi -L`` output, None when it is not installed or fails (no driver)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return res.stdout if res.returncode == 0 else None


def device_mode(flag: Optional[str], env: Mapping[str, str]) -> Tuple[str, str]:
    """(mode, who said it): ``--device`` over ``$RECSYS_DEVICE`` over auto. A bad value is an
    EngineError (one line)."""
    if flag:
        return flag, f"--device {flag}"
    value = (env.get(DEVICE_ENV) or "").strip().lower()
    if not value:
        return "auto", ""
    if value not in MODES:
        from recsys.errors import EngineError
        raise EngineError(f"{DEVICE_ENV}={env.get(DEVICE_ENV)!r}: expected one of {', '.join(MODES)}")
    return value, f"{DEVICE_ENV}={value}"


def check(expected: Expected, mode: str, tf_gpus: int, distribution: str, version: str,
          cuda_build: Optional[bool], smi_listed: Optional[int]) -> Optional[str]:
    """The refusal line, or None to run (pure). ``distribution``/``version``: the installed
    TensorFlow distribution (recsys.runtime.tfcompat.detect); ``cuda_build``: tf.test.is_built_with_cuda();
    ``smi_listed``: GPUs nvidia-smi lists (None: no nvidia-smi / driver)."""
    if mode == "cpu" or tf_gpus > 0:
        return None
    if mode == "gpu":
        given = f"{expected.source}; " if expected.count else ""
        reason = f"--device gpu / {DEVICE_ENV}=gpu: {given}"
    elif expected.count:
        reason = f"this rank was given {expected.count} GPU(s) ({expected.source}) "
    else:
        return None
    if distribution in CPU_DISTRIBUTIONS or cuda_build is False:
        cause = (f"{distribution} {version} is installed, a TensorFlow built without CUDA: {GPU_INSTALL}")
    elif smi_listed is None:
        cause = ("no NVIDIA driver answers here (nvidia-smi missing or failing): check the node's driver, "
                 "or run inside the profile's container")
    else:
        cause = (f"{distribution} {version} is built with CUDA but loads no GPU: the CUDA/cuDNN libraries are "
                 f"not found (install tensorflow[and-cuda]=={version} or set LD_LIBRARY_PATH; TF_CPP_MIN_LOG_LEVEL=0 "
                 f"shows which library failed)")
    return (f"{reason}but TensorFlow sees no GPU and would train on the CPUs: {cause}; "
            f"pass --device cpu (or set {DEVICE_ENV}=cpu) for a CPU run")


def nccl_warning(tf_gpus: int, horovod: bool, nccl_built: bool) -> Optional[str]:
    """One warning line when GPU ranks run Horovod without NCCL (allreduce through MPI on the host)."""
    if tf_gpus and horovod and not nccl_built:
        return ("Horovod was built without NCCL: GPU gradients are allreduced through MPI over host memory "
                "(slow); rebuild it with tests/install.sh on a node with CUDA and NCCL "
                "(HOROVOD_GPU_OPERATIONS=NCCL)")
    return None


def amp_cpu_slowdown() -> float:
    """How many times slower --amp ran than float32 on CPUs (the measurement above)."""
    return AMP_CPU_MEASURE["fp32_steps_per_s"] / AMP_CPU_MEASURE["amp_steps_per_s"]


def amp_warning(amp: bool, tf_gpus: int) -> Optional[str]:
    """One warning line for --amp without a GPU: mixed float16 is emulated on CPUs (slow)."""
    if not amp or tf_gpus:
        return None
    m = AMP_CPU_MEASURE
    ratio = amp_cpu_slowdown()
    return (f"--amp without a GPU: float16 math runs emulated on CPUs, about {ratio:.0f}x slower "
            f"(DLRM benchmark on TensorFlow {m['tensorflow']}: {m['amp_steps_per_s']} steps/s with --amp, "
            f"{m['fp32_steps_per_s']} in float32); --amp is meant for GPUs")


def main(argv=None) -> int:
    """``python -m recsys.runtime.devices --expected``: the GPUs this process was given (no TensorFlow);
    prints ``expected=N source=...`` and ``nvidia_smi=N`` (``none``: unknown)."""
    import argparse
    p = argparse.ArgumentParser(prog="python -m recsys.runtime.devices", description=main.__doc__)
    p.add_argument("--expected", action="store_true", help="print the expected GPUs (the default)")
    p.parse_args(argv)
    smi = nvidia_smi_list()
    exp = expected_gpus(os.environ, smi)
    listed = count_nvidia_smi(smi)
    print(f"expected={'none' if exp.count is None else exp.count} source={exp.source or '-'}")
    print(f"nvidia_smi={'none' if listed is None else listed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
