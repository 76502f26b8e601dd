"""Cost of the hardware sampler (slurm/hwsample.py, issue 35 item 5) against a training step.

Two measurements in one run, on this machine:
1. the sampler's own CPU time per sample (its process and the nvidia-smi it starts, where there is
   one), over --samples samples taken back to back: at one sample a second that is the share of one
   core it takes, and of the node's cores;
2. the engine's benchmark throughput (one rank, `python -m recsys.train --run-mode benchmark`) with
   the sampler running beside it at 1 Hz and without it (the baseline), alternating --rounds times;
   the ratio of the medians. On a shared box the noise between runs can exceed the sampler's cost:
   read (1) as the bound and (2) as the check that nothing else (a lock, a sync) slows the step.

    python bench/bench_hwsample.py [--samples 200] [--rounds 3] [--steps 3000]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def cpu_per_sample(samples):
    """CPU seconds (this process and its children) per sample, over `samples` samples."""
    from slurm.hwsample import Sampler

    with tempfile.TemporaryDirectory() as out:
        sampler = Sampler(out, interval=1.0, host="bench")
        def cpu():
            me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
        t0, wall = cpu(), time.perf_counter()
        for k in range(samples):
            sampler.sample()
            if (k + 1) % 5 == 0:
                sampler.write()
        return (cpu() - t0) / samples, (time.perf_counter() - wall) / samples, sampler.gpus


def throughput(steps, log):
    cmd = [sys.executable, "-m", "recsys.train", "--model", "ncf", "--synthetic", "--run-mode", "benchmark",
           "--batch-size", "4096", "--benchmark-warmup-steps", "20", "--benchmark-steps", str(steps),
           "--factors", "4", "--layers", "16,8,4", "--log-path", log]
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, env=dict(os.environ, PYTHONPATH=REPO))
    with open(log) as handle:
        summary = [json.loads(line) for line in handle if '"type": "summary"' in line][-1]
    return summary["throughput_samples_per_s"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3000)
    a = p.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    per_sample, wall, gpus = cpu_per_sample(a.samples)
    print(f"command: python bench/bench_hwsample.py {' '.join(shlex.quote(x) for x in (argv or sys.argv[1:]))}")
    print(f"sampler: {per_sample * 1000:.2f} ms CPU and {wall * 1000:.2f} ms wall per sample "
          f"({'with' if gpus else 'without'} nvidia-smi); at 1 Hz {per_sample * 100:.3f} % of one core, "
          f"{per_sample * 100 / cores:.3f} % of this machine's {cores} cores")
    with_s, without = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            without.append(throughput(a.steps, os.path.join(tmp, f"off-{r}.jsonl")))
            sampler = subprocess.Popen([sys.executable, "-m", "slurm.hwsample", "--out", os.path.join(tmp, f"hw-{r}")],
                                       cwd=REPO, env=dict(os.environ, PYTHONPATH=REPO))
            try:
                with_s.append(throughput(a.steps, os.path.join(tmp, f"on-{r}.jsonl")))
            finally:
                sampler.terminate()
                sampler.wait(timeout=30)
    ratio = statistics.median(with_s) / statistics.median(without)
    print(f"engine benchmark (1 rank, NCF, {a.steps} timed steps), samples/s without the sampler: "
          f"{', '.join(f'{v:,.0f}' for v in without)}; with it at 1 Hz: {', '.join(f'{v:,.0f}' for v in with_s)}")
    print(f"ratio of the medians (with / without): {ratio:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
