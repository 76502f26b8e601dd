"""One rank's step at several batch sizes: the measured compute curve `study project
--compute-curve` stands on (docs/studies.md, "The model, part by part").

Runs the emulated study's 1-rank step (docs/studies/emulated-dlrm-strong.yaml: tiny DLRM,
recsys-train --run-mode benchmark, one process, no exchange) at each batch, one at a time,
twice in alternating order (largest first, then smallest first), and prints a compute-curve file
(version 1: source, points of batch_per_gpu and the median of the two runs' step ms): the
per-rank batches of the study's 1/2/4/8-rank points by default.

    .venv/bin/python bench/bench_compute_curve.py [--batches 64,128,256,512] > bench/emulated-dlrm-compute-curve.yaml

Each run starts only once the host's 1-minute load average is below --max-load (other
sessions' jobs share these cores); the range is printed into the source line.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from bench.bench_core_sharing import engine_argv, run_copies, wait_quiet  # noqa: E402


def step_ms(batch, steps, tmp):
    """The median timed step (ms) of one copy at a global batch of `batch` on one rank."""
    argv = engine_argv(steps)
    at = argv.index("--batch-size")
    argv[at + 1] = str(batch)
    records = run_copies(1, steps, tmp, argv=argv)[0]["steps"]
    return statistics.median(ms for _, _, ms in records)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="64,128,256,512")
    ap.add_argument("--steps", type=int, default=400, help="timed steps per run")
    ap.add_argument("--max-load", type=float, default=2.5,
                    help="start each run only below this 1-minute load average (default 2.5)")
    ap.add_argument("--wait", type=float, default=600, help="seconds to wait for that, per run")
    args = ap.parse_args(argv)
    batches = sorted({int(b) for b in args.batches.split(",")})
    runs, loads = {b: [] for b in batches}, []
    with tempfile.TemporaryDirectory() as tmp:
        for order in (batches[::-1], batches):
            for b in order:
                loads.append(wait_quiet(args.max_load, args.wait))
                runs[b].append(step_ms(b, args.steps, tmp))
                print(f"batch {b}: {runs[b][-1]:.3f} ms (load average {loads[-1]:.1f})", file=sys.stderr)
    load0, load1 = min(loads), max(loads)
    out = {"version": 1,
           "source": f"measured: bench/bench_compute_curve.py, the 1-rank step of "
                     f"docs/studies/emulated-dlrm-strong.yaml (recsys-train --run-mode benchmark, {args.steps} timed "
                     f"steps, median of 2 alternating runs), "
                     f"{time.strftime('%Y-%m-%d')}, load average {load0:.1f}-{load1:.1f}",
           "points": [{"batch_per_gpu": b, "step_ms": round(statistics.median(runs[b]), 4),
                       "runs_ms": [round(x, 4) for x in runs[b]]} for b in batches]}
    print(yaml.safe_dump(out, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
