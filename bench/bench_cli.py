"""CLI cold start: `recsys-submit --help` and `recsys-submit render` against `python -c pass`,
interleaved, plus proof that no TensorFlow/Spark/numpy/submitit module is imported.

With --against TREE (a pristine checkout of an earlier commit, e.g. made with
`git worktree add --detach /tmp/seam-base 49b40c7`), the same two commands also run as
`python -m jobs.cli` in this tree and in TREE, alternating within every round, and the ratio
this/TREE is printed (median of the per-round ratios): > 1 means this tree is slower.

Reproduce: .venv/bin/python bench/bench_cli.py [--repeat 20] [--against /tmp/seam-base]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("tensorflow", "pyspark", "horovod", "keras", "numpy", "pandas", "pyarrow", "submitit", "mpi4py")


def timed(argv, cwd=REPO):
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return elapsed


def loaded_modules(args):
    """Top-level modules imported by one CLI call (python -X importtime)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "jobs.cli", *args], cwd=REPO,
                          capture_output=True, text=True)
    names = set()
    for line in proc.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def jobs_location(tree):
    """Where `python -m jobs.cli` run in `tree` imports jobs from (each tree must use its own)."""
    proc = subprocess.run([sys.executable, "-c", "import jobs, os; print(os.path.dirname(jobs.__file__))"],
                          cwd=tree, capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def compare(against, render, repeat):
    """Paired rounds: both trees run both commands; the order of the trees flips every round."""
    trees = {"this": REPO, "base": os.path.abspath(against)}
    for label, tree in trees.items():
        found = jobs_location(tree)
        if os.path.realpath(found) != os.path.realpath(os.path.join(tree, "jobs")):
            raise SystemExit(f"{label} tree {tree} imports jobs from {found}; cannot compare")
    commands = {"--help": ["--help"], "render (dgxa100, 2 nodes)": render}
    times = {(c, t): [] for c in commands for t in trees}
    for round_index in range(repeat):
        order = list(trees) if round_index % 2 == 0 else list(reversed(trees))
        for command, cli_args in commands.items():
            for label in order:
                argv = [sys.executable, "-m", "jobs.cli", *cli_args]
                times[(command, label)].append(timed(argv, cwd=trees[label]))
    print(f"\nthis tree vs {trees['base']}: `python -m jobs.cli ...`, {repeat} paired rounds, seconds")
    print(f"{'command':<30} {'this med':>9} {'base med':>9} {'ratio (median of pairs)':>24} {'min/min':>8}")
    for command in commands:
        ours, base = times[(command, "this")], times[(command, "base")]
        ratio = statistics.median(o / b for o, b in zip(ours, base))
        print(f"{command:<30} {statistics.median(ours):9.3f} {statistics.median(base):9.3f} "
              f"{ratio:23.3f}x {min(ours) / min(base):7.3f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--against", metavar="TREE",
                        help="pristine checkout to compare with (ratio this/TREE, same run)")
    args = parser.parse_args()
    script = os.path.join(os.path.dirname(sys.executable), "recsys-submit")
    render = ["render", "train", "--profile", "dgxa100", "--model", "dlrm", "--nodes", "2"]
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "recsys-submit --help": [script, "--help"],
        "recsys-submit render (dgxa100, 2 nodes)": [script, *render],
    }
    times = {name: [] for name in cases}
    for _ in range(args.repeat):            # interleaved: every round runs every case once
        for name, argv in cases.items():
            times[name].append(timed(argv))
    base = statistics.median(times["python -c pass"])
    print(f"CLI cold start, {args.repeat} runs each, interleaved, median (min) seconds")
    print(f"{'command':<42} {'median':>8} {'min':>8} {'vs python':>10}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:<42} {med:8.3f} {min(values):8.3f} {med / base:9.2f}x")
    for label, cli_args in (("--help", ["--help"]), ("render", render)):
        heavy = sorted(m for m in loaded_modules(cli_args) if m in HEAVY)
        print(f"heavy modules imported by `recsys-submit {label}`: {heavy or 'none'} "
              f"(checked: {', '.join(HEAVY)})")
    if args.against:
        compare(args.against, render, args.repeat)
    again = f" --against {args.against}" if args.against else ""
    print(f"reproduce: {sys.executable} bench/bench_cli.py --repeat {args.repeat}{again}")


if __name__ == "__main__":
    main()
