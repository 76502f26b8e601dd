"""Host memory and disk per rank of a distributed-embeddings checkpoint of Criteo 1TB (issue 47 item 9).

    python bench/bench_de_checkpoint_memory.py [--ranks 8,16,64] [--slots 0]

Computed from the project's own layout (``recsys.placement.planner.distributed_embeddings_layout``,
held equal to DE's strategy in tests/recsys/test_de_strategy.py): DLRM's 26 Criteo 1TB tables at
width 128, float32, DE's default thresholds (none: every table model parallel), ``--slots``
optimizer slots per table (DLRM's SGD: 0; Adagrad: 1). Per rank, the largest over ranks:

* slices: the rank's table slices (and slots), the files it writes;
* disk per save: ``sharded-v1`` wrote the slices twice (the files and the TF checkpoint), ``sharded-v2``
  once (recsys.checkpoints.graph);
* host peak of a save or a same-layout restore: TensorFlow's SaveV2/RestoreV2 hold every tensor of a
  TF checkpoint on the host at once, so v1 held the rank's whole shard; v2's TF checkpoint holds the
  dense weights only, and the slices move one chunk (``de_adapter.CHUNK_ELEMENTS``) at a time;
* host peak of a re-shard onto another rank count: one chunk (it was one saved column slab per chunk,
  the whole slice).

Then a measured small case: 3 stand-in ranks of a 5-table layout write their slices in 40-element
chunks; the largest block read and the bytes written are compared with what the same arithmetic gives.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import types

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from recsys.embeddings.de_adapter import CHUNK_ELEMENTS  # noqa: E402
from recsys.placement.planner import distributed_embeddings_layout  # noqa: E402

CRITEO_1TB_ROWS = [39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208,
                   11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36]
WIDTH = 128
# DLRM's dense part at its reference sizes: bottom 13-512-256-128, top 479-1024-1024-512-256-1
DENSE_PARAMS = (13 * 512 + 512 + 512 * 256 + 256 + 256 * 128 + 128 + 479 * 1024 + 1024 + 1024 * 1024 + 1024
                + 1024 * 512 + 512 + 512 * 256 + 256 + 256 + 1)
GIB = 2 ** 30


def per_rank(world: int, slots: int) -> dict:
    """The largest rank's figures in bytes (float32)."""
    tables = [(r, WIDTH) for r in CRITEO_1TB_ROWS]
    layout = distributed_embeddings_layout(tables, world)
    slices = max(layout.rank_elements()) * 4 * (1 + slots)
    dense = DENSE_PARAMS * 4 * (1 + slots)
    chunk = CHUNK_ELEMENTS * 4
    return {"slices": slices, "disk_v1": 2 * slices + dense, "disk_v2": slices + dense,
            "peak_v1": slices + dense, "peak_v2": max(dense, chunk), "reshard_v1": slices, "reshard_v2": chunk}


def measured_small_case() -> tuple:
    """(largest block read, bytes written, the same from the layout) of a 3-rank stand-in save."""
    import tensorflow as tf

    from recsys.checkpoints.pieces import write_distributed_pieces
    from recsys.embeddings.de_adapter import _shapes, set_global
    tables = [(40, 8), (30, 8), (5, 4), (64, 6), (12, 8)]
    layout = distributed_embeddings_layout(tables, 3, 50)
    chunk, stats, written = 40, {}, 0
    with tempfile.TemporaryDirectory() as d:
        for rank in range(3):
            shapes = [tables[t] for t in layout.data_parallel] + _shapes(layout, rank)
            layer = types.SimpleNamespace(recsys_layout=layout, rank=rank, world_size=3, name="g",
                                          weights=[tf.Variable(np.zeros(s, np.float32)) for s in shapes])
            set_global(layer, [np.ones(s, np.float32) for s in tables], chunk=chunk)
            out = os.path.join(d, str(rank))
            os.makedirs(out)
            for p in write_distributed_pieces(out, "g", layer, chunk=chunk, stats=stats):
                written += os.path.getsize(os.path.join(out, p["file"])) - 128      # .npy header: 128 bytes
    expected = sum(layout.rank_elements()) * 4
    return stats["peak_elements"], chunk, written, expected


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="8,16,64")
    ap.add_argument("--slots", type=int, default=0, help="optimizer slots per table (SGD 0, Adagrad 1)")
    args = ap.parse_args(argv)
    print(f"Criteo 1TB, DLRM, {len(CRITEO_1TB_ROWS)} tables x {WIDTH}, float32, {args.slots} slot(s); GiB per rank "
          "(the largest rank)\n")
    print("| ranks | slices | disk per save v1 -> v2 | host peak, save or same-layout restore v1 -> v2 "
          "| host peak, re-shard v1 -> v2 |")
    print("|---|---|---|---|---|")
    for world in (int(w) for w in args.ranks.split(",")):
        f = {k: v / GIB for k, v in per_rank(world, args.slots).items()}
        print(f"| {world} | {f['slices']:.2f} | {f['disk_v1']:.2f} -> {f['disk_v2']:.2f} | "
              f"{f['peak_v1']:.2f} -> {f['peak_v2']:.2f} | {f['reshard_v1']:.2f} -> {f['reshard_v2']:.2f} |")
    peak, chunk, written, expected = measured_small_case()
    print(f"\nmeasured small case (3 stand-in ranks, 5 tables, chunk {chunk} elements): largest block read "
          f"{peak} elements (<= chunk: {peak <= chunk}); slice bytes written {written}, from the layout "
          f"{expected} (equal: {written == expected})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
