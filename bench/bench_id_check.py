"""Cost of the split-binary reader's per-batch id check (issue 11, item 5) on the numpy side.

The reader checks every categorical id of each batch it reads (min/max per
column against the cardinality). This times ``SplitBinaryReader.read_flat``
over the same batches with the check and without it (the baseline, same
process, same page-cached data), alternating ``--rounds`` times and keeping
the best of each, and prints the ratio. Run by hand:

    python bench/bench_id_check.py [--rows 1048576] [--batch-size 65536] [--rounds 5]
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def time_reads(reader, batch_ids):
    t0 = time.perf_counter()
    for b in batch_ids:
        reader.read_flat(b)
    return time.perf_counter() - t0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1 << 20)
    p.add_argument("--batch-size", type=int, default=65536)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args(argv)
    from recsys.data import synthetic
    from recsys.data.split_binary import SplitBinaryReader
    with tempfile.TemporaryDirectory() as out:
        spec = synthetic.generate(synthetic.default_spec("dlrm", num_files=1), out,
                                  {"train": a.rows, "test": a.batch_size}, seed=1)
        checked = SplitBinaryReader(spec, "train", a.batch_size)
        unchecked = SplitBinaryReader(spec, "train", a.batch_size)
        unchecked._id_checks = []                       # baseline: the reader without the check
        ids = checked.batch_ids()
        time_reads(checked, ids)                        # warm the page cache
        best_c = best_u = float("inf")
        for _ in range(a.rounds):
            best_u = min(best_u, time_reads(unchecked, ids))
            best_c = min(best_c, time_reads(checked, ids))
    rows = len(ids) * a.batch_size
    print(f"{'reader':<22}{'samples/s':>14}")
    print(f"{'without id check':<22}{rows / best_u:>14,.0f}")
    print(f"{'with id check':<22}{rows / best_c:>14,.0f}")
    print(f"time ratio (with / without): {best_c / best_u:.2f}")
    print("reproduce: python bench/bench_id_check.py " + shlex.join(argv if argv is not None else sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
