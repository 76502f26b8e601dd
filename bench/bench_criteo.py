"""Criteo pipeline throughput: Spark local mode vs the same dictionary + transform in DuckDB, on one node.

For each size, generated raw days (``python -m preproc criteo generate``) go
through

* ``spark``: ``python -m preproc criteo run`` (JVM start, dictionary, transform,
  finalize; what a user runs), and
* ``duckdb``: the same rules (the defaults, NVIDIA's reference; docs/criteo.md)
  written in DuckDB SQL: dictionary over all days, ids by descending count then
  value, threshold, ln(x + 3) with 0 for missing and x <= -3, the last day cut
  at half of its lines, training rows ordered by the seeded shuffle key of
  ``preproc.criteo.layout.shuffle_key`` (same integer arithmetic in SQL), the
  reference's id dtypes; in one process, with all cores.

Each runs as its own process; wall time and the peak resident memory of the
whole process tree (JVM and Python workers included; sampled every 0.1 s with
psutil) are measured, and the outputs are compared byte for byte. Printed: a
table, the DuckDB/Spark speed ratio per size, the fixed overhead and per-row
cost of each from a linear fit (time = a + b * rows) and the size where Spark's
fixed overhead stops dominating (b * rows > a); a plot goes to
bench/results/criteo_throughput.png.

Reproduce: python bench/bench_criteo.py --sizes 100000,1000000 --threshold 3
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from preproc.criteo.layout import (_MASK31, _MIX, CAT_FEATURES, MAPPINGS, NUM_CAT, NUM_INT,  # noqa: E402
                                   categorical_dtype, parse_thresholds, shuffle_buckets, test_rows)


def _mix31_sql(x: str, name: str) -> list[str]:
    """preproc.criteo.layout.mix31 in DuckDB SQL: select items ending in column ``name`` (one alias per step,
    so the expression does not grow 8-fold per mix; products stay below 2**61)."""
    return [f"{x} AS {name}_a",
            f"(xor({name}_a, {name}_a >> 15) * {_MIX[0]}) & {_MASK31} AS {name}_b",
            f"(xor({name}_b, {name}_b >> 12) * {_MIX[1]}) & {_MASK31} AS {name}_c",
            f"xor({name}_c, {name}_c >> 15) AS {name}"]


def shuffle_key_sql(seed: int, file_idx: str, line: str, name: str = "shuffle_key") -> list[str]:
    """preproc.criteo.layout.shuffle_key in DuckDB SQL: select items ending in column ``name``."""
    return (_mix31_sql(f"{file_idx}::BIGINT", "k_file") + _mix31_sql(f"xor({seed}::BIGINT, k_file)", "k_salt")
            + _mix31_sql(f"xor({line}::BIGINT, k_salt)", "k_hi") + _mix31_sql(f"{line}::BIGINT", "k_line")
            + _mix31_sql("xor(k_hi, k_line)", "k_lo") + [f"k_hi * {1 << 31} + k_lo AS {name}"])


def duckdb_pipeline(raw: Path, out: Path, thresholds: list[int], threads: int, seed: int = 0) -> dict:
    """Dictionary + transform + split-binary output with DuckDB (the baseline), default rules."""
    import duckdb

    days = sorted(raw.glob("day_*"), key=lambda p: int(p.name.split("_")[1]))
    con = duckdb.connect()
    con.execute(f"SET threads={threads}")
    columns = ["label"] + [f"i{i}" for i in range(NUM_INT)] + [f"c{i}" for i in range(NUM_CAT)]
    spec = "{" + ", ".join(f"'{c}': 'VARCHAR'" for c in columns) + "}"
    for d, path in enumerate(days):
        con.execute(f"CREATE TABLE day{d} AS SELECT {d} AS day, row_number() OVER () AS rn, * FROM read_csv("
                    f"'{path}', delim='\t', header=false, quote='', escape='', columns={spec}, "
                    f"auto_detect=false, parallel=false)")
    con.execute("CREATE VIEW rows AS " + " UNION ALL ".join(f"SELECT * FROM day{d}" for d in range(len(days))))
    last = len(days) - 1
    cards = []
    for i in range(NUM_CAT):
        con.execute(f"""CREATE TABLE dict{i} AS SELECT value, row_number() OVER (ORDER BY n DESC, value) AS id
            FROM (SELECT c{i} AS value, count(*) AS n FROM rows WHERE c{i} <> '' GROUP BY 1)
            WHERE n >= {thresholds[i]}""")
        cards.append(con.execute(f"SELECT count(*) FROM dict{i}").fetchone()[0] + 1)
    nums = ", ".join(f"CAST(CASE WHEN CAST(nullif(i{i}, '') AS DOUBLE) + 3 > 0 "
                     f"THEN ln(CAST(nullif(i{i}, '') AS DOUBLE) + 3) ELSE 0 END AS FLOAT) AS n{i}"
                     for i in range(NUM_INT))
    ids = ", ".join(f"coalesce(d{i}.id, 0)::INTEGER AS id{i}" for i in range(NUM_CAT))
    joins = " ".join(f"LEFT JOIN dict{i} d{i} ON r.c{i} = d{i}.value" for i in range(NUM_CAT))
    last_rows = con.execute(f"SELECT count(*) FROM day{last}").fetchone()[0]
    cut = test_rows(last_rows)
    bounds = {"train": f"r.day < {last}", "test": f"r.day = {last} AND r.rn <= {cut}",
              "validation": f"r.day = {last} AND r.rn > {cut}"}
    train_lines = con.execute(f"SELECT count(*) FROM rows WHERE day < {last}").fetchone()[0]
    key = ", ".join(shuffle_key_sql(seed, "r.day", "(r.rn - 1)"))
    order = {"train": f"shuffle_key % {shuffle_buckets(train_lines)}, shuffle_key, r.day, r.rn",
             "test": "r.day, r.rn", "validation": "r.day, r.rn"}
    extra = {"train": f", {key}", "test": "", "validation": ""}
    rows = {}
    for mapping in MAPPINGS:
        (out / mapping).mkdir(parents=True)
        handles = {name: open(out / mapping / name, "wb") for name in
                   ["label.bin", "numerical.bin"] + [f"{c}.bin" for c in CAT_FEATURES]}
        cursor = con.execute(f"SELECT CAST(r.label AS TINYINT) AS label, {nums}, {ids}{extra[mapping]} "
                             f"FROM rows r {joins} WHERE {bounds[mapping]} ORDER BY {order[mapping]}")
        count = 0
        while True:
            batch = cursor.fetch_df_chunk(64)
            if batch is None or len(batch) == 0:
                break
            count += len(batch)
            batch["label"].to_numpy(np.int8).astype(np.bool_).tofile(handles["label.bin"])
            batch[[f"n{i}" for i in range(NUM_INT)]].to_numpy(np.float32).astype(np.float16).tofile(
                handles["numerical.bin"])
            for i in range(NUM_CAT):
                batch[f"id{i}"].to_numpy(np.int64).astype(categorical_dtype(cards[i])).tofile(
                    handles[f"cat_{i}.bin"])
        for handle in handles.values():
            handle.close()
        rows[mapping] = count
    return {"rows": rows, "cardinalities": cards}


def measure(cmd: list[str], env=None) -> tuple[float, float, str]:
    """(wall seconds, peak RSS GiB of the process tree, output) of a command."""
    import psutil

    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    peak = [0]

    def sample():
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            try:
                total = root.memory_info().rss + sum(c.memory_info().rss for c in root.children(recursive=True))
                peak[0] = max(peak[0], total)
            except psutil.Error:
                pass
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    output, _ = proc.communicate()
    elapsed = time.perf_counter() - start
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{output[-3000:]}")
    return elapsed, peak[0] / 2**30, output


def same_bytes(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a) for p in a.glob("*/*.bin"))
    return bool(files) and all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def fit(sizes, times):
    """(fixed seconds a, seconds per row b) of time = a + b * rows through the measured points."""
    b, a = np.polyfit(np.asarray(sizes, float), np.asarray(times, float), 1)
    return max(a, 0.0), b


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,1000000", help="generated rows, comma-separated")
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--threshold", default="3")
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--memory-gb", type=float, default=8)
    parser.add_argument("--workdir", default=None, help="scratch (default: a temporary directory)")
    parser.add_argument("--results", default=str(REPO / "bench" / "results"))
    parser.add_argument("--duckdb-worker", nargs=2, metavar=("RAW", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    thresholds = parse_thresholds(args.threshold)
    if args.duckdb_worker:
        raw, out = map(Path, args.duckdb_worker)
        print(json.dumps(duckdb_pipeline(raw, out, thresholds, args.cores)))
        return 0

    sizes = [int(s) for s in args.sizes.split(",")]
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_criteo_"))
    python = sys.executable
    env = dict(os.environ, PYTHONPATH=str(REPO))
    table = []
    for size in sizes:
        raw = work / f"raw_{size}"
        if not raw.exists():
            subprocess.run([python, "-m", "preproc", "criteo", "generate", "--out", str(raw), "--rows", str(size),
                            "--days", str(args.days), "--seed", "1"], check=True, env=env, capture_output=True)
        raw_bytes = sum(p.stat().st_size for p in raw.glob("day_*"))
        spark_out, duck_out = work / f"spark_{size}", work / f"duckdb_{size}"
        for path in (spark_out, duck_out):
            shutil.rmtree(path, ignore_errors=True)
        spark_s, spark_gib, _ = measure(
            [python, "-m", "preproc", "criteo", "run", "--input", str(raw), "--output", str(spark_out),
             "--threshold", args.threshold, "--node-cores", str(args.cores), "--node-memory-gb",
             str(args.memory_gb)], env)
        duck_s, duck_gib, _ = measure([python, __file__, "--duckdb-worker", str(raw), str(duck_out),
                                       "--threshold", args.threshold, "--cores", str(args.cores)], env)
        row = {"rows": size, "raw_mib": raw_bytes / 2**20, "spark_s": spark_s, "duckdb_s": duck_s,
               "spark_rows_per_s": size / spark_s, "duckdb_rows_per_s": size / duck_s,
               "ratio_duckdb_over_spark": spark_s / duck_s, "spark_peak_gib": spark_gib,
               "duckdb_peak_gib": duck_gib, "identical_output": same_bytes(spark_out, duck_out)}
        table.append(row)
        print(json.dumps(row), flush=True)
        shutil.rmtree(spark_out, ignore_errors=True)
        shutil.rmtree(duck_out, ignore_errors=True)

    print(f"\nCriteo pipeline, {args.days} days, threshold {args.threshold}, {args.cores} cores "
          f"(Spark local[{args.cores}] vs DuckDB {args.cores} threads)")
    print(f"{'rows':>10} {'raw MiB':>8} {'spark s':>8} {'duckdb s':>9} {'spark rows/s':>13} {'duckdb rows/s':>14} "
          f"{'duckdb/spark':>12} {'spark GiB':>9} {'duckdb GiB':>10} {'same bytes':>10}")
    for r in table:
        print(f"{r['rows']:>10,} {r['raw_mib']:>8.1f} {r['spark_s']:>8.1f} {r['duckdb_s']:>9.1f} "
              f"{r['spark_rows_per_s']:>13,.0f} {r['duckdb_rows_per_s']:>14,.0f} "
              f"{r['ratio_duckdb_over_spark']:>11.1f}x "
              f"{r['spark_peak_gib']:>9.2f} {r['duckdb_peak_gib']:>10.2f} {str(r['identical_output']):>10}")
    summary = {}
    if len(table) >= 2:
        sa, sb = fit([r["rows"] for r in table], [r["spark_s"] for r in table])
        da, db = fit([r["rows"] for r in table], [r["duckdb_s"] for r in table])
        summary = {"spark_fixed_s": sa, "spark_us_per_row": sb * 1e6, "duckdb_fixed_s": da,
                   "duckdb_us_per_row": db * 1e6, "spark_overhead_half_rows": sa / sb if sb > 0 else None,
                   "crossover_rows": (sa - da) / (db - sb) if db > sb else None}
        print(f"\nfit time = a + b*rows: spark a={sa:.1f} s, b={sb * 1e6:.2f} us/row; "
              f"duckdb a={da:.1f} s, b={db * 1e6:.2f} us/row")
        if summary["spark_overhead_half_rows"]:
            print("Spark's fixed overhead stops dominating (b*rows > a) above "
                  f"~{summary['spark_overhead_half_rows']:,.0f} rows")
        print("Spark never catches up on one node at these per-row costs" if summary["crossover_rows"] is None
              else f"Spark would match DuckDB above ~{summary['crossover_rows']:,.0f} rows")
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    (results / "criteo_throughput.json").write_text(json.dumps({"table": table, "fit": summary,
                                                               "args": vars(args)}, indent=1))
    plot(table, results / "criteo_throughput.png", args)
    print(f"\nplot: {results / 'criteo_throughput.png'}")
    print(f"reproduce: python bench/bench_criteo.py --sizes {args.sizes} --days {args.days} "
          f"--threshold {args.threshold} --cores {args.cores}")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def plot(table, path: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r["rows"] for r in table]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(rows, [r["spark_rows_per_s"] for r in table], "o-", label="Spark local")
    left.plot(rows, [r["duckdb_rows_per_s"] for r in table], "s-", label="DuckDB")
    left.set(xscale="log", yscale="log", xlabel="rows", ylabel="rows / s", title="throughput")
    left.legend()
    right.plot(rows, [r["spark_peak_gib"] for r in table], "o-", label="Spark local")
    right.plot(rows, [r["duckdb_peak_gib"] for r in table], "s-", label="DuckDB")
    right.set(xscale="log", xlabel="rows", ylabel="peak RSS (GiB)", title="peak memory")
    right.legend()
    fig.suptitle(f"Criteo dictionary+transform, {args.cores} cores, T={args.threshold}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
