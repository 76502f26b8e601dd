"""Submitting and polling a 12-point scaling study on the local Slurm cluster.

1. Submitting a 12-point study (DLRM, gpus 1,2,4,8 x precision tf32/fp32/amp), against raw
   `sbatch --parsable` of the very 12 scripts it rendered (one sbatch process per script, as a
   user would type them), interleaved round by round:
   - `recsys-submit study run`, one CLI process, with compiled bytecode cached (as after a pip
     install) and without (PYTHONDONTWRITEBYTECODE=1, compiling every module on every call, as
     on the CI machine);
   - `jobs.api.run_study()` in this (already warm) process, as a notebook or a driver script
     calls it, with its submit threads and one point at a time;
   - the floor of any CLI process: a python that only imports what `study run` needs.
   Wall seconds (the goal: at most 1.5x raw sbatch) and CPU seconds (user + sys of the
   processes involved, far less disturbed by other load on a shared machine).
2. Polling the study: Slurm calls per `recsys-submit study status` (counted by PATH shims that
   log and exec the real squeue/sacct/scontrol), against `recsys-submit status` of each point.

Like bench/bench_submit.py it brings up a private cluster and sets the partition DOWN, so the
jobs stay pending and only submission and polling are measured. The controller runs on this
host, so one sbatch costs a few milliseconds; timings on a shared 2-core machine are noisy and
the ratio within one run is what counts.

Reproduce: .venv/bin/python bench/bench_study.py [--rounds 7] [--polls 5]
"""

import argparse
import glob
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_submit import REPO, counting_env, pending_cluster, timed  # noqa: E402  (the shared shim and timer)

POINTS = 12
# the ci profile's nodes, declared unshared: every point goes in at once, as on a real cluster
# (on `ci` itself a study waits for each point to end, and these points stay pending)
PROFILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profiles", "ci-unshared.yaml")
SWEEP = ["--profile", PROFILE, "--model", "dlrm", "--gpus", "1,2,4,8", "--variant", "precision=tf32,fp32,amp",
         "--batch-size", "4096", "--warmup-steps", "2", "--steps", "5", "--time", "5"]


# every module `study run` needs before its first sbatch: the CLI, the study and submission
# layers, the profile loader (pyyaml) and the engine's flag parser (recsys.train, no TensorFlow)
STUDY_IMPORTS = ("import jobs.cli, jobs.study.running.run, jobs.submit, jobs.profiles, jobs.backends.slurm.backend, "
                 "recsys.train, subprocess")


def study_dir_of(stdout):
    return next(line[10:] for line in stdout.splitlines() if line.startswith("study dir "))


def _cpu(who):
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def measured(fn):
    """(wall s, CPU s of this process and its children, result of fn())."""
    cpu = _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - start
    return wall, _cpu(resource.RUSAGE_SELF) + _cpu(resource.RUSAGE_CHILDREN) - cpu, result


def scripts_of(study_dir):
    scripts = sorted(glob.glob(os.path.join(study_dir, "points", "*", "*.sbatch")))
    assert len(scripts) == POINTS, scripts
    return scripts


def raw_sbatch(scripts, env):
    for script in scripts:
        subprocess.run(["sbatch", "--parsable", script], env=env, capture_output=True, check=True, cwd=REPO)


def bytecode_envs(env, cache_dir):
    """The CLI's two ways of finding its modules: bytecode cached in `cache_dir` (as after a pip
    install, kept out of the tree) and compiled from source on every call."""
    cached = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached["PYTHONPYCACHEPREFIX"] = cache_dir
    source = {k: v for k, v in env.items() if k != "PYTHONPYCACHEPREFIX"}
    source["PYTHONDONTWRITEBYTECODE"] = "1"
    return cached, source


def bench_submit(env, rounds):
    from jobs.api import run_study
    from jobs.study.spec import spec_from_flags

    def api_run(name):
        spec = spec_from_flags("dlrm", "1,2,4,8", batch_size=4096, variants=["precision=tf32,fp32,amp"],
                               warmup_steps=2, steps=5, time="5", name=name)
        record, submitted = run_study(spec, PROFILE)
        assert len(submitted) == POINTS, submitted
        return record.study_dir

    from jobs.study.running import parallel as study_parallel

    def api_serial(name):
        """The API with one point at a time: what submitting the points concurrently saves."""
        threads, study_parallel.SUBMIT_THREADS = study_parallel.SUBMIT_THREADS, 1
        try:
            return api_run(name)
        finally:
            study_parallel.SUBMIT_THREADS = threads

    cli = [sys.executable, "-m", "jobs.cli", "study", "run"] + SWEEP
    floor = [sys.executable, "-c", STUDY_IMPORTS]
    rows = {k: [] for k in ("raw", "cli", "cli_nopyc", "api", "api_serial", "floor")}
    ratios = {k: [] for k in ("cli", "cli_nopyc", "api", "api_serial", "floor")}
    dirs = []
    with tempfile.TemporaryDirectory(prefix="bench-study-pyc-") as cache_dir:
        cached, source = bytecode_envs(env, cache_dir)
        timed(cli + ["--name", "warm-cli"], cached)       # fills the bytecode cache; not counted
        api_run("warm-api")                               # imports and caches of this process; not counted
        for i in range(rounds):
            wall, cpu, (_, out) = measured(lambda: timed(cli + ["--name", f"cli{i}"], cached))
            rows["cli"].append((wall, cpu))
            dirs.append(study_dir_of(out))
            raw_before = measured(lambda: raw_sbatch(scripts_of(dirs[-1]), env))[:2]
            wall, cpu, api_dir = measured(lambda: api_run(f"api{i}"))
            rows["api"].append((wall, cpu))
            raw_after = measured(lambda: raw_sbatch(scripts_of(api_dir), env))[:2]
            wall, cpu, _ = measured(lambda: timed(cli + ["--name", f"nopyc{i}"], source))
            rows["cli_nopyc"].append((wall, cpu))
            wall, cpu, _ = measured(lambda: api_serial(f"serial{i}"))
            rows["api_serial"].append((wall, cpu))
            wall, cpu, _ = measured(lambda: timed(floor, cached))
            rows["floor"].append((wall, cpu))
            base = tuple((a + b) / 2 for a, b in zip(raw_before, raw_after))
            rows["raw"].append(base)
            for key in ratios:
                ratios[key].append(rows[key][-1][0] / base[0])
    names = {"raw": f"raw sbatch --parsable x {POINTS} ({POINTS} processes)",
             "cli": "recsys-submit study run (one process, bytecode cached)",
             "cli_nopyc": "recsys-submit study run (no bytecode, as on CI)",
             "api": "jobs.api.run_study() in a warm process",
             "api_serial": "the same, one point at a time (no submit threads)",
             "floor": "floor of any CLI: python + the imports, no work"}
    print(f"\nSubmitting a {POINTS}-point study, {rounds} rounds; each round: CLI, raw sbatch of its "
          f"{POINTS} scripts, API, raw sbatch of its {POINTS} scripts, CLI without bytecode, API one point at a time, "
          f"a python that only imports what `study run` needs")
    print(f"{'what':<56} {'wall s':>7} {'ms/point':>9} {'CPU s':>7} {'vs raw wall':>12} {'vs raw CPU':>11}")
    raw_cpu = statistics.median(c for _, c in rows["raw"])
    for key, name in names.items():
        wall = statistics.median(w for w, _ in rows[key])
        cpu = statistics.median(c for _, c in rows[key])
        ratio = "" if key == "raw" else f"{statistics.median(ratios[key]):11.2f}x"
        cpu_ratio = "" if key == "raw" else f"{cpu / raw_cpu:10.2f}x"
        print(f"{name:<56} {wall:7.3f} {1000 * wall / POINTS:9.1f} {cpu:7.3f} {ratio:>12} {cpu_ratio:>11}")
    for key in ratios:
        print(f"  {names[key]}: wall ratio per round {', '.join(f'{r:.2f}' for r in ratios[key])}")
    print(f"goal: study run <= 1.5x raw sbatch (wall); medians above: CLI {statistics.median(ratios['cli']):.2f}x, "
          f"API {statistics.median(ratios['api']):.2f}x; a CLI process costs at least "
          f"{statistics.median(ratios['floor']):.2f}x before it submits anything")
    return dirs


def bench_start(env, rounds):
    """What any CLI process pays before it does anything: interpreter start-up."""
    with tempfile.TemporaryDirectory(prefix="bench-study-pyc-") as cache_dir:
        cached, _ = bytecode_envs(env, cache_dir)
        runs = {"python -c pass": [sys.executable, "-c", "pass"],
                "python -S -c pass (no site)": [sys.executable, "-S", "-c", "pass"],
                "recsys-submit --help (python -m jobs.cli --help)": [sys.executable, "-m", "jobs.cli", "--help"],
                "python -c 'import <what a study run imports>'": [sys.executable, "-c", STUDY_IMPORTS]}
        for argv in runs.values():
            timed(argv, cached)
        times = {k: [] for k in runs}
        for _ in range(rounds):
            for name, argv in runs.items():
                times[name].append(timed(argv, cached)[0])
    print(f"\nInterpreter start-up on this host ({rounds} runs each, bytecode cached)")
    for name, values in times.items():
        print(f"{name:<56} {statistics.median(values):7.3f} s (min {min(values):.3f})")


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
    print(f"\nPolling the {POINTS}-point study ({polls} polls; jobs pending)")
    print(f"{'what':<56} {'calls/poll':>10} {'s/poll':>8}")
    print(f"{'recsys-submit study status':<56} {statistics.median(study_calls):10.0f} "
          f"{statistics.median(study_times):8.3f}")
    print(f"{'recsys-submit status of each point run (12 processes)':<56} {per_run_calls:10d} {per_run_time:8.3f}")
    shutil.rmtree(os.path.dirname(calls_file), ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--polls", type=int, default=5)
    args = parser.parse_args()
    with pending_cluster() as env:
        os.environ.update(env)          # the API runs in this process, against the same cluster
        sys.path.insert(0, REPO)
        dirs = bench_submit(env, args.rounds)
        bench_start(env, args.rounds)
        bench_poll(env, dirs[0], args.polls)
    print(f"\nreproduce: {sys.executable} bench/bench_study.py --rounds {args.rounds} --polls {args.polls}")


if __name__ == "__main__":
    main()
