"""Dictionary stage: per categorical column, value -> id by descending frequency.

One pass over every day file counts, in the same aggregation, the (column,
value) pairs of the dictionary days (all days, as the reference, or the
training days only: ``Rules.dictionary_days``) and the total and bad rows of
every file, the last day included (as pseudo-columns -1 and -2), so bad rows
are reported, and ``--bad-rows fatal`` stops, before anything is transformed. Ids: 1.. by
descending count, ties by ascending value; values below the column's threshold
are left out (they, unseen values and missing values become 0 in the transform).

Output (``<output>.stages/dictionary/``, written atomically):

* ``values/col=<i>/*.parquet``: (value string, id int) of kept values;
* ``dictionary.json`` (``format`` = layout.SPEC_VERSION): the rules,
  thresholds, cardinalities (kept + 1), distinct values and
  the cardinality each column would have at T = 0, 3, 15 (for the size report),
  the input files with their days, sizes, lines and bad-row counts, the number of
  shuffle buckets, and a random id that
  the transform shards record so finalize can refuse shards of an older dictionary.
"""
from __future__ import annotations

import json
import logging
import uuid
from dataclasses import asdict
from pathlib import Path

from preproc.criteo.layout import (MAX_FILE_LINES, NUM_CAT, REPORT_THRESHOLDS, SPEC_VERSION, Rules, Staging,
                                   shuffle_buckets)
from preproc.criteo.read import read_days
from preproc.dataio import bad_rows
from preproc.dataio.output import atomic_dir, read_json
from preproc.errors import PreprocError

log = logging.getLogger("preproc.criteo")
FILE_TOTAL, FILE_BAD = -1, -2


def build_dictionary(spark, staging: Staging, files: list[tuple[int, int, Path]], last_day: int,
                     thresholds: list[int], bad_row_policy: str, rules: Rules = Rules()) -> dict:
    """Count, threshold and number the categorical values of the dictionary days; returns dictionary.json."""
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rows = read_days(spark, files)
    counted = F.lit(True) if rules.dictionary_days == "all" else F.col("day") < F.lit(last_day)
    pairs = [F.struct(F.lit(i).alias("col"), F.when(counted, F.col(f"c{i}")).alias("value"))
             for i in range(NUM_CAT)]
    file_name = F.col("file_idx").cast("string")
    pairs.append(F.struct(F.lit(FILE_TOTAL).alias("col"), file_name.alias("value")))
    pairs.append(F.struct(F.lit(FILE_BAD).alias("col"), F.when(F.col("bad"), file_name).alias("value")))
    counts = (rows.select(F.explode(F.array(*pairs)).alias("p")).select("p.col", "p.value")
              .where(F.col("value").isNotNull()).groupBy("col", "value").count()
              .persist(StorageLevel.MEMORY_AND_DISK))
    try:
        log.info("dictionary: counting values of %s of %d day file(s)", rules.dictionary_days, len(files))
        per_file = {(r["col"], int(r["value"])): r["count"] for r in counts.where(F.col("col") < 0).collect()}
        paths = {idx: str(path) for idx, _, path in files}
        stats = {paths[idx]: (per_file.get((FILE_BAD, idx), 0), per_file.get((FILE_TOTAL, idx), 0))
                 for idx in paths}
        report = bad_rows.enforce(stats, bad_row_policy, what="criteo dictionary")
        lines = {idx: per_file.get((FILE_TOTAL, idx), 0) for idx in paths}
        too_long = [paths[i] for i, n in lines.items() if n > MAX_FILE_LINES]
        if too_long:
            raise PreprocError(f"{too_long[0]}: more than {MAX_FILE_LINES} lines in one day file (split it)")
        train_lines = sum(lines[idx] for idx, day, _ in files if day < last_day)

        threshold_map = F.create_map(*[F.lit(x) for i, t in enumerate(thresholds) for x in (i, t)])
        values = counts.where(F.col("col") >= 0)
        kept = values.where(F.col("count") >= threshold_map[F.col("col")])
        order = Window.partitionBy("col").orderBy(F.desc("count"), F.asc("value"))
        numbered = kept.withColumn("id", F.row_number().over(order).cast("int"))
        summary_exprs = [F.count("*").alias("distinct")]
        summary_exprs += [F.sum((F.col("count") >= t).cast("long")).alias(f"kept_{t}") for t in REPORT_THRESHOLDS]
        summary = {r["col"]: r for r in values.groupBy("col").agg(*summary_exprs).collect()}

        def verify(tmp: Path) -> None:
            _verify_dictionary(tmp, meta)

        with atomic_dir(staging.dictionary, overwrite=True, verify=verify) as tmp:
            numbered.select("col", "value", "id").write.partitionBy("col").parquet(str(tmp / "values"))
            kept_counts = _kept_per_column(tmp / "values")
            meta = {
                "format": SPEC_VERSION,
                "id": uuid.uuid4().hex,
                "rules": asdict(rules),
                "shuffle_buckets": shuffle_buckets(train_lines),
                "thresholds": thresholds,
                "cardinalities": [kept_counts.get(i, 0) + 1 for i in range(NUM_CAT)],
                "distinct": [int(summary[i]["distinct"]) if i in summary else 0 for i in range(NUM_CAT)],
                "cardinality_at": {str(t): [int(summary[i][f"kept_{t}"] or 0) + 1 if i in summary else 1
                                            for i in range(NUM_CAT)] for t in REPORT_THRESHOLDS},
                "files": [{"file_idx": idx, "day": day, "path": str(path), "bytes": path.stat().st_size,
                           "lines": lines[idx]} for idx, day, path in files],
                "last_day": last_day,
                "bad_rows": report,
            }
            (tmp / "dictionary.json").write_text(json.dumps(meta, indent=1))
    finally:
        counts.unpersist()
    # Shards transformed with an older dictionary are useless now.
    if staging.shards.exists():
        import shutil
        shutil.rmtree(staging.shards)
    log.info("dictionary: cardinalities %s", meta["cardinalities"])
    return meta


def _kept_per_column(values_dir: Path) -> dict[int, int]:
    import pyarrow.parquet as pq

    kept = {}
    for part in values_dir.glob("col=*"):
        rows = 0
        for f in part.glob("*.parquet"):
            try:
                rows += pq.ParquetFile(f).metadata.num_rows
            except Exception as exc:  # pyarrow raises ArrowInvalid/OSError for a truncated file
                raise PreprocError(f"verification failed: {f}: unreadable parquet ({str(exc).splitlines()[0]}); "
                                   "re-run the dictionary stage") from None
        kept[int(part.name.split("=", 1)[1])] = rows
    return kept


def _verify_dictionary(directory: Path, meta: dict) -> None:
    kept = _kept_per_column(directory / "values")
    for i, cardinality in enumerate(meta["cardinalities"]):
        if kept.get(i, 0) + 1 != cardinality:
            raise PreprocError(f"verification failed: {directory}/values/col={i}: {kept.get(i, 0)} values, "
                               f"expected {cardinality - 1}")


def load_dictionary_meta(staging: Staging) -> dict:
    """dictionary.json of a finished dictionary stage, re-verified against its parquet files."""
    path = staging.dictionary / "dictionary.json"
    if not path.is_file():
        raise PreprocError(f"{staging.dictionary}: no finished dictionary stage (run the dictionary stage first)")
    meta = read_json(path, "dictionary record", "re-run the dictionary stage")
    if meta.get("format") != SPEC_VERSION:
        raise PreprocError(f"{path}: format {meta.get('format')!r}, this version reads {SPEC_VERSION} "
                           "(re-run the dictionary stage)")
    _verify_dictionary(staging.dictionary, meta)
    return meta
