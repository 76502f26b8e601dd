"""Submission and status throughput on the local Slurm cluster (slurm/dev/local-cluster.sh).

1. Render + submit 32 separate jobs and one 32-task array through `recsys-submit` (one CLI
   process per job, and the Python API in one process) against raw `sbatch --parsable` of the
   very same rendered scripts, interleaved job by job.
2. Status of 100 jobs: Slurm calls per poll (counted by PATH shims that log and exec the real
   squeue/sacct/scontrol) and seconds per poll, against one `squeue -j` per job.

The benchmark brings up its own private cluster (own state dir and ports) and sets the
partition DOWN so that submitted jobs stay pending: only submission and polling are measured,
no job steals the CPUs. Everything is cancelled and the cluster stopped at the end.

Reproduce: .venv/bin/python bench/bench_submit.py [--jobs 32] [--status-jobs 100] [--accounting]
"""

import argparse
import contextlib
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(REPO, "slurm", "dev", "local-cluster.sh")
HELLO = ["--profile", "ci", "--model", "hello", "--nodes", "1", "--gpus-per-node", "1", "--time", "5"]


def timed(argv, env):
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=REPO)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, argv))} failed:\n{proc.stderr}")
    return elapsed, proc.stdout


def run_dir_of(stdout):
    return next(line[8:] for line in stdout.splitlines() if line.startswith("run dir "))


def bench_submit(env, n_jobs, rounds):
    """Job by job, interleaved: CLI submit i, raw sbatch of the script it wrote, API submit i
    (in this process), raw sbatch of that script."""
    os.environ.update(env)
    sys.path.insert(0, REPO)
    from jobs.api import JobRequest, submit

    cli = [sys.executable, "-m", "jobs.cli"]
    times = {k: [] for k in ("cli", "raw_cli", "api", "raw_api")}
    request = JobRequest(kind="benchmark", model="hello", nodes=1, gpus_per_node=1, time="5")
    submit([request], "ci")               # warm the in-process caches once (profile imports)
    for i in range(n_jobs):
        elapsed, out = timed(cli + ["benchmark", *HELLO, "--name", f"bench{i}"], env)
        times["cli"].append(elapsed)
        script = glob.glob(os.path.join(run_dir_of(out), "*.sbatch"))[0]
        times["raw_cli"].append(timed(["sbatch", "--parsable", script], env)[0])
        start = time.perf_counter()
        record = submit([request], "ci")
        times["api"].append(time.perf_counter() - start)
        times["raw_api"].append(timed(["sbatch", "--parsable", record["jobs"][0]["script"]], env)[0])
    arr = {"recsys-submit CLI": [], "raw sbatch": []}
    for _ in range(rounds):
        elapsed, out = timed(cli + ["benchmark", *HELLO, "--array", "32", "--parallelism", "4"], env)
        arr["recsys-submit CLI"].append(elapsed)
        script = glob.glob(os.path.join(run_dir_of(out), "*.sbatch"))[0]
        arr["raw sbatch"].append(timed(["sbatch", "--parsable", script], env)[0])
    base_arr = statistics.median(arr["raw sbatch"])
    print(f"\nSubmission on the local cluster ({n_jobs} separate jobs; 32-task array x {rounds}), "
          "each method interleaved with raw sbatch of the very script it wrote")
    print(f"{'what':<50} {'total s':>8} {'per job ms':>11} {'vs sbatch':>10}")
    rows = [(f"{n_jobs} jobs: raw sbatch (paired with CLI)", times["raw_cli"], times["raw_cli"]),
            (f"{n_jobs} jobs: recsys-submit CLI, one process per job", times["cli"], times["raw_cli"]),
            (f"{n_jobs} jobs: raw sbatch (paired with API)", times["raw_api"], times["raw_api"]),
            (f"{n_jobs} jobs: jobs.api.submit() in one process", times["api"], times["raw_api"])]
    for name, values, base in rows:
        print(f"{name:<50} {sum(values):8.2f} {1000 * sum(values) / len(values):11.1f} "
              f"{sum(values) / sum(base):9.2f}x")
    for name in ("raw sbatch", "recsys-submit CLI"):
        med = statistics.median(arr[name])
        print(f"{'32-task array: ' + name + ' (median)':<50} {med:8.3f} {'':>11} {med / base_arr:9.2f}x")


SHIM = """#!/bin/bash
echo "$(basename "$0")" >> "$RECSYS_BENCH_CALLS"
exec "{real}" "$@"
"""


def counting_env(env):
    """(env, calls file): Slurm's commands on PATH wrapped by shims that log each call, then exec
    the real command, so a benchmark can count how many calls an operation makes."""
    shim_dir = tempfile.mkdtemp(prefix="recsys-shim-")
    for tool in ("squeue", "sacct", "scontrol", "sbatch", "scancel"):
        path = os.path.join(shim_dir, tool)
        with open(path, "w") as handle:
            handle.write(SHIM.format(real=shutil.which(tool, path=env["PATH"])))
        os.chmod(path, 0o755)
    calls_file = os.path.join(shim_dir, "calls.log")
    return dict(env, PATH=f"{shim_dir}{os.pathsep}{env['PATH']}", RECSYS_BENCH_CALLS=calls_file), calls_file


def bench_status(env, n_jobs, polls):
    shim_env, calls_file = counting_env(env)
    code = ("import sys; from jobs.api import JobRequest, submit;"
            "r=JobRequest(kind='benchmark', model='hello', nodes=1, gpus_per_node=1, time='5');"
            "print(submit([r]*int(sys.argv[1]), 'ci')['run_dir'])")
    run_dir = timed([sys.executable, "-c", code, str(n_jobs)], env)[1].strip().splitlines()[-1]
    record = json.load(open(os.path.join(run_dir, "jobs.json")))
    ids = [j["job_id"] for j in record["jobs"]]
    assert len(ids) == n_jobs
    per_poll_calls, cli_times = [], []
    for _ in range(polls):
        open(calls_file, "w").close()
        elapsed, _ = timed([sys.executable, "-m", "jobs.cli", "status", run_dir], shim_env)
        cli_times.append(elapsed)
        per_poll_calls.append(len(open(calls_file).read().split()))
    api_code = ("import sys,time,json; from jobs.status import poll;"
                "t=[]\nfor _ in range(int(sys.argv[2])):\n"
                " s=time.perf_counter(); r=poll(sys.argv[1]); t.append(time.perf_counter()-s)\n"
                "print(json.dumps([t, r['calls'], r['source']]))")
    api_times, api_calls, source = json.loads(timed([sys.executable, "-c", api_code, run_dir, str(polls)],
                                                    env)[1])
    naive = []
    for _ in range(max(1, polls // 5)):
        start = time.perf_counter()
        for job_id in ids:
            subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env, capture_output=True)
        naive.append(time.perf_counter() - start)
    print(f"\nStatus of a run with {n_jobs} jobs ({polls} polls, source {source})")
    print(f"{'what':<46} {'calls/poll':>10} {'s/poll':>8}")
    print(f"{'recsys-submit status (CLI process)':<46} {statistics.median(per_poll_calls):10.0f} "
          f"{statistics.median(cli_times):8.3f}")
    print(f"{'jobs.status.poll() in one process':<46} {api_calls:10d} {statistics.median(api_times):8.3f}")
    print(f"{'baseline: one squeue -j per job':<46} {n_jobs:10d} {statistics.median(naive):8.3f}")
    shutil.rmtree(os.path.dirname(calls_file), ignore_errors=True)
    return ids


@contextlib.contextmanager
def pending_cluster(accounting=False):
    """A private local Slurm cluster whose partition is DOWN, so submitted jobs stay pending and
    only submission and polling are measured; yields the environment that talks to it, and
    cancels everything and takes the cluster down afterwards."""
    state = tempfile.mkdtemp(prefix="recsys-bench-slurm-")
    runs = tempfile.mkdtemp(prefix="recsys-bench-runs-")
    up = ["bash", CLUSTER, "up", "--dir", state] + (["--accounting"] if accounting else [])
    proc = subprocess.run(up, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"cluster did not start:\n{proc.stderr}")
    env = dict(os.environ, SLURM_CONF=os.path.join(state, "etc", "slurm.conf"), RECSYS_RUNS_DIR=runs)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]])
    try:
        subprocess.run(["scontrol", "update", "PartitionName=debug", "State=DOWN"], env=env, check=True)
        yield env
    finally:
        subprocess.run(["scancel", "--partition=debug"], env=env, capture_output=True)
        subprocess.run(["bash", CLUSTER, "down", "--dir", state], env=env, capture_output=True)
        shutil.rmtree(runs, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="array submissions per method")
    parser.add_argument("--status-jobs", type=int, default=100)
    parser.add_argument("--polls", type=int, default=10)
    parser.add_argument("--accounting", action="store_true", help="bring the cluster up with slurmdbd")
    args = parser.parse_args()
    with pending_cluster(args.accounting) as env:
        bench_submit(env, args.jobs, args.rounds)
        bench_status(env, args.status_jobs, args.polls)
    extra = " --accounting" if args.accounting else ""
    print(f"\nreproduce: {sys.executable} bench/bench_submit.py --jobs {args.jobs} --rounds {args.rounds} "
          f"--status-jobs {args.status_jobs} --polls {args.polls}{extra}")


if __name__ == "__main__":
    main()
