"""CLI cold start: `recsys-submit --help` and `recsys-submit render` against `python -c pass`,
interleaved, plus proof that no TensorFlow/Spark/numpy/submitit module is imported.

Reproduce: .venv/bin/python bench/bench_cli.py [--repeat 20]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("tensorflow", "pyspark", "horovod", "keras", "numpy", "pandas", "pyarrow", "submitit", "mpi4py")


def timed(argv):
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
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
    print(f"reproduce: {sys.executable} bench/bench_cli.py --repeat {args.repeat}")


if __name__ == "__main__":
    main()
