"""Transform stage: raw rows -> binary pieces (label, numerical, per-column ids) in input order.

Shard ``I`` of ``N`` takes the day files whose index is ``I mod N``. Categorical
values are mapped through the dictionary with one left join per column
(broadcast when the column's dictionary is small), numericals through
``ln(3 + max(x, 0))`` (missing = 0). Rows are then grouped into pieces of at most
``2**20`` consecutive input lines (one input split at a time) and each piece is
written by a Python worker as raw little-endian files ``label.bin`` (bool),
``numerical.bin`` (float16, 13 per row) and ``cat_<i>.bin`` (int8/16/32 by
cardinality), sorted back into line order. The shard directory is written
atomically and verified (every file ``rows x record size`` bytes) before it is
renamed into ``<output>.stages/shards/``; its ``manifest.json`` lists the
pieces in input order with their row and bad-row counts.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from preproc import bad_rows
from preproc.criteo_layout import (NUM_CAT, NUM_INT, NUMERICAL_FLOOR, NUMERICAL_SHIFT, Staging,
                                   categorical_dtype, shard_of)
from preproc.criteo_read import read_days
from preproc.errors import PreprocError
from preproc.output import atomic_dir

log = logging.getLogger("preproc.criteo")
PIECE_BITS = 20  # at most 2**20 lines per piece
BROADCAST_MAX_VALUES = 2_000_000
PIECE_SCHEMA = "piece string, file_idx int, block long, first_pos long, rows long, bad long"


def record_sizes(cardinalities: list[int]) -> dict[str, int]:
    """Bytes per row of each output file."""
    sizes = {"label.bin": 1, "numerical.bin": 2 * NUM_INT}
    for i, card in enumerate(cardinalities):
        sizes[f"cat_{i}.bin"] = np.dtype(categorical_dtype(card)).itemsize
    return sizes


def _piece_writer(out_dir: str, dtypes: list[str]):
    """The pandas function that writes one piece (runs in the Python workers)."""

    def write(frame):
        import pandas as pd

        frame = frame.sort_values("pos", kind="stable")
        good = frame[~frame["bad"]]
        file_idx, block = int(frame["file_idx"].iloc[0]), int(frame["block"].iloc[0])
        first = int(frame["pos"].iloc[0])
        name = f"piece-{file_idx:05d}-{block:016d}-{first:020d}"
        target = Path(out_dir) / name
        target.mkdir(parents=True, exist_ok=True)
        arrays = {"label.bin": good["label"].to_numpy(dtype=np.int8).astype(np.bool_),
                  "numerical.bin": good[[f"n{i}" for i in range(NUM_INT)]].to_numpy(dtype=np.float32)
                  .astype(np.float16)}
        for i, dtype in enumerate(dtypes):
            arrays[f"cat_{i}.bin"] = good[f"id{i}"].to_numpy(dtype=np.int64).astype(dtype)
        for file, array in arrays.items():
            tmp = target / f".{file}.{os.getpid()}"
            np.ascontiguousarray(array).tofile(tmp)
            os.replace(tmp, target / file)
        return pd.DataFrame({"piece": [name], "file_idx": [file_idx], "block": [block], "first_pos": [first],
                             "rows": [len(good)], "bad": [len(frame) - len(good)]})

    return write


def transform_shard(spark, staging: Staging, dictionary: dict, shard: int, num_shards: int,
                    bad_row_policy: str) -> dict:
    """Transform the files of one shard into ``staging.shard(shard, num_shards)``; returns its manifest."""
    from pyspark.sql import functions as F

    files = [(f["file_idx"], f["day"], Path(f["path"])) for f in dictionary["files"]
             if shard_of(f["file_idx"], num_shards) == shard]
    cardinalities = dictionary["cardinalities"]
    dtypes = [categorical_dtype(c) for c in cardinalities]
    final = staging.shard(shard, num_shards)
    with atomic_dir(final, overwrite=True, verify=lambda d: verify_shard(d, cardinalities)) as tmp:
        pieces = []
        if files:
            log.info("transform: shard %d/%d, %d day file(s): %s", shard, num_shards, len(files),
                     ", ".join(p.name for _, _, p in files))
            rows = read_days(spark, files)
            values = spark.read.parquet(str(staging.dictionary / "values"))
            columns = ["file_idx", "block", "pos", "bad", F.coalesce("label", F.lit(0)).alias("label")]
            columns += [F.log(F.greatest(F.coalesce(F.col(f"i{i}"), F.lit(0)).cast("double"),
                                         F.lit(NUMERICAL_FLOOR)) + NUMERICAL_SHIFT).cast("float").alias(f"n{i}")
                        for i in range(NUM_INT)]
            frame = rows
            for i in range(NUM_CAT):
                table = values.where(F.col("col") == i).select(F.col("value").alias(f"c{i}"),
                                                               F.col("id").alias(f"id{i}"))
                if cardinalities[i] - 1 <= BROADCAST_MAX_VALUES:
                    table = F.broadcast(table)
                frame = frame.join(table, on=f"c{i}", how="left")
            columns += [F.coalesce(F.col(f"id{i}"), F.lit(0)).cast("int").alias(f"id{i}") for i in range(NUM_CAT)]
            frame = frame.select(*columns).withColumn(
                "piece_key", F.shiftright(F.col("pos"), PIECE_BITS))
            written = (frame.groupBy("file_idx", "block", "piece_key")
                       .applyInPandas(_piece_writer(str(tmp), dtypes), PIECE_SCHEMA).collect())
            pieces = sorted((r.asDict() for r in written), key=lambda r: (r["file_idx"], r["block"], r["first_pos"]))
        stats = {}
        for idx, _, path in files:
            mine = [p for p in pieces if p["file_idx"] == idx]
            stats[str(path)] = (sum(p["bad"] for p in mine), sum(p["rows"] + p["bad"] for p in mine))
        report = bad_rows.enforce(stats, bad_row_policy, what="criteo transform")
        manifest = {"dictionary_id": dictionary["id"], "shard": shard, "num_shards": num_shards,
                    "file_idx": [idx for idx, _, _ in files], "pieces": pieces, "bad_rows": report}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    log.info("transform: shard %d/%d wrote %d rows in %d piece(s)", shard, num_shards,
             sum(p["rows"] for p in pieces), len(pieces))
    return manifest


def verify_shard(directory: Path, cardinalities: list[int]) -> None:
    """Every piece file exists and holds exactly rows x record size bytes."""
    manifest = json.loads((directory / "manifest.json").read_text())
    sizes = record_sizes(cardinalities)
    for piece in manifest["pieces"]:
        for file, size in sizes.items():
            path = directory / piece["piece"] / file
            want = piece["rows"] * size
            got = path.stat().st_size if path.exists() else None
            if got != want:
                raise PreprocError(f"verification failed: {path}: {got} bytes, expected {want} "
                                   f"({piece['rows']} rows x {size} B)")


def load_shards(staging: Staging, dictionary: dict) -> list[dict]:
    """Manifests of a complete, verified set of shards made with ``dictionary``; pieces carry their dir."""
    found = sorted(staging.shards.glob("shard-*-of-*")) if staging.shards.exists() else []
    if not found:
        raise PreprocError(f"{staging.shards}: no finished transform shards (run the transform stage first)")
    counts = {p.name.rsplit("-of-", 1)[1] for p in found}
    if len(counts) > 1:
        raise PreprocError(f"{staging.shards}: shards of different --num-shards ({', '.join(sorted(counts))}); "
                           "re-run the dictionary stage to start over")
    num_shards = int(counts.pop())
    manifests = []
    for index in range(num_shards):
        directory = staging.shard(index, num_shards)
        if not directory.exists():
            raise PreprocError(f"{directory}: transform shard {index} of {num_shards} missing (re-run that task)")
        manifest = json.loads((directory / "manifest.json").read_text())
        if manifest["dictionary_id"] != dictionary["id"]:
            raise PreprocError(f"{directory}: made with another dictionary (re-run the transform stage)")
        verify_shard(directory, dictionary["cardinalities"])
        for piece in manifest["pieces"]:
            piece["dir"] = str(directory / piece["piece"])
        manifests.append(manifest)
    return manifests
