"""What TensorBoard's event files cost a training step (recsys/monitoring/tensorboard.py; issue: < 1 % of a step).

Two measurements in one run, each in interleaved pairs (sink on, sink off, on, off, ...):

* per record: ``RunLogger.step`` of a real step record into a JSON log, with the TensorBoard sink and
  without; the difference, in wall time and in CPU time of the whole process (the event writer's
  thread included, its queue flushed at the end of each block), is what a logged step pays;
* per step: ``python -m recsys.train`` DLRM runs (the stated config, ``--log-every 1``: a figure at
  every step, the worst case) with and without ``--no-tensorboard``; the ratio of their summaries'
  ``mean_step_time_ms`` (steps after the warm-up, slowest rank).

The cost share is the per-record CPU cost over the engine's mean step time of the same run, at
``--log-every 1`` and at the default 10. The emulated cluster has no GPU: a GPU step is shorter, so
the share there is larger by the ratio of step times (the per-record cost does not change).

    python bench/bench_tensorboard.py [--pairs 5] [--records 2000] [--runs 3] [--steps 300]
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

CONFIG = ["--model", "dlrm", "--synthetic", "--synthetic-rows", "65536", "--batch-size", "512", "--embedding-dim", "16",
          "--bottom-mlp", "64,16", "--top-mlp", "64,32,1", "--lr", "0.5", "--warmup-steps", "10", "--decay-steps", "0",
          "--benchmark-warmup-steps", "20", "--epochs", "1"]


def per_record(pairs, records, out_dir):
    """[(on - off) wall µs, (on - off) CPU µs] per logged step record, one per pair."""
    from recsys.monitoring.logger import RunLogger
    from recsys.monitoring.tensorboard import ScalarSink

    def block(sink, k):
        log = RunLogger(os.path.join(out_dir, f"log-{k}.jsonl"), console=open(os.devnull, "w"), progress_every=10**9,
                        sink=sink)
        wall, cpu = time.perf_counter(), time.process_time()
        for step in range(1, records + 1):
            log.step(step, 0, 0.5 + 1e-6 * step, 123456.7, total_steps=records, lr=0.01, step_time_ms=4.2)
        log.close()              # the sink's queue written out: its thread's work is in the CPU time
        return (time.perf_counter() - wall) / records * 1e6, (time.process_time() - cpu) / records * 1e6

    block(ScalarSink(os.path.join(out_dir, "tb-warm")), "warm")     # first use: imports, protobuf classes
    out = []
    for k in range(pairs):
        on = block(ScalarSink(os.path.join(out_dir, f"tb-{k}")), f"on{k}")
        off = block(None, f"off{k}")
        out.append((on[0] - off[0], on[1] - off[1]))
    return out


def engine_runs(runs, steps, out_dir):
    """[(mean step ms with event files, without)], one per interleaved pair of real runs."""
    out = []
    for k in range(runs):
        pair = []
        for tag, extra in (("on", []), ("off", ["--no-tensorboard"])):
            log = os.path.join(out_dir, f"run-{k}-{tag}.jsonl")
            cmd = [sys.executable, "-m", "recsys.train", *CONFIG, "--max-steps", str(steps), "--log-every", "1",
                   "--log-path", log, *extra]
            subprocess.run(cmd, check=True, cwd=REPO, capture_output=True)
            with open(log) as handle:
                summary = [json.loads(line) for line in handle if '"summary"' in line][-1]
            pair.append(summary["mean_step_time_ms"])
        out.append(tuple(pair))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--records", type=int, default=2000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args(argv)
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench-tb-") as tmp:
        records = per_record(args.pairs, args.records, tmp)
        runs = engine_runs(args.runs, args.steps, tmp)
    wall_us = statistics.median(r[0] for r in records)
    cpu_us = statistics.median(r[1] for r in records)
    off_ms = statistics.median(r[1] for r in runs)
    ratios = [on / off for on, off in runs]
    print(f"load average {load0:.2f} -> {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
          + (" (above the core count: the whole-run ratio is noise; the per-record cost stands)"
             if load0 > (os.cpu_count() or 1) else ""))
    print("| measurement | median | pairs |")
    print("|---|---:|---|")
    print(f"| per step record, wall (on - off) | {wall_us:.1f} us | "
          + ", ".join(f"{r[0]:.1f}" for r in records) + " |")
    print(f"| per step record, CPU of the process (on - off) | {cpu_us:.1f} us | "
          + ", ".join(f"{r[1]:.1f}" for r in records) + " |")
    print(f"| engine mean step, --no-tensorboard | {off_ms:.2f} ms | "
          + ", ".join(f"{r[1]:.2f}" for r in runs) + " |")
    print(f"| engine mean step, event files / without (--log-every 1) | {statistics.median(ratios):.3f} | "
          + ", ".join(f"{x:.3f}" for x in ratios) + " |")
    share1 = max(cpu_us, wall_us) / 1000.0 / off_ms
    print(f"cost share: {100 * share1:.3f} % of a step at --log-every 1, {100 * share1 / 10:.3f} % at the default 10 "
          f"(per-record cost {max(cpu_us, wall_us):.1f} us / {off_ms:.2f} ms)")
    print("reproduce: python bench/bench_tensorboard.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])))
    return 0 if share1 < 0.01 else 1     # < 1 % even with a figure at every step


if __name__ == "__main__":
    sys.exit(main())
