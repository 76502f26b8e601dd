"""MovieLens (ml-1m, ml-20m) -> NCF training data, with PySpark.

Input: ml-1m ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``, no header)
or ml-20m ``ratings.csv`` (header ``userId,movieId,rating,timestamp``); the
format is taken from the file name unless ``--format`` says otherwise.

Pipeline, in this order (implicit feedback: every rating is a positive):

1. Parse; rows with the wrong field count or unparsable numbers are counted per
   file and skipped (``--bad-rows skip``, default) or fatal (``--bad-rows fatal``).
2. De-duplicate (user, item): keep the latest rating (largest timestamp; among
   equal timestamps the highest rating).
3. Drop users with fewer than ``--min-ratings`` (default 20) distinct items after
   de-duplication; a user with exactly ``min_ratings`` is kept.
4. Re-index densely, 0-based: users in ascending original user id, items in
   ascending original item id, over the users and items that survive step 3.
5. Leave-last-out: each user's latest interaction is the test positive; ties on
   the timestamp are broken by the larger original item id. With ``--validation``
   (leave-two-out) the user's second latest is its validation positive, which the
   training run judges its epochs on (the engine samples its negatives; the test set
   is then evaluated once, with the chosen weights). Everything else is training.
6. Optional test negatives (``--test-negatives N``, default 0, because
   recsys.data.ncf samples the evaluation negatives itself): per test user, N
   distinct items the user never interacted with, drawn uniformly with a
   per-user seeded generator (reproducible for a given ``--seed``); written after
   the positive so every user owns ``1 + negatives`` consecutive test rows. A
   user with fewer unseen items than that is left out of the test set (logged).

Output (``OUT/``, written to a temporary sibling and renamed after
verification against the spec): ``--num-files`` parquet files per mapping,
``train/part_NNNNN.parquet`` (columns ``user`` int32, ``item`` int32,
``label`` float32 = 1) and ``test/part_NNNNN.parquet`` (same columns: one row
per user, label 1, the held-out positive, in file ``user % num_files``; with
test negatives also their label-0 rows, a user's rows consecutive in one file),
``validation/part_NNNNN.parquet`` with ``--validation`` (one positive per user, as test
without negatives), plus ``feature_spec.yaml`` with the user/item cardinalities, channels
``user_ch``/``item_ch``/``label_ch`` and metadata ``test_samples_per_series``
= 1 + negatives.
"""
from __future__ import annotations

import logging
import os

from preproc.dataio import textio
from preproc.errors import PreprocError
from preproc.movielens.format import LAYOUTS, RATING_COLUMNS

log = logging.getLogger("preproc.movielens")

def locate_ratings(input_path: str, fmt: str | None = None) -> tuple[str, str]:
    """Return (ratings file, format) for a file or a directory holding one; no Spark, one-line errors."""
    from preproc.dataio.output import input_files

    if fmt is not None and fmt not in LAYOUTS:
        raise PreprocError(f"--format: unknown MovieLens format {fmt!r} (ml-1m or ml-20m)")
    if os.path.isdir(input_path):
        names = [LAYOUTS[fmt][0]] if fmt else [layout[0] for layout in LAYOUTS.values()]
        found = [os.path.join(input_path, n) for n in names if os.path.isfile(os.path.join(input_path, n))]
        if not found:
            raise PreprocError(f"--input: {input_path}: no {' or '.join(names)} in the directory")
        if len(found) > 1:
            raise PreprocError(f"--input: {input_path}: holds both ratings.dat and ratings.csv; pass --format")
        path = found[0]
    else:
        path = input_path
    path = str(input_files(path)[0])  # exists and is not empty
    if fmt is None:
        fmt = "ml-20m" if path.endswith((".csv", ".csv.gz")) else "ml-1m"
    header = LAYOUTS[fmt][2]
    first = textio.first_line(path)
    if header is not None and first != header:
        raise PreprocError(f"--input: {path}: first line is {first[:60]!r}, expected the {fmt} header {header!r}")
    if textio.line_count_at_most(path, 2 if header else 1) < (2 if header else 1):
        raise PreprocError(f"--input: {path}: no ratings in the file")
    return path, fmt


def read_ratings(spark, path: str, fmt: str, bad_rows: str = "skip"):
    """(ratings DataFrame (user, item, rating, timestamp) without bad rows, bad-row report)."""
    _, sep, header = LAYOUTS[fmt]
    parsed = textio.parse_delimited(spark, path, RATING_COLUMNS, sep, header=header)
    return textio.drop_bad_rows(parsed, bad_rows, what=f"MovieLens {fmt}")


def split_leave_last_out(ratings, min_ratings: int = 20, validation: bool = False):
    """Steps 2-5 of the module docstring: returns (train, test, n_users, n_items, validation), the
    last None without ``validation``.

    ``train``, ``test`` and ``validation`` have dense 0-based ``user``/``item`` columns and the
    original ``timestamp``; ``test`` (and ``validation``) has exactly one row per kept user.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    latest = Window.partitionBy("user", "item").orderBy(F.desc("timestamp"), F.desc("rating"))
    dedup = (ratings.withColumn("_r", F.row_number().over(latest)).filter("_r = 1").drop("_r"))
    per_user = dedup.groupBy("user").agg(F.count("*").alias("_n"))
    kept = dedup.join(per_user.filter(F.col("_n") >= min_ratings).select("user"), "user")
    users = _dense_index(kept, "user")
    items = _dense_index(kept, "item")
    n_users, n_items = users.count(), items.count()
    dense = (kept.join(F.broadcast(users) if n_users < 5_000_000 else users, "user")
             .join(F.broadcast(items) if n_items < 5_000_000 else items, "item")
             .select(F.col("user_idx").cast("int").alias("user"), F.col("item_idx").cast("int").alias("item"),
                     "timestamp", F.col("item").alias("_orig_item")))
    last = Window.partitionBy("user").orderBy(F.desc("timestamp"), F.desc("_orig_item"))
    ranked = dense.withColumn("_r", F.row_number().over(last))
    test = ranked.filter("_r = 1").select("user", "item", "timestamp")
    held = ranked.filter("_r = 2").select("user", "item", "timestamp") if validation else None
    train = ranked.filter(f"_r > {2 if validation else 1}").select("user", "item", "timestamp")
    return train, test, n_users, n_items, held


def _dense_index(df, column: str):
    """(column, column_idx): 0-based ids in ascending order of the original value."""
    from pyspark.sql import types as T

    distinct = df.select(column).distinct().orderBy(column)
    indexed = distinct.rdd.zipWithIndex().map(lambda pair: (pair[0][0], pair[1]))
    schema = T.StructType([T.StructField(column, T.LongType()), T.StructField(f"{column}_idx", T.LongType())])
    return df.sparkSession.createDataFrame(indexed, schema)


def sample_test_negatives(train, test, n_items: int, negatives: int, seed: int):
    """Test series: per test user the positive (label 1, ``_pos`` 0) then ``negatives`` items (label 0).

    Negatives are distinct items the user never interacted with, drawn with a
    generator seeded by (seed, user), so the test set is reproducible. A user
    with fewer than ``negatives`` unseen items cannot form a full series and is
    left out of the test set (counted in the log); their training rows stay.
    """
    import numpy as np
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if negatives <= 0:
        return test.select("user", "item", F.lit(1.0).cast("float").alias("label"), F.lit(0).alias("_pos"))
    if negatives > n_items - 1:
        raise PreprocError(f"--test-negatives {negatives}: only {n_items} items in the data")
    seen = (train.select("user", "item").unionByName(test.select("user", "item"))
            .groupBy("user").agg(F.collect_set("item").alias("_seen")))
    series = test.select("user", "item").join(seen, "user")
    short_users = train.sparkSession.sparkContext.accumulator(0)

    def draw(rows):
        for row in rows:
            seen_items = set(row._seen)
            if n_items - len(seen_items) < negatives:
                short_users.add(1)
                continue
            rng = np.random.default_rng([seed, row.user])
            chosen, picked = [], set()
            while len(chosen) < negatives:
                for cand in rng.integers(0, n_items, size=2 * negatives).tolist():
                    if cand not in seen_items and cand not in picked:
                        picked.add(cand)
                        chosen.append(cand)
                        if len(chosen) == negatives:
                            break
            yield (row.user, row.item, 1.0, 0)
            for pos, item in enumerate(chosen, start=1):
                yield (row.user, int(item), 0.0, pos)

    schema = T.StructType([T.StructField("user", T.IntegerType()), T.StructField("item", T.IntegerType()),
                           T.StructField("label", T.FloatType()), T.StructField("_pos", T.IntegerType())])
    result = train.sparkSession.createDataFrame(series.rdd.mapPartitions(draw), schema)
    result.short_users = short_users
    return result


def feature_spec_dict(n_users: int, n_items: int, train_files, test_files, negatives: int, extra: dict,
                      validation_files=None) -> dict:
    """The feature specification (hpc-facts §4 layout) of the written dataset."""
    features = ["user", "item", "label"]
    return {
        "feature_spec": {
            "user": {"dtype": "int32", "cardinality": int(n_users)},
            "item": {"dtype": "int32", "cardinality": int(n_items)},
            "label": {"dtype": "float32"},
        },
        "channel_spec": {"user_ch": ["user"], "item_ch": ["item"], "label_ch": ["label"]},
        "source_spec": {
            "train": [{"type": "parquet", "features": features, "files": list(train_files)}],
            "test": [{"type": "parquet", "features": features, "files": list(test_files)}],
            **({"validation": [{"type": "parquet", "features": features, "files": list(validation_files)}]}
               if validation_files else {}),
        },
        "metadata": {"dataset": "movielens", "test_samples_per_series": 1 + max(0, negatives), **extra},
    }


def run(spark, input_path: str, output: str, fmt: str | None = None, min_ratings: int = 20,
        test_negatives: int = 0, num_files: int = 1, seed: int = 0, bad_rows: str = "skip",
        overwrite: bool = False, validation: bool = False) -> dict:
    """The whole pipeline; returns the feature-spec dict written to ``output``."""
    from pyspark.sql import functions as F

    from preproc.dataio.output import atomic_dir, verify_against_spec

    path, fmt = locate_ratings(input_path, fmt)
    ratings, report = read_ratings(spark, path, fmt, bad_rows)
    train, test, n_users, n_items, held = split_leave_last_out(ratings, min_ratings, validation)
    if n_users == 0:
        raise PreprocError(f"--min-ratings: no user of {path} has {min_ratings} or more ratings")
    log.info("movielens: %d users, %d items after --min-ratings %d", n_users, n_items, min_ratings)
    seen = train if held is None else train.unionByName(held)      # a test negative is no user's item
    test_rows = sample_test_negatives(seen, test, n_items, test_negatives, seed).cache()
    train_rows = train.select("user", "item", F.lit(1.0).cast("float").alias("label"))
    # What Spark counts, independently of the files: the verification compares the two.
    rows = {"train": train_rows.count(), "test": test_rows.count()}
    if held is not None:
        held_rows = held.select("user", "item", F.lit(1.0).cast("float").alias("label"))
        rows["validation"] = held_rows.count()

    def verify(stage):
        verify_against_spec(stage, rows)

    try:
        with atomic_dir(output, overwrite, verify=verify) as stage:
            train_files, _ = textio.write_parquet_files(
                train_rows, stage, "train", num_files, by=None, sort_by=["user", "item"])
            test_files, _ = textio.write_parquet_files(
                test_rows.withColumn("_f", F.col("user") % num_files), stage, "test", num_files,
                by="_f", sort_by=["user", "_pos"], drop=["_pos"])
            validation_files = None
            if held is not None:
                validation_files, _ = textio.write_parquet_files(
                    held_rows.withColumn("_f", F.col("user") % num_files), stage, "validation", num_files,
                    by="_f", sort_by=["user"])
            spec = feature_spec_dict(n_users, n_items, train_files, test_files, test_negatives,
                                     {"format": fmt, "min_ratings": min_ratings, "seed": seed, "rows": dict(rows),
                                      "bad_rows": report, "users_without_full_test_series": _short(test_rows)},
                                     validation_files)
            textio.write_feature_spec(spec, stage)
    finally:
        test_rows.unpersist()
    log.info("movielens: wrote %d train and %d test rows to %s", rows["train"], rows["test"], output)
    return spec


def _short(test_rows) -> int:
    acc = getattr(test_rows, "short_users", None)
    if acc is not None and acc.value:
        log.warning("movielens: %d users with too few unseen items for a full test series left out of the test set",
                    acc.value)
    return int(acc.value) if acc is not None else 0

