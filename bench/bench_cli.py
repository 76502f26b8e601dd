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
import resource
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("tensorflow", "pyspark", "horovod", "keras", "numpy", "pandas", "pyarrow", "submitit", "mpi4py")


def _child_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv, cwd=REPO, cpu=False, env=None):
    """Wall seconds of one run; with cpu, (wall, user+sys CPU seconds of the child), the CPU
    time being far less disturbed than wall time by other load on a shared machine."""
    cpu_before = _child_cpu()
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return (elapsed, _child_cpu() - cpu_before) if cpu else elapsed


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


def bytecode_envs(cache_dir):
    """Two ways a CLI process finds its modules: compiled bytecode cached (as after a pip
    install; kept in `cache_dir`, out of the trees) and compiled from source on every call
    (PYTHONDONTWRITEBYTECODE=1, as on the CI machine)."""
    cached = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = cache_dir
    source = {k: v for k, v in os.environ.items() if k != "PYTHONPYCACHEPREFIX"}
    source["PYTHONDONTWRITEBYTECODE"] = "1"
    return {"pyc cached": cached, "no pyc": source}


def compare(against, render, repeat):
    """Paired rounds: both trees run both commands; the order of the trees flips every round."""
    import tempfile

    trees = {"this": REPO, "base": os.path.abspath(against)}
    for label, tree in trees.items():
        found = jobs_location(tree)
        if os.path.realpath(found) != os.path.realpath(os.path.join(tree, "jobs")):
            raise SystemExit(f"{label} tree {tree} imports jobs from {found}; cannot compare")
    commands = {"--help": ["--help"], "render (dgxa100, 2 nodes)": render}
    with tempfile.TemporaryDirectory(prefix="bench-cli-pyc-") as cache_dir:
        envs = bytecode_envs(cache_dir)
        times = {(c, t, m): [] for c in commands for t in trees for m in envs}
        for round_index in range(repeat + 1):       # round 0 fills the bytecode cache, not counted
            order = list(trees) if round_index % 2 == 0 else list(reversed(trees))
            for mode, env in envs.items():
                for command, cli_args in commands.items():
                    for label in order:
                        argv = [sys.executable, "-m", "jobs.cli", *cli_args]
                        sample = timed(argv, cwd=trees[label], cpu=True, env=env)
                        if round_index:
                            times[(command, label, mode)].append(sample)
    print(f"\nthis tree vs {trees['base']}: `python -m jobs.cli ...`, {repeat} paired rounds, seconds; "
          "ratio = median of the per-round ratios this/base (> 1: this tree is slower)")
    print(f"{'command':<28} {'bytecode':>10} {'clock':>5} {'this med':>9} {'base med':>9} {'ratio':>7} "
          f"{'min/min':>8}")
    for command in commands:
        for mode in envs:
            for index, clock in ((0, "wall"), (1, "cpu")):
                ours = [t[index] for t in times[(command, "this", mode)]]
                base = [t[index] for t in times[(command, "base", mode)]]
                ratio = statistics.median(o / b for o, b in zip(ours, base))
                print(f"{command:<28} {mode:>10} {clock:>5} {statistics.median(ours):9.3f} "
                      f"{statistics.median(base):9.3f} {ratio:6.3f}x {min(ours) / min(base):7.3f}x")


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
