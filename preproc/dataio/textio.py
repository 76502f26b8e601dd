"""Text input parsing and parquet output shared by the MovieLens and Outbrain pipelines.

- ``parse_delimited`` reads delimited text (CSV with a header, or ``::``-separated)
  into typed columns and flags bad rows (wrong field count, unparsable number,
  missing required id) instead of failing or silently nulling them;
  ``drop_bad_rows`` counts them per file, hands the counts to
  ``preproc.dataio.bad_rows.enforce`` (skip or fatal) and drops them.
- ``write_parquet_files`` writes exactly ``num_files`` parquet files per mapping
  (``<name>/part_NNNNN.parquet``), so that the parquet reader can give every
  rank its own files, optionally keeping the rows of one group (a display, a
  user) in one file. The stage directory comes from ``preproc.dataio.output.atomic_dir``.
"""
from __future__ import annotations

import glob
import gzip
import os
import re
import shutil

from preproc.errors import PreprocError

INTEGER_TYPES = {"int", "bigint", "smallint", "tinyint"}


def _open_text(path: str):
    return gzip.open(path, "rt", errors="replace") if path.endswith(".gz") else open(path, errors="replace")


def first_line(path: str) -> str | None:
    """First line of a (possibly gzipped) text file without its newline, None when empty."""
    with _open_text(path) as f:
        line = f.readline()
    return line.rstrip("\r\n") if line else None


def line_count_at_most(path: str, limit: int) -> int:
    """Number of non-blank lines, counting no further than ``limit`` (cheap emptiness test)."""
    n = 0
    with _open_text(path) as f:
        for line in f:
            if line.strip():
                n += 1
                if n >= limit:
                    break
    return n


def parse_delimited(spark, path, columns, sep: str, header: str | None = None):
    """DataFrame of ``columns`` [(name, spark type, required)] plus ``_bad``, ``_file``, ``_line``.

    A row is bad when its field count differs from ``len(columns)``, a
    non-empty field does not parse as its type (integers must be plain
    integers, "1.5" is bad), or a required field is empty. Empty optional
    fields become null. Blank lines and header lines are skipped.
    """
    from pyspark.sql import functions as F

    raw = spark.read.text(path).select(F.col("value").alias("_line"), F.input_file_name().alias("_file"))
    raw = raw.filter(F.trim("_line") != "")
    if header is not None:
        raw = raw.filter(F.col("_line") != header)
    fields = F.split(F.regexp_replace("_line", "\r$", ""), re.escape(sep), -1)
    n = len(columns)
    bad = F.size(fields) != F.lit(n)
    values = []
    for i, (name, typ, required) in enumerate(columns):
        text = F.trim(F.when(F.size(fields) > i, fields.getItem(i)))
        empty = F.coalesce(text == "", F.lit(True))
        if typ == "string":
            value = F.when(~empty, text)
            unparsable = F.lit(False)
        else:
            value = F.when(~empty, text.cast(typ))
            unparsable = ~empty & value.isNull()
            if typ in INTEGER_TYPES:
                unparsable = unparsable | (~empty & ~text.rlike(r"^[+-]?[0-9]+$"))
        bad = bad | unparsable | (F.lit(required) & empty)
        values.append(value.alias(name))
    return raw.select(*values, bad.alias("_bad"), "_file", "_line")


def count_bad_rows(parsed) -> dict:
    """{file: (bad rows, rows)} of a ``parse_delimited`` frame (or several unioned), in one aggregation."""
    from pyspark.sql import functions as F

    per_file = (parsed.groupBy("_file")
                .agg(F.sum(F.col("_bad").cast("long")).alias("bad"), F.count("*").alias("rows")).collect())
    return {row["_file"]: (int(row["bad"] or 0), int(row["rows"])) for row in per_file}


def without_bad_rows(parsed):
    from pyspark.sql import functions as F

    return parsed.filter(~F.col("_bad")).drop("_bad", "_file", "_line")


def drop_bad_rows(parsed, policy: str = "skip", what: str = "input"):
    """Count rows and bad rows per file, apply ``preproc.dataio.bad_rows.enforce``, drop the bad rows.

    Returns (clean DataFrame, report {file: {bad_rows, rows}}).
    """
    from preproc.dataio import bad_rows

    report = bad_rows.enforce(count_bad_rows(parsed), policy, what)
    return without_bad_rows(parsed), report


def write_parquet_files(df, stage: str, name: str, num_files: int, by: str | None = None,
                        sort_by=(), drop=()) -> tuple[list[str], list[int]]:
    """Write ``df`` as exactly ``num_files`` files ``<stage>/<name>/part_NNNNN.parquet``.

    ``by`` None: rows go round-robin to the files. Otherwise ``by`` is an integer
    column in [0, num_files) giving each row's file (so related rows, e.g. one
    display's ads, share a file). Rows are sorted by ``sort_by`` inside a file.
    Returns (file paths relative to ``stage``, row count of each file) and
    raises PreprocError when a file would be empty (fewer rows/groups than files).
    """
    from pyspark.sql import functions as F

    if num_files < 1:
        raise ValueError("--num-files must be >= 1")
    if by is None:
        df = df.repartition(num_files).withColumn("_file_idx", F.spark_partition_id())
    else:
        df = df.withColumn("_file_idx", F.col(by).cast("int")).repartition(num_files, "_file_idx")
    drop_cols = [c for c in [by, *drop] if c]
    df = df.sortWithinPartitions("_file_idx", *sort_by).drop(*drop_cols)
    spark_dir = os.path.join(stage, f"_spark_{name}")
    df.write.partitionBy("_file_idx").parquet(spark_dir)
    out_dir = os.path.join(stage, name)
    os.makedirs(out_dir, exist_ok=True)
    files, counts = [], []
    import pyarrow.parquet as pq

    for idx in range(num_files):
        parts = sorted(glob.glob(os.path.join(spark_dir, f"_file_idx={idx}", "*.parquet")))
        if not parts:
            raise PreprocError(f"{name}: file {idx} of --num-files {num_files} would be empty "
                              "(fewer rows or groups than files; lower --num-files)")
        rel = os.path.join(name, f"part_{idx:05d}.parquet")
        if len(parts) == 1:
            os.rename(parts[0], os.path.join(stage, rel))
        else:  # several Spark tasks wrote this file index: concatenate in order
            pq.write_table(pq.ParquetDataset(parts).read(), os.path.join(stage, rel))
        files.append(rel)
        counts.append(pq.ParquetFile(os.path.join(stage, rel)).metadata.num_rows)
    shutil.rmtree(spark_dir)
    return files, counts


def write_feature_spec(spec: dict, directory) -> str:
    """Write ``directory/feature_spec.yaml`` through recsys.features.spec (structure checked on the way)."""
    from recsys.features.spec import FeatureSpec

    fs = FeatureSpec(spec["feature_spec"], spec["source_spec"], spec["channel_spec"], spec["metadata"],
                     base_directory=str(directory))
    return fs.to_yaml()
