"""The hardware sampler on a sick node (issue 47, items 3 and 4): nvidia-smi outputs of a GPU that
fell off the bus, of a GPU whose handle could not be had and of "No devices were found"
(tests/jobs/recorded/nvidia-smi/README.md says how they were written), played by a stand-in
`nvidia-smi` on PATH that prints them, fails or hangs in the order a test gives; the sampler keeps
sampling, records each error and keeps the healthy GPUs' rows, a hung call costs at most the
bounded wait (also when the batch script ends the sampler), and the report warns per GPU and
node. The job's CPUs from its cgroup's cpuset on fixed cgroup v1 and v2 trees."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.runs import hwsamples
from slurm import hwsample

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]
RECORDED = Path(__file__).resolve().parent / "recorded" / "nvidia-smi"
STAND_IN = """#!/bin/bash
# nvidia-smi stand-in: call N plays line N of $SMI_PLAN (the last line again after the end)
n=$(( $(cat "$SMI_DIR/calls" 2>/dev/null || echo 0) + 1 )); echo "$n" > "$SMI_DIR/calls"
step=$(sed -n "${n}p" "$SMI_PLAN"); [ -n "$step" ] || step=$(tail -n 1 "$SMI_PLAN")
set -- $step
case "$1" in
  ok)   cat "$SMI_REC/$2" ;;
  fail) cat "$SMI_REC/$3"; exit "$2" ;;
  hang) exec sleep 60 ;;
esac
"""


@pytest.fixture
def smi(tmp_path, monkeypatch):
    """plan(lines) -> the stand-in's directory; `calls` there counts its calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(STAND_IN)
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SMI_DIR", str(tmp_path))
    monkeypatch.setenv("SMI_REC", str(RECORDED))
    monkeypatch.setenv("SMI_PLAN", str(tmp_path / "plan"))

    def plan(*steps):
        (tmp_path / "plan").write_text("\n".join(steps) + "\n")
        return tmp_path
    return plan


def _calls(directory):
    path = Path(directory, "calls")
    return int(path.read_text()) if path.exists() else 0


def test_sick_outputs_keep_the_healthy_gpus_rows():
    rows, problems = hwsample.parse_gpu_output((RECORDED / "dgxa100-gpu-requires-reset.csv").read_text())
    assert [r["index"] for r in rows] == list(range(8)) and problems == []
    assert rows[3] == {"index": 3, "name": None, "util_pct": None, "mem_used_mib": None, "mem_total_mib": None,
                       "power_w": None, "sm_mhz": None, "base_mhz": None, "error": "[GPU requires reset]"}
    assert rows[4]["util_pct"] == 31 and "error" not in rows[4]
    rows, problems = hwsample.parse_gpu_output((RECORDED / "dgxa100-device-handle-unknown-error.txt").read_text())
    assert [r["index"] for r in rows] == [0, 1, 3, 4, 5, 6, 7]
    assert problems == ["Unable to determine the device handle for GPU0000:47:00.0: Unknown Error"]
    assert hwsample.parse_gpu_output((RECORDED / "no-devices-were-found.txt").read_text()) == \
        ([], ["No devices were found"])
    healthy = hwsample.parse_gpu_output((RECORDED / "dgxa100-idle-not-supported.csv").read_text())
    assert healthy[1] == [] and not any("error" in r for r in healthy[0])     # [N/A] is not sick


def test_sampling_goes_on_through_failures_and_a_hang_and_the_report_warns(smi, tmp_path):
    calls = smi("ok dgxa100-80gb-training.csv", "fail 6 no-devices-were-found.txt", "hang",
                "fail 15 dgxa100-gpu-requires-reset.csv", "fail 255 dgxa100-device-handle-unknown-error.txt",
                "ok dgxa100-80gb-training.csv")
    out = tmp_path / "hw"
    sampler = hwsample.Sampler(str(out), interval=0.01, host="dgx01", gpus=hwsample.GpuReader(timeout=0.5))
    took = []
    for _ in range(6):
        start = time.monotonic()
        sampler.sample()
        took.append(time.monotonic() - start)
    sampler.write()
    assert _calls(calls) == 6 and max(took) < 5                   # asked every time; the hang cost its bound
    s = json.loads((out / "dgx01.json").read_text())["samples"]
    assert len(s[0]["gpus"]) == 8 and "gpu_error" not in s[0]
    assert s[1]["gpus"] == [] and s[1]["gpu_error"] == "nvidia-smi exit 6: No devices were found"
    assert s[2]["gpus"] == [] and s[2]["gpu_error"].startswith("nvidia-smi gave no answer in 0.5 s (killed")
    assert len(s[3]["gpus"]) == 8 and s[3]["gpus"][3]["error"] == "[GPU requires reset]"
    assert s[3]["gpu_error"] == "nvidia-smi exit 15; GPU 3: [GPU requires reset]"
    assert [g["index"] for g in s[4]["gpus"]] == [0, 1, 3, 4, 5, 6, 7]
    assert s[4]["gpu_error"] == "nvidia-smi exit 255: Unable to determine the device handle for GPU0000:47:00.0: Unknown Error"
    assert len(s[5]["gpus"]) == 8 and "gpu_error" not in s[5]

    # the report: every sample is inside the timed steps; one warning per node and per sick GPU
    logs = tmp_path / "run" / "logs"
    (logs / "main-5.hw").mkdir(parents=True)
    (logs / "main-5.engine.jsonl").write_text(
        json.dumps({"type": "startup", "phase": "first_step", "time": s[0]["t"] - 1}) + "\n")
    (logs / "main-5.hw" / "dgx01.json").write_text((out / "dgx01.json").read_text())
    hw = hwsamples.medians(str(tmp_path / "run"))
    lines = [line for line in hwsamples.warnings("p", hw, min_utilization=0, base_mhz=1) if "reading" in line
             or "nvidia-smi" in line]
    assert lines == ["p: nvidia-smi on dgx01 failed in 2 of 6 samples: nvidia-smi exit 6: No devices were found",
                     "p: GPU 2 on dgx01 had no reading in 1 of 6 samples (no row)",
                     "p: GPU 3 on dgx01 had no reading in 1 of 6 samples ([GPU requires reset])"]
    assert [g["index"] for g in hw["gpus"]] == list(range(8)) and hw["gpus"][3]["util_pct"] == 96


def test_no_second_call_while_a_killed_one_is_still_alive(smi):
    calls = smi("ok dgxa100-80gb-training.csv")
    reader = hwsample.GpuReader(timeout=2)
    stuck = subprocess.Popen(["sleep", "60"])        # plays a call a kill could not end (hung in the kernel)
    reader._hung = (stuck, time.monotonic())
    try:
        rows, error = reader.read()
        assert rows == [] and error.startswith(f"nvidia-smi (pid {stuck.pid}) still hung after")
        assert _calls(calls) == 0
    finally:
        stuck.kill()
        stuck.wait()
    rows, error = reader.read()                        # it exited: asked again
    assert len(rows) == 8 and error is None and _calls(calls) == 1


def test_no_nvidia_smi_is_not_asked_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    sampler = hwsample.Sampler(str(tmp_path / "hw"), interval=0.01, host="cpu01")
    first, second = sampler.sample(), sampler.sample()
    assert "gpus" not in first and "gpu_error" not in first and sampler.gpus.absent and "gpus" not in second


def test_the_sampler_ends_promptly_while_nvidia_smi_hangs(smi, tmp_path):
    """The batch script ends the sampler with SIGUSR1 and waits for it: a hung call must not hold it."""
    calls = smi("hang")
    out = tmp_path / "hw"
    env = dict(os.environ, SLURMD_NODENAME="dgx02")
    proc = subprocess.Popen([sys.executable, str(REPO / "slurm" / "hwsample.py"), "--out", str(out),
                             "--interval", "0.1", "--gpu-timeout", "0.5"], env=env)
    try:
        deadline = time.monotonic() + 30
        while _calls(calls) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert _calls(calls) >= 2                       # a second call after the first was killed
        stopped = time.monotonic()
        proc.send_signal(signal.SIGUSR1)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - stopped < 3            # at most the bounded wait, not the hang (60 s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    samples = json.loads((out / "dgx02.json").read_text())["samples"]
    assert samples and all(s["gpus"] == [] and "gave no answer in 0.5 s" in s["gpu_error"] for s in samples)


def test_the_jobs_cpus_come_from_its_cgroup(tmp_path):
    root = tmp_path / "cgroup"
    v2 = root / "system.slice" / "slurmstepd.scope" / "job_77"
    v2.mkdir(parents=True)
    (v2 / "cpuset.cpus.effective").write_text("0-15,128-143\n")
    proc = tmp_path / "proc-cgroup"
    proc.write_text("0::/system.slice/slurmstepd.scope/job_77/step_3/user/task_0\n")
    cpus, source = hwsample.job_cpus("77", str(proc), str(root))
    assert cpus == list(range(16)) + list(range(128, 144)) and source.startswith("job cgroup (")
    v1 = root / "cpuset" / "slurm" / "uid_1000" / "job_78"
    v1.mkdir(parents=True)
    (v1 / "cpuset.effective_cpus").write_text("4-7\n")
    proc.write_text("12:memory:/slurm/uid_1000/job_78/step_0/task_0\n"
                    "5:cpuset:/slurm/uid_1000/job_78/step_0/task_0\n")
    assert hwsample.job_cpus("78", str(proc), str(root))[0] == [4, 5, 6, 7]
    # another job's cgroup, or none: this process's affinity
    assert hwsample.job_cpus("79", str(proc), str(root)) == (sorted(os.sched_getaffinity(0)), "affinity")
    assert hwsample.job_cpus("", str(tmp_path / "none"), str(root))[1] == "affinity"
