"""The GPU-visibility check (recsys.runtime.devices): GPUs given to a rank that TensorFlow does not see stop
`recsys-train` with one line (exit 2) unless the run is declared a CPU run; the installer's
Horovod build choice (tests/install.sh --print-horovod-flags) on fake CUDA / NCCL trees."""
import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, SMALL, base_env, run_train
from recsys.errors import EngineError
from recsys.runtime import devices

H100_SMI = ("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0a1b)\n"
            "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-2c3d)\n")


# --- the pure decision ----------------------------------------------------------------
@pytest.mark.fast
@pytest.mark.parametrize("env,smi,count,source", [
    ({}, None, None, ""),
    ({}, "", None, ""),
    ({}, H100_SMI, 2, "nvidia-smi -L lists 2"),
    ({"CUDA_VISIBLE_DEVICES": "0"}, None, 1, "CUDA_VISIBLE_DEVICES=0"),
    ({"CUDA_VISIBLE_DEVICES": "GPU-0a1b,GPU-2c3d"}, None, 2, "CUDA_VISIBLE_DEVICES=GPU-0a1b,GPU-2c3d"),
    ({"CUDA_VISIBLE_DEVICES": ""}, H100_SMI, 0, "CUDA_VISIBLE_DEVICES=''"),   # hidden on purpose
    ({"CUDA_VISIBLE_DEVICES": "-1"}, H100_SMI, 0, "CUDA_VISIBLE_DEVICES='-1'"),
    ({"SLURM_STEP_GPUS": "0,1", "SLURM_JOB_GPUS": "0-3"}, None, 2, "SLURM_STEP_GPUS=0,1"),
    ({"SLURM_JOB_GPUS": "0-3"}, None, 4, "SLURM_JOB_GPUS=0-3"),
    ({"SLURM_GPUS_ON_NODE": "8"}, None, 8, "SLURM_GPUS_ON_NODE=8"),
    ({"SLURM_GPUS_ON_NODE": "0"}, None, None, ""),
])
def test_expected_gpus(env, smi, count, source):
    assert devices.expected_gpus(env, smi) == devices.Expected(count, source)


@pytest.mark.fast
def test_nvidia_smi_count_ignores_mig_lines():
    out = H100_SMI + "  MIG 3g.40gb     Device  0: (UUID: MIG-aa)\n"
    assert devices.count_nvidia_smi(out) == 2 and devices.count_nvidia_smi(None) is None


@pytest.mark.fast
def test_device_mode_flag_over_env_and_bad_env_value():
    assert devices.device_mode(None, {}) == ("auto", "")
    assert devices.device_mode(None, {"RECSYS_DEVICE": "CPU"}) == ("cpu", "RECSYS_DEVICE=cpu")
    assert devices.device_mode("gpu", {"RECSYS_DEVICE": "cpu"}) == ("gpu", "--device gpu")
    with pytest.raises(EngineError, match="RECSYS_DEVICE='tpu'"):
        devices.device_mode(None, {"RECSYS_DEVICE": "tpu"})


@pytest.mark.fast
def test_check_refuses_given_gpus_tensorflow_does_not_see():
    given = devices.Expected(2, "SLURM_STEP_GPUS=0,1")
    cpu_tf = devices.check(given, "auto", 0, "tensorflow-cpu", "2.15.1", False, 2)
    assert "SLURM_STEP_GPUS=0,1" in cpu_tf and "tensorflow-cpu 2.15.1" in cpu_tf and "[gpu]" in cpu_tf
    assert "--device cpu" in cpu_tf and "\n" not in cpu_tf
    no_driver = devices.check(given, "auto", 0, "tensorflow", "2.15.1", True, None)
    assert "driver" in no_driver
    no_libs = devices.check(given, "auto", 0, "tensorflow", "2.15.1", True, 2)
    assert "CUDA/cuDNN libraries" in no_libs
    # runs: GPUs seen, a declared CPU run, nothing given
    assert devices.check(given, "auto", 2, "tensorflow", "2.15.1", True, 2) is None
    assert devices.check(given, "cpu", 0, "tensorflow-cpu", "2.15.1", False, 2) is None
    assert devices.check(devices.Expected(None), "auto", 0, "tensorflow-cpu", "2.15.1", False, None) is None
    assert devices.check(devices.Expected(0, "CUDA_VISIBLE_DEVICES=''"), "auto", 0, "tensorflow", "2.15.1",
                         True, 2) is None
    # --device gpu insists even when nothing says GPUs were given
    assert "--device gpu" in devices.check(devices.Expected(None), "gpu", 0, "tensorflow-cpu", "2.15.1", False, None)


@pytest.mark.fast
def test_nccl_and_amp_warnings():
    assert "without NCCL" in devices.nccl_warning(1, True, False)
    assert devices.nccl_warning(1, True, True) is None and devices.nccl_warning(0, True, False) is None
    assert devices.nccl_warning(1, False, False) is None
    line = devices.amp_warning(True, 0)
    assert "2.15.1" in line and "slower" in line and "\n" not in line
    assert devices.amp_warning(True, 1) is None and devices.amp_warning(False, 0) is None


@pytest.mark.fast
def test_module_prints_expectation_without_tensorflow():
    env = dict(base_env(), CUDA_VISIBLE_DEVICES="0,1")
    code = ("import runpy, sys\ntry:\n    runpy.run_module('recsys.runtime.devices', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code\nprint('TF', 'tensorflow' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code, "--expected"], env=env, cwd=REPO, text=True,
                         capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "expected=2 source=CUDA_VISIBLE_DEVICES=0,1" in res.stdout and "TF False" in res.stdout


# --- recsys-train on this CPU-only machine: TensorFlow imported, sees no GPU ------------
TRAIN = ["--model", "dlrm", "--synthetic", "--synthetic-rows", "2048", *SMALL["dlrm"], "--epochs", "1",
         "--max-steps", "2"]


@pytest.mark.parametrize("given", [{"CUDA_VISIBLE_DEVICES": "0"}, {"SLURM_STEP_GPUS": "0,1"}])
def test_train_refuses_given_gpus_with_one_line(given, tmp_path):
    env = base_env()           # drops SLURM_*; RECSYS_DEVICE from a test cluster would turn the check off
    env.pop("RECSYS_DEVICE", None)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.update(given)
    res = run_train(TRAIN + ["--log-path", tmp_path / "log.jsonl"], env=env)
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr[-2000:]
    name = next(iter(given))
    assert lines[0].startswith("recsys-train: error: ") and name in lines[0]
    assert "tensorflow-cpu" in lines[0] and "--device cpu" in lines[0]


@pytest.mark.parametrize("declared", ["flag", "env"])
def test_train_runs_on_cpu_when_declared(declared, tmp_path):
    env = dict(base_env(), CUDA_VISIBLE_DEVICES="0", SLURM_STEP_GPUS="0")
    env.pop("RECSYS_DEVICE", None)
    args = TRAIN + ["--log-path", tmp_path / "log.jsonl"]
    if declared == "flag":
        args += ["--device", "cpu"]
    else:
        env["RECSYS_DEVICE"] = "cpu"
    res = run_train(args, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert any(r.get("type") == "summary" for r in records), records[-1]


def test_amp_on_cpu_warns_once(tmp_path):
    env = base_env()
    env.pop("CUDA_VISIBLE_DEVICES", None)
    res = run_train(TRAIN + ["--amp", "--log-path", tmp_path / "log.jsonl"], env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    warned = [line for line in res.stderr.splitlines() if "--amp without a GPU" in line]
    assert len(warned) == 1 and "TensorFlow 2.15.1" in warned[0], res.stderr[-2000:]


# --- the installer's Horovod build choice, without building ---------------------------
def _flags(env_extra, tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("CUDA_HOME", "CUDA_PATH", "NCCL_HOME", "HOROVOD_NCCL_HOME", "RECSYS_HOROVOD_GPU")}
    env.update(env_extra)
    res = subprocess.run(["bash", str(REPO / "tests" / "install.sh"), "--print-horovod-flags"], env=env,
                         text=True, capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def _fake_cuda(root, nccl_lib="libnccl.so", release="12.2"):
    (root / "cuda" / "bin").mkdir(parents=True)
    nvcc = root / "cuda" / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)
    (root / "nccl" / "include").mkdir(parents=True)
    (root / "nccl" / "lib").mkdir()
    (root / "nccl" / "include" / "nccl.h").write_text("#define NCCL_MAJOR 2\n")
    (root / "nccl" / "lib" / nccl_lib).write_text("")
    return str(root / "cuda"), str(root / "nccl")


@pytest.mark.fast
def test_installer_builds_horovod_with_nccl_on_a_cuda_nccl_tree(tmp_path):
    cuda, nccl = _fake_cuda(tmp_path)
    out = _flags({"CUDA_HOME": cuda, "NCCL_HOME": nccl, "RECSYS_HOROVOD_GPU": "1"}, tmp_path)
    flags = out["flags"]
    assert flags["HOROVOD_GPU_OPERATIONS"] == "NCCL" and flags["HOROVOD_CUDA_HOME"] == cuda
    assert flags["HOROVOD_NCCL_INCLUDE"] == nccl + "/include" and flags["HOROVOD_NCCL_LIB"] == nccl + "/lib"
    assert flags["HOROVOD_NCCL_LINK"] == "SHARED" and out["tensorflow_extra"] == "gpu"
    assert "warning" not in out["reason"]
    cuda13, nccl13 = _fake_cuda(tmp_path / "13", release="13.0")      # TF 2.15.1 is built for CUDA 12
    out = _flags({"CUDA_HOME": cuda13, "NCCL_HOME": nccl13, "RECSYS_HOROVOD_GPU": "1"}, tmp_path)
    assert out["flags"]["HOROVOD_GPU_OPERATIONS"] == "NCCL" and "nvcc is CUDA 13" in out["reason"]


@pytest.mark.fast
def test_installer_keeps_the_cpu_build_without_nccl_or_when_told(tmp_path):
    cuda, nccl = _fake_cuda(tmp_path, nccl_lib="libnccl.so.2")      # a wheel's layout: no libnccl.so
    out = _flags({"CUDA_HOME": cuda, "NCCL_HOME": nccl, "RECSYS_HOROVOD_GPU": "1"}, tmp_path)
    assert "HOROVOD_GPU_OPERATIONS" not in out["flags"] and out["tensorflow_extra"] == "train"
    assert "no NCCL" in out["reason"]
    cuda2, nccl2 = _fake_cuda(tmp_path / "ok")
    out = _flags({"CUDA_HOME": cuda2, "NCCL_HOME": nccl2, "RECSYS_HOROVOD_GPU": "0"}, tmp_path)
    assert "HOROVOD_GPU_OPERATIONS" not in out["flags"] and out["tensorflow_extra"] == "train"
    assert out["flags"]["HOROVOD_WITH_MPI"] == "1" and out["flags"]["HOROVOD_WITHOUT_GLOO"] == "1"


@pytest.mark.fast
def test_installer_on_this_machine_is_the_cpu_build(tmp_path):
    """No GPU here (nvidia-smi lists none): the build of today, whatever CUDA toolkit is installed."""
    out = _flags({}, tmp_path)
    assert out["tensorflow_extra"] == "train" and "HOROVOD_GPU_OPERATIONS" not in out["flags"]
