"""Model-parallel vs replicated embedding tables (DLRM, CPU ranks under mpirun): memory and throughput.

In one run, for small tables (26 tables, about 4 MB in all) and large ones
(each size of ``--large-gib``, GiB of fp32 tables in 8 equal tables), at 2 and 4 ranks:

* memory: each rank's table bytes (its share of the plan, which the tests show
  equals its variables) and its process RSS (peak VmHWM and VmRSS at the end of
  the run) with model-parallel vs replicated tables; the ratio model-parallel /
  replicated per rank (goal at 4 ranks: <= 1/4 + 10 %);
* throughput: samples/s of ``--run-mode benchmark`` (warm-up steps excluded),
  model-parallel / replicated, and where the ratio crosses 1 (crossover);
* bytes moved per step, from the shapes (not sniffed off the wire): the
  model-parallel path's two alltoalls (ids out, vectors back) plus the
  backward alltoall of the vector gradients, vs the replicated path's
  allgather of the embedding gradients (IndexedSlices: values + ids, every
  rank receives every rank's). The dense MLP allreduce is the same in both.

    python bench/bench_embeddings.py [--large-gib 2,4] [--ranks 2,4] [--steps 20] [--json out.json]

Needs Open MPI and Horovod (tests/install.sh). Memory: the replicated run at
4 ranks holds 4 copies of the large tables (about 4 x (large + 0.7) GiB: 18.6 GiB for 4 GiB).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIM = 32
BATCH = 4096
FLAGS = ["--embedding-dim", str(DIM), "--bottom-mlp", "64,32", "--top-mlp", "64,32,1", "--batch-size", str(BATCH),
         "--eval-batch-size", str(BATCH), "--lr", "0.1", "--warmup-steps", "0", "--decay-steps", "0",
         "--optimizer", "sgd", "--intra-op-threads", "1", "--inter-op-threads", "1"]
MPI_ENV = {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo",
           "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}

# Runs recsys.train in a rank, then reports the rank's memory (a file per rank).
# "fixed" is the RSS once TensorFlow and Horovod are imported, before any model exists: the
# per-process cost that does not shrink with the tables.
RANK_WRAPPER = r"""
import json, os, sys
def kb(key):
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    return int(status[key].split()[0]) * 1024
import tensorflow, horovod.tensorflow
fixed = kb("VmRSS")
from recsys.train import main
rc = main(sys.argv[2:])
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0"))
with open(os.path.join(sys.argv[1], f"rank-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "peak_rss": kb("VmHWM"), "rss": kb("VmRSS"), "fixed_rss": fixed, "rc": rc}, f)
"""


def make_data(root, cardinalities, rows):
    from recsys.data import synthetic
    spec = synthetic.default_spec("dlrm", cardinalities=cardinalities, num_files=4)
    synthetic.generate(spec, root, {"train": rows, "test": BATCH}, seed=3)
    return root


def run(np_, data, placement, steps, warmup, workdir):
    out = tempfile.mkdtemp(prefix=f"{placement}-{np_}-", dir=workdir)
    log = os.path.join(out, "log.jsonl")
    env = dict(os.environ, **MPI_ENV, PYTHONPATH=REPO)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), "--bind-to", "none"]
    for k in sorted(set(MPI_ENV) | {"PATH", "PYTHONPATH"}):
        cmd += ["-x", k]
    cmd += [sys.executable, "-c", RANK_WRAPPER, out, "--model", "dlrm", "--data-path", data, *FLAGS,
            "--run-mode", "benchmark", "--benchmark-steps", str(steps), "--benchmark-warmup-steps", str(warmup),
            "--embedding-placement", placement, "--embedding-memory-gb", "1000", "--log-path", log,
            "--log-every", "1000"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, text=True, capture_output=True, cwd=REPO)
    if res.returncode != 0:       # e.g. killed for memory: report it, keep the other points
        print(f"# {placement} on {np_} ranks FAILED (exit {res.returncode}): {res.stderr.strip()[-300:]}",
              file=sys.stderr, flush=True)
        return None
    recs = [json.loads(x) for x in open(log) if x.strip()]
    summary = [r for r in recs if r["type"] == "summary"][-1]
    plan = [r for r in recs if r["type"] == "placement"][-1]
    ranks = [json.load(open(os.path.join(out, f"rank-{r}.json"))) for r in range(np_)]
    return {"ranks": np_, "placement": placement, "samples_per_s": summary["throughput_samples_per_s"],
            "table_bytes": plan["embedding_bytes"], "peak_rss": [r["peak_rss"] for r in ranks],
            "rss": [r["rss"] for r in ranks], "fixed_rss": [r["fixed_rss"] for r in ranks],
            "wall_s": time.perf_counter() - t0}


def bytes_per_step(cardinalities, world):
    """(alltoall bytes, allgather bytes) moved between ranks per training step, summed over ranks."""
    n, off = len(cardinalities), (world - 1) / world          # ids/vectors for another rank
    ids = BATCH * n * 4 * off                                  # int32 ids out
    vectors = BATCH * n * DIM * 4 * off                        # fp32 vectors back, and their gradients
    alltoall = ids + 2 * vectors
    # every rank receives the other ranks' IndexedSlices (local batch rows x tables x (dim values + 1 id))
    allgather = world * (world - 1) * (BATCH // world) * n * (DIM + 1) * 4
    return alltoall, allgather


def gib(x):
    return x / 2**30


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--large-gib", default="2,4", help="fp32 sizes of the large tables, GiB, comma separated")
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--json", help="also write the results here")
    a = p.parse_args(argv)
    ranks = [int(x) for x in a.ranks.split(",")]
    sets = {"small": [int(c) for c in (10, 101, 1002, 23, 504, 8, 2006, 57, 208, 10009, 20, 111, 1012, 33,
                                       514, 18, 2016, 67, 218, 10019, 30, 121, 1022, 43, 524, 28)],
            **{f"large {g:g} GiB": [int(g * 2**30 / (8 * DIM * 4))] * 8
               for g in (float(x) for x in a.large_gib.split(","))}}
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-embeddings-") as work:
        for name, cards in sets.items():
            data = make_data(os.path.join(work, name.replace(' ', '-')), cards, rows=BATCH * 8)
            for np_ in ranks:
                for placement in ("replicated", "model_parallel"):
                    r = run(np_, data, placement, a.steps, a.warmup, work)
                    if r is None:
                        continue
                    r.update(tables=name, table_gib=gib(sum(cards) * DIM * 4))
                    r["alltoall_bytes"], r["allgather_bytes"] = bytes_per_step(cards, np_)
                    results.append(r)
                    print(f"# {name} {placement} {np_} ranks: {r['samples_per_s']:.0f} samples/s, "
                          f"peak RSS {[round(gib(x), 2) for x in r['peak_rss']]} GiB ({r['wall_s']:.0f} s)",
                          file=sys.stderr, flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    by = {(r["tables"], r["ranks"], r["placement"]): r for r in results}
    print("\nMemory per rank, model parallel / replicated (same run; goal at 4 ranks <= 0.25 + 0.10 = 0.35).")
    print("Peak RSS is VmHWM of the most loaded rank; 'fixed' is a rank's RSS once TensorFlow and Horovod are")
    print("imported (before any model), which does not shrink with the tables; 'above fixed' = peak - fixed.")
    print("| tables | ranks | table GiB/rank rep | table GiB/rank MP (max) | table ratio | peak RSS GiB rep | "
          "peak RSS GiB MP | RSS ratio | fixed GiB | above fixed rep | above fixed MP | above-fixed ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in sets:
        for np_ in ranks:
            rep, mp = by.get((name, np_, "replicated")), by.get((name, np_, "model_parallel"))
            if rep is None or mp is None:
                print(f"| {name} | {np_} | failed: {'replicated' if rep is None else 'model parallel'} |" + " |" * 9)
                continue
            fixed = max(rep["fixed_rss"] + mp["fixed_rss"])
            above = [max(p - f for p, f in zip(r["peak_rss"], r["fixed_rss"])) for r in (rep, mp)]
            label = name if name != "small" else f"small ({rep['table_gib']:.3f} GiB)"
            print(f"| {label} | {np_} | {gib(max(rep['table_bytes'])):.3f} | "
                  f"{gib(max(mp['table_bytes'])):.3f} | {max(mp['table_bytes']) / max(rep['table_bytes']):.3f} | "
                  f"{gib(max(rep['peak_rss'])):.2f} | {gib(max(mp['peak_rss'])):.2f} | "
                  f"{max(mp['peak_rss']) / max(rep['peak_rss']):.3f} | {gib(fixed):.2f} | {gib(above[0]):.2f} | "
                  f"{gib(above[1]):.2f} | {above[1] / above[0]:.3f} |")
    for name in sets:
        rep, mp = by.get((name, max(ranks), "replicated")), by.get((name, max(ranks), "model_parallel"))
        if name != "small" and rep and mp:
            goal = 1 / max(ranks) + 0.10
            tab = max(mp["table_bytes"]) / max(rep["table_bytes"])
            rss = max(mp["peak_rss"]) / max(rep["peak_rss"])
            print(f"goal at {max(ranks)} ranks, {name}: <= {goal:.2f}: table memory {tab:.3f} "
                  f"({'met' if tab <= goal else 'NOT met'}), peak RSS {rss:.3f} ({'met' if rss <= goal else 'NOT met'})")
    print("\nThroughput (samples/s, global batch %d) and bytes moved per step" % BATCH)
    print("| tables | ranks | replicated | model parallel | MP / rep | alltoall MB/step (MP) | "
          "allgather MB/step (rep) |")
    print("|---|---|---|---|---|---|---|")
    for name in sets:
        for np_ in ranks:
            rep, mp = by.get((name, np_, "replicated")), by.get((name, np_, "model_parallel"))
            if rep is None or mp is None:
                print(f"| {name} | {np_} | failed: {'replicated' if rep is None else 'model parallel'} | | | | |")
                continue
            print(f"| {name} | {np_} | {rep['samples_per_s']:.0f} | {mp['samples_per_s']:.0f} | "
                  f"{mp['samples_per_s'] / rep['samples_per_s']:.2f} | {mp['alltoall_bytes'] / 1e6:.2f} | "
                  f"{rep['allgather_bytes'] / 1e6:.2f} |")
    cross = [f"{name}@{np_}" for name in sets for np_ in ranks
             if (name, np_, "replicated") in by and (name, np_, "model_parallel") in by
             and by[(name, np_, "model_parallel")]["samples_per_s"] >= by[(name, np_, "replicated")]["samples_per_s"]]
    print(f"\nmodel parallel at least as fast as replicated for: {', '.join(cross) or 'none of the measured points'}")
    print("reproduce: python " + " ".join(shlex.quote(x) for x in ["bench/bench_embeddings.py", *(argv or sys.argv[1:])]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
