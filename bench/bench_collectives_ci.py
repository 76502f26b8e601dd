"""The `ci` profile's fabric, measured, and the emulated check of `study project`.

Brings up a private local Slurm cluster (slurm/dev/local-cluster.sh: 4 emulated nodes on this
host's 2 cores), runs the collective micro-benchmark as two jobs (`recsys-submit benchmark
--payload collectives`: 1 node x 2 ranks for inter-rank traffic inside a node, 2 nodes x 1 rank
between nodes), prints the `fabric:` section `recsys-submit profiles fabric` makes of them (what
cluster_profiles/ci.yaml carries), then projects the recorded emulated study
(docs/studies/emulated-dlrm-strong.{yaml,json}) on it: calibrated on its 1-rank point, the 2/4/8-rank
bands against the measured throughput.

    .venv/bin/python bench/bench_collectives_ci.py [--sizes 4K,64K,1M,4M] [--iters 20]

--core-sharing measures instead the exchange of ranks that share the host's cores, at the emulated
studies' layouts (2 ranks: 1 node x 2; 4: 2 x 2; 8: 4 x 2; and 2 nodes x 1 rank, the inter_node
figure), --repeats times each in rounds, keeps the fabric files in --files, and prints the
`fabric:` section `recsys-submit profiles fabric --core-sharing` makes of them (measured figures
with their range over the repeats, and ``core_sharing.exchange``); --from DIR prints it from files
already kept.

    .venv/bin/python bench/bench_collectives_ci.py --core-sharing --repeats 3 --files DIR

The emulated nodes share 2 cores: the figures are those of processes on one host talking over
loopback TCP, not of any real fabric.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
CLUSTER = os.path.join(REPO, "slurm", "dev", "local-cluster.sh")
STUDY = os.path.join(REPO, "docs", "studies", "emulated-dlrm-strong")
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PMIX_MCA_gds": "hash"}


def cli(env, *args):
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=REPO, env=env, text=True,
                          stdout=subprocess.PIPE)
    if proc.returncode != 0:
        raise SystemExit(f"recsys-submit {' '.join(args)} exited {proc.returncode}")
    return proc.stdout


def measure(env, out, nodes, gpus_per_node, sizes, iters):
    text = cli(env, "benchmark", "--profile", "ci", "--payload", "collectives", "--nodes", str(nodes),
               "--gpus-per-node", str(gpus_per_node), "--time", "10", "--", "--out", out, "--sizes", sizes,
               "--iters", str(iters))
    run_dir = [line[len("run dir "):].strip() for line in text.splitlines() if line.startswith("run dir ")]
    if not run_dir:
        raise SystemExit(f"no run dir in the submission's output:\n{text}")
    cli(env, "status", run_dir[0], "--watch")
    return out


SHARING_LAYOUTS = ((1, 2), (2, 1), (2, 2), (4, 2))     # (nodes, ranks per node) of --core-sharing


def core_sharing(env, files, repeats, sizes, iters):
    """The fabric files of every --core-sharing layout, `repeats` rounds (each round every layout
    once, so a drift in the host's load spreads over the layouts); their paths."""
    os.makedirs(files, exist_ok=True)
    paths = []
    for r in range(repeats):
        for nodes, per_node in SHARING_LAYOUTS:
            path = os.path.join(files, f"n{nodes}x{per_node}-r{r}.yaml")
            if not os.path.exists(path):
                measure(env, path, nodes, per_node, sizes, iters)
            print(f"measured {os.path.basename(path)}", flush=True)
            paths.append(path)
    return paths


def emulated_check(fabric_section):
    from jobs.profiles import load_profile
    from jobs.study.analysis import projection as P
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ci-measured.yaml")
        with open(path, "w") as f:
            yaml.safe_dump({"extends": "ci", **fabric_section}, f)
        record = P.run(STUDY + ".yaml", load_profile(path), [1, 2, 4, 8], report=STUDY + ".json")
    lines = ["| ranks | projected samples/s (no overlap - full overlap) | measured | error vs nearer edge | "
             "compute ms | embedding exchange ms | gradient exchange ms |", "|---:|---|---:|---:|---:|---:|---:|"]
    for p in record["points"]:
        if p["gpus"] == 1:
            continue
        band = P.within(p["measured_throughput"], p["throughput_low"], p["throughput_high"])
        ph = p["phases_ms"]
        lines.append(f"| {p['gpus']} | {p['throughput_low']:,.0f} - {p['throughput_high']:,.0f} | "
                     f"{p['measured_throughput']:,.0f} | "
                     f"{'inside' if band['inside'] else format(100 * band['error'], '+.1f') + ' %'} | "
                     f"{ph['compute']:.2f} | {ph['embedding_exchange']:.2f} | {ph['gradient_exchange']:.2f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4K,64K,1M,4M")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--core-sharing", action="store_true",
                    help="measure the exchange of ranks sharing the host's cores at 2, 4 and 8 ranks, with repeats")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--files", help="--core-sharing: where the fabric files are kept (default: a temporary folder)")
    ap.add_argument("--from", dest="from_dir", help="--core-sharing: print the section from the files kept there")
    args = ap.parse_args()
    if args.core_sharing and args.from_dir:
        paths = sorted(os.path.join(args.from_dir, f) for f in os.listdir(args.from_dir) if f.endswith(".yaml"))
        print(cli(dict(os.environ), "profiles", "fabric", "--profile", "ci", "--core-sharing", *paths))
        return
    state = tempfile.mkdtemp(prefix="recsys-bench-collectives-")
    if subprocess.run(["bash", CLUSTER, "up", "--dir", os.path.join(state, "cluster")]).returncode != 0:
        raise SystemExit("the local cluster did not start")
    env = dict(os.environ, SLURM_CONF=os.path.join(state, "cluster", "etc", "slurm.conf"),
               RECSYS_RUNS_DIR=os.path.join(state, "runs"), **MPI_ENV)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]])
    try:
        if args.core_sharing:
            paths = core_sharing(env, args.files or os.path.join(state, "files"), args.repeats, args.sizes, args.iters)
            print(cli(env, "profiles", "fabric", "--profile", "ci", "--core-sharing", *paths))
            print(f"reproduce: {sys.executable} bench/bench_collectives_ci.py --core-sharing --repeats {args.repeats} "
                  f"--sizes {args.sizes} --iters {args.iters}")
            return
        intra = measure(env, os.path.join(state, "intra.yaml"), 1, 2, args.sizes, args.iters)
        inter = measure(env, os.path.join(state, "inter.yaml"), 2, 1, args.sizes, args.iters)
        section = yaml.safe_load(cli(env, "profiles", "fabric", intra, inter, "--profile", "ci"))
        print(yaml.safe_dump(section, sort_keys=False, width=10_000))
        print(emulated_check(section))
        print(f"\nreproduce: {sys.executable} bench/bench_collectives_ci.py --sizes {args.sizes} --iters {args.iters}")
    finally:
        subprocess.run(["bash", CLUSTER, "down", "--dir", os.path.join(state, "cluster")], capture_output=True)


if __name__ == "__main__":
    main()
