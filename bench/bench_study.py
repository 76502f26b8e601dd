"""Submitting and polling a 12-point scaling study on the local Slurm cluster.

1. One `recsys-submit study run` call for a 12-point study (DLRM, gpus 1,2,4,8 x precision
   tf32/fp32/amp) against raw `sbatch --parsable` of the very 12 scripts it rendered, one sbatch
   process per script as a user would type them; interleaved round by round, median ratio.
   Goal: at most 1.5x (one CLI process per job, the old way, costs ~17x).
2. Polling the study: Slurm calls per `recsys-submit study status` (counted by PATH shims that
   log and exec the real squeue/sacct/scontrol), against `recsys-submit status` of each point.

Like bench/bench_submit.py it brings up a private cluster and sets the partition DOWN, so the
jobs stay pending and only submission and polling are measured. Timings on a shared 2-core
machine are noisy; the ratio within one run is what counts.

Reproduce: .venv/bin/python bench/bench_study.py [--rounds 5]
"""

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_submit import REPO, counting_env, pending_cluster, timed  # noqa: E402  (the shared shim and timer)

SWEEP = ["--profile", "ci", "--model", "dlrm", "--gpus", "1,2,4,8", "--variant", "precision=tf32,fp32,amp",
         "--batch-size", "4096", "--warmup-steps", "2", "--steps", "5", "--time", "5"]


def study_dir_of(stdout):
    return next(line[10:] for line in stdout.splitlines() if line.startswith("study dir "))


def bench_submit(env, rounds):
    cli = [sys.executable, "-m", "jobs.cli", "study", "run"]
    study, raw, dirs = [], [], []
    for i in range(rounds):
        elapsed, out = timed(cli + SWEEP + ["--name", f"bench{i}"], env)
        study.append(elapsed)
        scripts = sorted(glob.glob(os.path.join(study_dir_of(out), "points", "*", "*.sbatch")))
        assert len(scripts) == 12, scripts
        start = time.perf_counter()
        for script in scripts:
            subprocess.run(["sbatch", "--parsable", script], env=env, capture_output=True, check=True, cwd=REPO)
        raw.append(time.perf_counter() - start)
        dirs.append(study_dir_of(out))
    ratios = [s / r for s, r in zip(study, raw)]
    print(f"\nSubmitting a 12-point study, {rounds} rounds (each: the study, then raw sbatch of its 12 scripts)")
    print(f"{'what':<52} {'median s':>9} {'ms/point':>9}")
    print(f"{'raw sbatch --parsable x 12 (12 processes)':<52} {statistics.median(raw):9.3f} "
          f"{1000 * statistics.median(raw) / 12:9.1f}")
    print(f"{'recsys-submit study run (one process, 12 points)':<52} {statistics.median(study):9.3f} "
          f"{1000 * statistics.median(study) / 12:9.1f}")
    print(f"ratio study / raw sbatch: median {statistics.median(ratios):.2f}x "
          f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)}; goal <= 1.5x)")
    return dirs


def bench_poll(env, study_dir, polls):
    shim_env, calls_file = counting_env(env)
    study_calls, study_times = [], []
    for _ in range(polls):
        open(calls_file, "w").close()
        elapsed, _ = timed([sys.executable, "-m", "jobs.cli", "study", "status", study_dir], shim_env)
        study_times.append(elapsed)
        study_calls.append(len(open(calls_file).read().split()))
    runs = sorted(glob.glob(os.path.join(study_dir, "points", "*")))
    open(calls_file, "w").close()
    start = time.perf_counter()
    for run_dir in runs:
        subprocess.run([sys.executable, "-m", "jobs.cli", "status", run_dir], env=shim_env, capture_output=True,
                       cwd=REPO)
    per_run_time = time.perf_counter() - start
    per_run_calls = len(open(calls_file).read().split())
    print(f"\nPolling the 12-point study ({polls} polls; jobs pending)")
    print(f"{'what':<52} {'calls/poll':>10} {'s/poll':>8}")
    print(f"{'recsys-submit study status':<52} {statistics.median(study_calls):10.0f} "
          f"{statistics.median(study_times):8.3f}")
    print(f"{'recsys-submit status of each point run (12 processes)':<52} {per_run_calls:10d} {per_run_time:8.3f}")
    shutil.rmtree(os.path.dirname(calls_file), ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--polls", type=int, default=5)
    args = parser.parse_args()
    with pending_cluster() as env:
        dirs = bench_submit(env, args.rounds)
        bench_poll(env, dirs[0], args.polls)
    print(f"\nreproduce: {sys.executable} bench/bench_study.py --rounds {args.rounds} --polls {args.polls}")


if __name__ == "__main__":
    main()
