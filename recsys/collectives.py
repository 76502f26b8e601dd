"""``python -m recsys.collectives``: the collective micro-benchmark a profile's fabric is measured with.

Runs inside a job, one rank per GPU (``recsys-submit benchmark --payload collectives``), through
the same Horovod over MPI (or NCCL) the training engine exchanges its embeddings and gradients
with: allreduce, alltoall and allgather of float32 tensors over a range of sizes. Sizes and bus
bandwidths follow nccl-tests' conventions (doc/PERFORMANCE.md): `size` is the bytes of the
whole buffer (allgather: the gathered output), algbw = size / time, busbw = algbw x 2(n-1)/n for
allreduce and x (n-1)/n for alltoall and allgather. The time of a size is the slowest rank's mean
over the timed iterations.

Rank 0 writes a fabric file (YAML, written whole under a temporary name, then renamed): the level
measured (``intra_node`` when the job has one node, ``inter_node`` otherwise: measure it with one
rank per node), per collective the peak bus bandwidth and the smallest size's time (the two
numbers of a profile's ``fabric.measured`` entry, docs/profiles.md, "Fabric"; the latency is the
shortest time over the sizes), and every size's
row. Exit 2 with one line on bad flags.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time

COLLECTIVES = ("allreduce", "alltoall", "allgather")
DEFAULT_SIZES = "4K,64K,1M,4M"


def _size(text):
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    unit = t[-1] if t and t[-1] in "KMG" else ""
    try:
        value = int(t[:-1] if unit else t) * units[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 4K, 1M)") from None
    if value < 4:
        raise argparse.ArgumentTypeError(f"{text!r}: a size is at least 4 bytes (one float32)")
    return value


def _parser():
    p = argparse.ArgumentParser(prog="python -m recsys.collectives", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the fabric file rank 0 writes (YAML)")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help=f"comma-separated buffer sizes (default {DEFAULT_SIZES})")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations first (default 5)")
    p.add_argument("--collectives", default=",".join(COLLECTIVES), help="which (default: all three)")
    return p


def bus_factor(collective, n):
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n if collective == "allreduce" else (n - 1) / n


def _level(env=None):
    env = os.environ if env is None else env
    nodes = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or "1"
    try:
        return "intra_node" if int(nodes) <= 1 else "inter_node"
    except ValueError:
        return "intra_node"


def summarize(rows):
    """{collective: {busbw_gb_per_s: peak, latency_us: the shortest time}} of the size rows (the
    shortest is the smallest size's but for a first size that still warms Horovod up)."""
    out = {}
    for coll in sorted({r["collective"] for r in rows}):
        mine = sorted((r for r in rows if r["collective"] == coll), key=lambda r: r["size"])
        out[coll] = {"busbw_gb_per_s": float(f"{max(r['busbw_gb_per_s'] for r in mine):.6g}"),
                     "latency_us": float(f"{min(r['time_us'] for r in mine):.6g}")}
    return out


def _write(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv=None):
    try:
        args = _parser().parse_args(argv)
        sizes = [_size(s) for s in args.sizes.split(",") if s.strip()]
        colls = [c.strip() for c in args.collectives.split(",") if c.strip()]
        bad = [c for c in colls if c not in COLLECTIVES]
        if bad or not colls or not sizes or args.iters < 1 or args.warmup < 0:
            raise argparse.ArgumentTypeError(
                f"--collectives {','.join(bad)} not one of {', '.join(COLLECTIVES)}" if bad else
                "give at least one size and collective, --iters >= 1 and --warmup >= 0")
        out_dir = os.path.dirname(os.path.abspath(args.out))
        if not os.path.isdir(out_dir):
            raise argparse.ArgumentTypeError(f"--out {args.out}: no directory {out_dir}")
    except argparse.ArgumentTypeError as exc:
        print(f"python -m recsys.collectives: error: {exc}", file=sys.stderr)
        return 2

    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    n, rank = hvd.size(), hvd.rank()
    rows = []
    for coll in colls:
        for size in sizes:
            elements = max(n, size // 4 // n * n)          # divisible over the ranks (alltoall's splits)
            per_rank = elements // n if coll == "allgather" else elements
            x = tf.ones([per_rank], tf.float32)
            op = {"allreduce": lambda: hvd.allreduce(x, op=hvd.Sum, name=f"ar{size}"),
                  "alltoall": lambda: hvd.alltoall(x, name=f"a2a{size}"),
                  "allgather": lambda: hvd.allgather(x, name=f"ag{size}")}[coll]
            for _ in range(args.warmup):
                op().numpy()
            hvd.allreduce(tf.zeros([1]), name="align").numpy()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                op().numpy()
            mine = (time.perf_counter() - t0) / args.iters
            slowest = float(hvd.allreduce(tf.constant([mine]), op=hvd.Max, name="slowest").numpy()[0])
            nbytes = elements * 4
            algbw = nbytes / slowest / 1e9
            rows.append({"collective": coll, "size": nbytes, "time_us": slowest * 1e6,
                         "algbw_gb_per_s": algbw, "busbw_gb_per_s": algbw * bus_factor(coll, n)})
    if rank == 0:
        import yaml
        level = _level()
        nodes = os.environ.get("SLURM_JOB_NUM_NODES", "1")
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        source = (f"python -m recsys.collectives, {n} ranks on {nodes} node(s), job "
                  f"{os.environ.get('SLURM_JOB_ID', '-')}, {when}")
        record = {"version": 1, "level": level, "ranks": n, "nodes": int(nodes), "source": source,
                  "measured": {level: summarize(rows)},
                  "rows": [{k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in r.items()} for r in rows]}
        _write(args.out, yaml.safe_dump(record, sort_keys=False))
        print(f"collectives: {level}, {n} ranks: " + ", ".join(
            f"{c} {v['busbw_gb_per_s']:.3f} GB/s, {v['latency_us']:.0f} us" for c, v in record["measured"][level].items()),
            flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
