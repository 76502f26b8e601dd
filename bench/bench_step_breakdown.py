"""Does ``--breakdown-steps`` change the throughput of a benchmark's fused timed steps? (DLRM, 1 rank)

The same ``recsys-train --run-mode benchmark`` run (tiny DLRM on a synthetic dataset written once),
without and with ``--breakdown-steps``, in back-to-back pairs whose order alternates (A B, B A,
A B, ...) so that drift of the machine and the second run of a pair being warmer hit both alike. The
breakdown steps run after the timed steps, so the throughput of the timed (fused) steps should not
move: the median over the pairs of the ratio with / without is checked against ``--tolerance``
(3 %), with the geometric mean of the ratios and a Wilcoxon signed-rank p (scipy) beside it. Prints
a markdown table, the ratio, the last run's step breakdown (split / timed step, the measured
remainder) and the reproduce command.

    python bench/bench_step_breakdown.py [--repeats 6] [--steps 2000] [--warmup 20] \
        [--breakdown-steps 20]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["--model", "dlrm", "--embedding-dim", "8", "--bottom-mlp", "16,8", "--top-mlp", "32,16,1",
         "--batch-size", "256", "--lr", "0.5", "--warmup-steps", "4", "--decay-start-step", "100000",
         "--decay-steps", "0", "--run-mode", "benchmark", "--log-every", "100000"]


def make_data(root):
    from recsys.data import synthetic
    synthetic.generate(synthetic.default_spec("dlrm", num_files=2), root, {"train": 8192, "test": 1024}, seed=3)
    return root


def run(data, workdir, name, steps, warmup, breakdown):
    log = os.path.join(workdir, f"{name}.jsonl")
    cmd = [sys.executable, "-m", "recsys.train", *FLAGS, "--data-path", data, "--benchmark-steps", str(steps),
           "--benchmark-warmup-steps", str(warmup), "--breakdown-steps", str(breakdown), "--log-path", log]
    env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
    res = subprocess.run(cmd, env=env, cwd=REPO, text=True, capture_output=True)
    if res.returncode != 0:
        raise SystemExit(f"{name} failed (exit {res.returncode}): {res.stderr.strip()[-500:]}")
    with open(log) as f:
        return [r for r in map(json.loads, filter(str.strip, f)) if r["type"] == "summary"][-1]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=6, help="pairs (one run without, one with, order alternating)")
    p.add_argument("--steps", type=int, default=2000, help="timed (fused) steps per run")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--breakdown-steps", type=int, default=20)
    p.add_argument("--tolerance", type=float, default=0.03, help="allowed |ratio - 1|")
    args = p.parse_args(argv)
    sys.path.insert(0, REPO)
    with tempfile.TemporaryDirectory(prefix="bench-breakdown-") as work:
        data = make_data(os.path.join(work, "data"))
        rows = {"without": [], "with": []}
        for k in range(args.repeats):
            pair = (("without", 0), ("with", args.breakdown_steps))
            for label, n in (pair if k % 2 == 0 else pair[::-1]):
                s = run(data, work, f"{label}-{k}", args.steps, args.warmup, n)
                rows[label].append(s)
                print(f"# repeat {k} {label}: {s['throughput_samples_per_s']:.0f} samples/s", file=sys.stderr,
                      flush=True)
    med = {label: statistics.median(s["throughput_samples_per_s"] for s in runs) for label, runs in rows.items()}
    # each repeat's pair ran back to back: the median of the pairs' ratios is the figure checked
    pairs = [w["throughput_samples_per_s"] / o["throughput_samples_per_s"]
             for w, o in zip(rows["with"], rows["without"])]
    ratio = statistics.median(pairs)
    geomean = math.exp(statistics.fmean(math.log(r) for r in pairs))
    try:
        from scipy.stats import wilcoxon
        p_value = f"{wilcoxon([math.log(r) for r in pairs]).pvalue:.3f}"
    except (ImportError, ValueError):
        p_value = "n/a"
    print(f"DLRM tiny (batch 256, dims 8), 1 rank, {args.steps} timed steps after {args.warmup} warm-up, "
          f"{args.repeats} back-to-back pairs, order alternating; 'with' adds --breakdown-steps "
          f"{args.breakdown_steps}.\n")
    print("| run | throughput samples/s (each repeat) | median | mean step ms (median) |")
    print("|---|---|---|---|")
    for label, runs in rows.items():
        each = ", ".join(f"{s['throughput_samples_per_s']:.0f}" for s in runs)
        step = statistics.median(s["mean_step_time_ms"] for s in runs)
        print(f"| {label} --breakdown-steps | {each} | {med[label]:.0f} | {step:.3f} |")
    ok = abs(ratio - 1) <= args.tolerance
    print(f"\nthroughput ratio with / without, median of the {len(pairs)} back-to-back pairs "
          f"({', '.join(f'{r:.3f}' for r in pairs)}): {ratio:.3f} ({'within' if ok else 'OUTSIDE'} "
          f"{args.tolerance:.0%}); geometric mean {geomean:.3f}; Wilcoxon signed-rank p {p_value}; "
          f"ratio of the medians: {med['with'] / med['without']:.3f}")
    b = rows["with"][-1]["step_breakdown"]
    split = [s["step_breakdown"].get("split_over_timed") for s in rows["with"]]
    print(f"\nsplit step / timed step of each 'with' run: {', '.join('-' if r is None else f'{r:.2f}' for r in split)}")
    print(f"\nstep_breakdown of the last 'with' run (version {b['version']}, mean of {b['steps']} split steps; "
          f"timed step {rows['with'][-1]['mean_step_time_ms']:.3f} ms):\n")
    print("| " + " | ".join(["step_ms"] + [f"{x}_ms" for x in b["phases"]]) + " |")
    print("|" + "---|" * (1 + len(b["phases"])))
    print("| " + " | ".join(f"{b['mean'][k]:.3f}" for k in ["step_ms"] + [f"{x}_ms" for x in b["phases"]]) + " |")
    print("\nreproduce: python " + " ".join(shlex.quote(x) for x in ["bench/bench_step_breakdown.py",
                                                                      *(argv or sys.argv[1:])]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
