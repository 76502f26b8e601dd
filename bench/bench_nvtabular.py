"""Criteo preprocessing: NVTabular on CPU (dask threads, pandas) vs Spark local mode, on one node.

For each size, generated raw days (``python -m preproc criteo generate``) go through

* ``spark``: ``python -m preproc criteo run`` (JVM start, dictionary, transform, finalize), and
* ``nvtabular``: ``python -m preproc criteo run --engine nvtabular --device cpu`` (scan,
  parse, fit the workflow, transform, write parquet + the workflow),

with the same rules (the defaults) and ``--threshold``. Each runs as its own
process; wall time and the peak resident memory of the whole process tree are
measured as bench/bench_criteo.py does (psutil, every 0.1 s), and the two
outputs are checked to hold the same categorical ids and labels (the
equivalence tests/preproc/test_criteo_nvt.py pins). Printed: a table, the
NVTabular/Spark time and memory ratios per size, and per engine the fixed cost
and the per-row cost of a linear fit (time = a + b * rows) through the sizes.

This is one 2-core node shared with other work: it shows the fixed costs and
the per-row slopes here, not GPU or multinode scaling.

Reproduce: python bench/bench_nvtabular.py --sizes 100000,400000 --threshold 3
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from bench_criteo import fit, measure  # noqa: E402
from preproc.criteo.layout import CAT_FEATURES, MAPPINGS  # noqa: E402


def same_ids(spark_out: Path, nvt_out: Path) -> bool:
    """Categorical ids and labels of every mapping equal in both outputs."""
    import pandas as pd

    for mapping in MAPPINGS:
        parts = sorted((nvt_out / mapping).glob("part_*.parquet"))
        frame = pd.concat([pd.read_parquet(p, columns=["label"] + CAT_FEATURES) for p in parts], ignore_index=True)
        label = np.fromfile(spark_out / mapping / "label.bin", dtype=np.bool_)
        if not np.array_equal(frame["label"].to_numpy().astype(bool), label):
            return False
        for name in CAT_FEATURES:
            dtype = str(frame[name].dtype)
            if not np.array_equal(np.fromfile(spark_out / mapping / f"{name}.bin", dtype=dtype), frame[name].to_numpy()):
                return False
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100000,400000", help="raw rows per run, comma separated (two or more)")
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--threshold", default="3")
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-nvt-"))
    py = sys.executable
    table = []
    try:
        for rows in sizes:
            raw = work / f"raw-{rows}"
            if not raw.exists():
                measure([py, "-m", "preproc", "criteo", "generate", "--out", str(raw), "--rows", str(rows),
                         "--days", str(args.days)])
            result = {"rows": rows}
            for engine in ("spark", "nvtabular"):
                out = work / f"{engine}-{rows}"
                shutil.rmtree(out, ignore_errors=True)
                cmd = [py, "-m", "preproc", "criteo", "run", "--input", str(raw), "--output", str(out),
                       "--threshold", args.threshold, "--engine", engine]
                if engine == "nvtabular":
                    cmd += ["--device", "cpu"]
                seconds, peak, _ = measure(cmd)
                result[engine] = {"seconds": round(seconds, 2), "peak_gib": round(peak, 3)}
                print(f"{rows:>10,} rows  {engine:<10} {seconds:8.1f} s  peak {peak:6.2f} GiB", flush=True)
            result["same_ids"] = same_ids(work / f"spark-{rows}", work / f"nvtabular-{rows}")
            result["time_ratio_nvt_over_spark"] = round(result["nvtabular"]["seconds"] / result["spark"]["seconds"], 3)
            result["memory_ratio_nvt_over_spark"] = round(result["nvtabular"]["peak_gib"] / result["spark"]["peak_gib"], 3)
            table.append(result)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print("\n      rows   spark s  nvt s  nvt/spark time   spark GiB  nvt GiB  nvt/spark mem  same ids")
    for r in table:
        print(f"{r['rows']:>10,} {r['spark']['seconds']:>8.1f} {r['nvtabular']['seconds']:>6.1f} "
              f"{r['time_ratio_nvt_over_spark']:>15.2f} {r['spark']['peak_gib']:>11.2f} {r['nvtabular']['peak_gib']:>8.2f} "
              f"{r['memory_ratio_nvt_over_spark']:>14.2f}  {r['same_ids']}")
    fits = {}
    if len(sizes) >= 2:
        for engine in ("spark", "nvtabular"):
            a, b = fit(sizes, [r[engine]["seconds"] for r in table])
            fits[engine] = {"fixed_s": round(a, 2), "us_per_row": round(b * 1e6, 3)}
            print(f"{engine:<10} fixed {a:6.1f} s, {b * 1e6:8.2f} us/row")
        if min(f["us_per_row"] for f in fits.values()) <= 0:
            print("a per-row cost came out <= 0: the machine's load changed between sizes, the fit means nothing")
        db = fits["spark"]["us_per_row"] - fits["nvtabular"]["us_per_row"]
        da = fits["nvtabular"]["fixed_s"] - fits["spark"]["fixed_s"]
        if min(f["us_per_row"] for f in fits.values()) <= 0:
            pass
        elif db > 0 and da > 0:
            print(f"NVTabular's per-row cost is lower: it overtakes Spark above about {da / db * 1e6:,.0f} rows")
        elif db < 0 and da < 0:
            print(f"Spark's per-row cost is lower: it overtakes NVTabular above about {da / db * 1e6:,.0f} rows")
    if args.json:
        Path(args.json).write_text(json.dumps({"results": table, "fits": fits}, indent=1))
    return 0 if all(r["same_ids"] for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
