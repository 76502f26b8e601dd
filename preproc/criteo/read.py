"""Parsing Criteo day files into a typed Spark DataFrame that remembers where each row came from.

Every row keeps ``file_idx`` (index of its day file in the run), ``block``
(byte offset of the file split Spark read it from) and ``pos`` (a counter that
increases along the lines of one split): ordering by (file_idx, block, pos)
restores the line order of the input, whatever the partitioning.

A row is bad when it does not have exactly 40 tab-separated fields, its label is
not 0 or 1, or a non-empty integer field is not a (64-bit) integer. Bad rows are
kept and flagged (``bad``) so that the pass that consumes them can count them per
file without reading the input twice; their feature columns are null.
"""
from __future__ import annotations

from pathlib import Path

from preproc.criteo.layout import NUM_CAT, NUM_FIELDS, NUM_INT

INT_RE = r"^-?[0-9]+$"


def read_days(spark, files: list[tuple[int, int, Path]]):
    """DataFrame over ``files`` [(file_idx, day, path)] with columns
    file_idx, day, block, pos, bad, label, i0..i12 (bigint, null = missing), c0..c25 (string, null = missing)."""
    from pyspark.sql import functions as F

    frames = []
    for file_idx, day, path in files:
        frames.append(spark.read.text(str(path)).select(
            F.lit(file_idx).alias("file_idx"), F.lit(day).alias("day"),
            F.col("_metadata.file_block_start").alias("block"),
            F.monotonically_increasing_id().alias("pos"),
            F.regexp_replace("value", "\r$", "").alias("line")))
    raw = frames[0]
    for frame in frames[1:]:
        raw = raw.unionByName(frame)
    # Three projections so that the split and the bad-row test run once per row (the optimizer
    # does not inline a non-trivial expression into several consumers).
    split = raw.select("file_idx", "day", "block", "pos", F.split("line", "\t", -1).alias("f"))
    fields = F.col("f")
    label_text = fields.getItem(0)
    bad = (F.size(fields) != NUM_FIELDS) | ~label_text.isin("0", "1")
    ints = []
    for i in range(NUM_INT):
        text = fields.getItem(1 + i)
        ints.append(F.when(text != "", text.cast("bigint")).alias(f"i{i}"))
    typed = split.select("file_idx", "day", "block", "pos", label_text.alias("label"), *ints,
                         *[fields.getItem(1 + NUM_INT + i).alias(f"t{i}") for i in range(NUM_CAT)],
                         *[fields.getItem(1 + i).alias(f"s{i}") for i in range(NUM_INT)], bad.alias("shape_bad"))
    unparsable = [(F.col(f"s{i}") != "") & (~F.col(f"s{i}").rlike(INT_RE) | F.col(f"i{i}").isNull())
                  for i in range(NUM_INT)]
    bad = F.col("shape_bad")
    for test in unparsable:
        bad = bad | test
    flagged = typed.select("*", F.coalesce(bad, F.lit(True)).alias("bad"))
    good = ~F.col("bad")
    columns = ["file_idx", "day", "block", "pos", "bad", F.when(good, F.col("label").cast("int")).alias("label")]
    columns += [F.when(good, F.col(f"i{i}")).alias(f"i{i}") for i in range(NUM_INT)]
    columns += [F.when(good & (F.col(f"t{i}") != ""), F.col(f"t{i}")).alias(f"c{i}") for i in range(NUM_CAT)]
    return flagged.select(*columns)
