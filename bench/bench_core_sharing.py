"""How much slower one rank's step runs when k ranks share a host's cores: the `ci` profile's
measured `fabric.core_sharing` (docs/profiles.md, "Fabric"; docs/studies.md, "The model, part by part").

The emulated cluster puts up to 8 ranks on this host's 2 cores. This runs the emulated study's
1-rank step (docs/studies/emulated-dlrm-strong.yaml: tiny DLRM, batch 512, recsys-train
--run-mode benchmark) as k concurrent copies of itself, k = 1, 2, 4, 8, then k = 1 again, and
measures over the window in which all k copies ran their timed steps (from the step records'
wall times) each copy's CPU time per step (user + system, /proc/PID/stat polled every 0.1 s).
The slowdown of k ranks on C cores is max(1, k/C) x CPU per step at k / CPU per step alone: an
even share of the cores times the extra CPU work k processes cost each other (thread pools that
outnumber the cores, context switches). CPU time, not wall time, because this shared host is
rarely quiet: other sessions' processes take cores from every copy and would shrink a wall-time
ratio toward 1; the wall-time ratio under the measured load is printed beside it. The copies
are plain processes on this host, as the emulated nodes' ranks are; no MPI (the 1-rank step).

    .venv/bin/python bench/bench_core_sharing.py [--copies 1,2,4,8] [--steps-per-copy 300]

--max-load: start each measurement only below this 1-minute load average (the range is
printed into the source line). Prints the `core_sharing:` mapping of
cluster_profiles/ci.yaml's fabric.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDY = os.path.join(ROOT, "docs", "studies", "emulated-dlrm-strong.yaml")
WARMUP = 20
LOG_EVERY = 8


def engine_argv(steps):
    with open(STUDY) as f:
        spec = yaml.safe_load(f)
    return [sys.executable, "-m", "recsys.train", "--model", spec["model"], "--run-mode", "benchmark", "--synthetic",
            "--batch-size", str(spec["batch_size"]), *spec["engine_args"], "--benchmark-warmup-steps", str(WARMUP),
            "--benchmark-steps", str(steps), "--log-every", str(LOG_EVERY), "--no-tensorboard"]


def run_copies(k, steps, tmp, argv=None):
    """k concurrent copies (of `argv`, default the study's 1-rank step); per copy its timed step
    records [(wall time, step ms)]."""
    env = dict(os.environ, RECSYS_DEVICE="cpu", PYTHONPATH=ROOT)
    procs, logs = [], []
    for i in range(k):
        log = os.path.join(tmp, f"k{k}-{i}-{time.time_ns()}.jsonl")
        logs.append(log)
        procs.append(subprocess.Popen((argv or engine_argv(steps)) + ["--log-path", log], cwd=ROOT, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    cpu = [[] for _ in procs]       # per copy [(wall time, CPU seconds so far)], polled
    while any(p.poll() is None for p in procs):
        for i, p in enumerate(procs):
            used = cpu_seconds(p.pid)
            if used is not None:
                cpu[i].append((time.time(), used))
        time.sleep(0.1)
    for p in procs:
        err = p.stderr.read()
        p.wait()
        if p.returncode != 0:
            raise SystemExit(f"a copy of recsys-train exited {p.returncode}: {(err.strip().splitlines() or [''])[-1]}")
    out = []
    for i, log in enumerate(logs):
        with open(log) as f:
            recs = [json.loads(line) for line in f]
        out.append({"steps": [(r["time"], r["step"], r["step_time_ms"]) for r in recs
                              if r.get("type") == "step" and r.get("step", 0) > WARMUP + LOG_EVERY
                              and r.get("step_time_ms")],
                    "cpu": cpu[i]})
    return out


def cpu_seconds(pid):
    """User + system CPU seconds of a process (/proc/PID/stat), None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _at(samples, t):
    """A polled counter at wall time t (linear between the samples around it)."""
    for (t0, v0), (t1, v1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            return v0 + (v1 - v0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)
    return None


def wait_quiet(max_load, timeout_s):
    """Poll until the host's 1-minute load average is below `max_load` (other sessions' jobs
    share these cores and would be measured too); SystemExit after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while os.getloadavg()[0] >= max_load:
        if time.monotonic() > deadline:
            raise SystemExit(f"the host's load average stayed at or above {max_load} for {timeout_s:.0f} s "
                             f"(now {os.getloadavg()[0]:.1f}): not measured; rerun on a quiet machine")
        time.sleep(5)
    return os.getloadavg()[0]


def overlapped(copies):
    """Over the window in which all copies ran timed steps: the median over the copies of each
    one's median step ms (wall), and of its CPU ms per step (user + system, polled); the
    window's length in seconds."""
    start = max(c["steps"][0][0] for c in copies)
    end = min(c["steps"][-1][0] for c in copies)
    wall, cpu = [], []
    for c in copies:
        inside = [r for r in c["steps"] if start <= r[0] <= end]
        if len(inside) < 3:
            raise SystemExit(f"the {len(copies)} copies' timed steps overlapped for too few records "
                             f"({len(inside)}); raise --steps-per-copy")
        wall.append(statistics.median(ms for _, _, ms in inside))
        (ta, sa, _), (tb, sb, _) = inside[0], inside[-1]
        ca, cb = _at(c["cpu"], ta), _at(c["cpu"], tb)
        if ca is None or cb is None or sb <= sa:
            raise SystemExit("a copy's CPU time was not sampled across its timed steps")
        cpu.append((cb - ca) * 1000.0 / (sb - sa))
    return statistics.median(wall), statistics.median(cpu), end - start



def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", default="1,2,4,8", help="the k to measure (1 is measured first and last)")
    ap.add_argument("--steps-per-copy", type=int, default=300, help="timed steps per copy, times k")
    ap.add_argument("--max-load", type=float, default=1e9,
                    help="start each measurement only below this 1-minute load average (default: any)")
    ap.add_argument("--wait", type=float, default=600, help="seconds to wait for that, per measurement")
    args = ap.parse_args(argv)
    ks = sorted({int(k) for k in args.copies.split(",")} - {1})
    wall, cpu, loads = {}, {}, []
    with tempfile.TemporaryDirectory() as tmp:
        ones = []
        for k in [1] + ks + [1]:
            loads.append(wait_quiet(args.max_load, args.wait))
            w, c, window = overlapped(run_copies(k, args.steps_per_copy * k, tmp))
            if k == 1:
                ones.append((w, c))
            else:
                wall[k], cpu[k] = w, c
            print(f"k={k}: median step {w:.3f} ms wall, {c:.3f} ms CPU, over a {window:.1f} s window of all "
                  f"{k} copies (load average {loads[-1]:.1f} at its start)", file=sys.stderr)
    wall1 = statistics.mean(w for w, _ in ones)
    cpu1 = statistics.mean(c for _, c in ones)
    load0, load1 = min(loads), max(loads)
    cores = os.cpu_count()
    print("wall / 1 copy (under this load): " + ", ".join(f"k={k} {wall[k] / wall1:.2f}" for k in ks), file=sys.stderr)
    section = {"core_sharing": {
        "source": f"measured: bench/bench_core_sharing.py, k concurrent copies of the 1-rank step of "
                  f"docs/studies/emulated-dlrm-strong.yaml on this host's {cores} cores, {time.strftime('%Y-%m-%d')}: "
                  f"max(1, k/{cores}) x CPU ms per step at k / alone ({cpu1:.3f} ms; "
                  + ", ".join(f"k={k} {cpu[k]:.3f}" for k in ks) + f"), load average {load0:.1f}-{load1:.1f}",
        "cores": cores,
        "slowdown": {1: 1.0, **{k: round(max(1.0, k / cores) * cpu[k] / cpu1, 3) for k in ks}}}}
    print(yaml.safe_dump(section, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
