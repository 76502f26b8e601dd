"""The README's emulated-cluster study, and what Open MPI's idle spinning does to it.

Brings up a private local Slurm cluster (slurm/dev/local-cluster.sh: 4 emulated nodes on this
host's cores), runs docs/studies/emulated-dlrm-strong.yaml (--spec: another, e.g. the second
emulated study docs/studies/emulated-ncf-strong.yaml; the files written take its name) on profile `ci` (shared_nodes: points
one at a time, 3 repeats in rounds, ranks that yield when idle) in one allocation of the 4 nodes
(`study run --allocation`: one sbatch, every point on the first nodes of the same node set) and
writes its report as docs/studies/emulated-dlrm-strong-allocation.* (--out for another folder).
--separate-jobs runs a job per point instead and writes emulated-dlrm-strong.*, the recorded
study the projection's checks read (bench/bench_projection.py, tests/jobs/test_projection.py),
so a new one-allocation run never changes what they were checked against. Then, unless
--no-spin, the multi-rank points again on a profile that differs from `ci` only by
OMPI_MCA_mpi_yield_when_idle=0 (Open MPI's default when it believes each rank has a core of its
own: a waiting rank spins), and prints the throughput ratio yield/spin per size, both measured
in this run.

The emulated nodes share 2 cores: these figures show the mechanics of a study and the cost of
spinning ranks on shared cores, not the scaling of any real cluster.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTER = os.path.join(REPO, "slurm", "dev", "local-cluster.sh")
SPEC = os.path.join(REPO, "docs", "studies", "emulated-dlrm-strong.yaml")
# as tests/conftest.py: Open MPI as root, PMIx's shared-memory store off on this host
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PMIX_MCA_gds": "hash"}


def cli(env, *args, check=True):
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=None)     # progress lines stream to stderr
    if check and proc.returncode not in (0, 1):
        raise SystemExit(f"recsys-submit {' '.join(args)} exited {proc.returncode}")
    return proc


def study(env, spec_path, profile, out=None, allocation=True):
    """Run a study to its end; its report dict."""
    proc = cli(env, "study", "run", spec_path, "--profile", profile, *(["--allocation"] if allocation else []))
    directory = re.search(r"^study dir (.+)$", proc.stdout, re.M).group(1).strip()
    cli(env, "study", "status", directory, "--watch")
    args = ["study", "report", directory] + (["--out", out] if out else [])
    cli(env, *args)
    with open(os.path.join(directory, "results.json")) as handle:
        points = json.load(handle)["points"]
    jobs = sorted({p["job_id"] for p in points if p.get("job_id")}, key=int)
    print(f"{len(points)} points in {len(jobs)} batch job(s): {', '.join(jobs)}; "
          f"attempts per point: {sorted({p.get('attempts') for p in points})}")
    with open(os.path.join(out or os.path.join(directory, "report"), "scaling.json")) as handle:
        return json.load(handle)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "studies"),
                        help="where the study's scaling.{md,csv,json,png}, breakdown.csv and breakdown-default.png "
                             "go (renamed NAME-allocation.*, NAME-allocation-breakdown.*, NAME the spec's "
                             "name; with --separate-jobs NAME.*, NAME-breakdown.*)")
    parser.add_argument("--spec", default=SPEC,
                        help="the study spec (default docs/studies/emulated-dlrm-strong.yaml); its name is the stem "
                             "of the files written, e.g. docs/studies/emulated-ncf-strong.yaml")
    parser.add_argument("--no-spin", action="store_true", help="skip the spinning-ranks comparison")
    parser.add_argument("--separate-jobs", action="store_true",
                        help="each point its own job (the default: every point in one allocation)")
    args = parser.parse_args()
    state = tempfile.mkdtemp(prefix="recsys-bench-emulated-")
    runs = os.path.join(state, "runs")
    proc = subprocess.run(["bash", CLUSTER, "up", "--dir", os.path.join(state, "cluster")], text=True)
    if proc.returncode != 0:
        raise SystemExit("the local cluster did not start")
    env = dict(os.environ, SLURM_CONF=os.path.join(state, "cluster", "etc", "slurm.conf"), RECSYS_RUNS_DIR=runs,
               **MPI_ENV)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]])
    try:
        report_dir = os.path.join(state, "report")
        args.spec = os.path.abspath(args.spec)
        report = study(env, args.spec, "ci", out=report_dir, allocation=not args.separate_jobs)
        with open(args.spec) as handle:
            spec = yaml.safe_load(handle)
        stem = spec["name"] if args.separate_jobs else f"{spec['name']}-allocation"
        for name, target in [(f"scaling.{kind}", f"{stem}.{kind}") for kind in ("md", "csv", "json", "png")] \
                + [("breakdown.csv", f"{stem}-breakdown.csv"), ("breakdown-default.png", f"{stem}-breakdown.png")]:
            source = os.path.join(report_dir, name)
            if os.path.exists(source):
                shutil.copyfile(source, os.path.join(args.out, target))
        print(open(os.path.join(report_dir, "scaling.md")).read())
        if args.no_spin:
            return
        spec.update(name=f"{spec['name']}-spin", gpus=[g for g in spec["gpus"] if g > 1])
        spin_spec = os.path.join(state, "spin.yaml")
        spin_profile = os.path.join(state, "ci-spin.yaml")
        with open(spin_spec, "w") as handle:
            yaml.safe_dump(spec, handle)
        with open(spin_profile, "w") as handle:
            yaml.safe_dump({"extends": "ci", "description": "ci with spinning Open MPI ranks",
                            "env": {"OMPI_MCA_mpi_yield_when_idle": "0"}}, handle)
        spin = study(env, spin_spec, spin_profile, allocation=not args.separate_jobs)
        rows = {r["gpus"]: r["variants"]["default"] for r in report["rows"]}
        print("| ranks | yield when idle (samples/s, median of 3) | spinning (samples/s, median of 3) | yield / spin |")
        print("|---:|---:|---:|---:|")
        for row in spin["rows"]:
            s, y = row["variants"]["default"], rows[row["gpus"]]
            ratio = y["throughput"] / s["throughput"] if y["throughput"] and s["throughput"] else None
            print(f"| {row['gpus']} | {y['throughput']:,.0f} ({y['throughput_min']:,.0f}-{y['throughput_max']:,.0f}) "
                  f"| {s['throughput']:,.0f} ({s['throughput_min']:,.0f}-{s['throughput_max']:,.0f}) "
                  f"| {ratio:.2f}x |" if ratio else f"| {row['gpus']} | - | - | - |")
        print(f"\nreproduce: {sys.executable} bench/bench_emulated_study.py"
              + ("" if args.spec == SPEC else f" --spec {os.path.relpath(args.spec, REPO)}")
              + (" --separate-jobs" if args.separate_jobs else ""))
    finally:
        subprocess.run(["bash", CLUSTER, "down", "--dir", os.path.join(state, "cluster")], capture_output=True)


if __name__ == "__main__":
    main()
