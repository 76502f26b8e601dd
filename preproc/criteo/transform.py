"""Transform stage: raw rows -> binary pieces (label, numerical, per-column ids) per output mapping.

Shard ``I`` of ``N`` takes the day files whose index is ``I mod N``. First a
small job counts the lines of every input split (``file_idx``, ``block``) of
the files that need line numbers (the last day, for its cut at half of its
raw lines, and every training day under ``--train-order shuffle``); the
split counts (a few per file, collected to the driver) give each row its line
number in its file, whatever the split size. Categorical values are mapped
through the dictionary with one left join per column (broadcast when the
column's dictionary is small), numericals by the rule in ``Rules.numerical``.

Rows then go to pieces, written by Python workers as raw little-endian files
``label.bin`` (bool), ``numerical.bin`` (float16, 13 per row) and
``cat_<i>.bin`` (int8/16/32 by cardinality):

* input order (test, validation, and train under ``input``): at most ``2**20``
  consecutive lines of one input split per piece, sorted back into line order;
* shuffle (train under ``shuffle``): one piece per bucket (``key mod B``, B in
  dictionary.json), rows sorted by (key, file, line), plus ``order.bin``
  (key, file, line as int64) so that finalize can merge the buckets of
  several shards. The shuffle is Spark's ``groupBy`` exchange; nothing goes
  through the driver.

The shard directory is written atomically and verified (every file
``rows x record size`` bytes) before it is renamed into
``<output>.stages/shards/``; its ``manifest.json`` lists the pieces with
their mapping, bucket, rows and bad rows, and the bad rows per file.
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np

from preproc.criteo.layout import (_MASK31, _MIX, NUM_CAT, NUM_INT, NUMERICAL_FLOOR, NUMERICAL_SHIFT, SPEC_VERSION,
                                   Rules, Staging, categorical_dtype, shard_of, test_rows)
from preproc.criteo.read import read_days
from preproc.dataio import bad_rows
from preproc.dataio.output import atomic_dir, read_json
from preproc.errors import PreprocError

log = logging.getLogger("preproc.criteo")
PIECE_BITS = 20  # at most 2**20 lines per input-order piece
BROADCAST_MAX_VALUES = 2_000_000
PIECE_SCHEMA = ("piece string, mapping string, bucket long, file_idx int, block long, first_pos long, "
                "rows long, bad long")
ORDER_FILE = "order.bin"  # shuffle pieces: (key, file_idx, line) int64 per row, for finalize's merge


def record_sizes(cardinalities: list[int]) -> dict[str, int]:
    """Bytes per row of each output file."""
    sizes = {"label.bin": 1, "numerical.bin": 2 * NUM_INT}
    for i, card in enumerate(cardinalities):
        sizes[f"cat_{i}.bin"] = np.dtype(categorical_dtype(card)).itemsize
    return sizes


def _with_mix31(frame, source, target: str):
    """``frame`` + column ``target`` = ``layout.mix31(source)``, one projection per step.

    Each step reads its input twice; written as one expression the tree would
    grow 8-fold per mix (and the shuffle key nests five), so every step is its
    own column (the optimizer does not inline a column used twice).
    """
    from pyspark.sql import functions as F

    frame = frame.withColumn(f"{target}_a", source)
    for step, (shift, factor) in enumerate(((15, _MIX[0]), (12, _MIX[1]))):
        x = F.col(f"{target}_{'ab'[step]}")
        frame = frame.withColumn(f"{target}_{'bc'[step]}",
                                 (x.bitwiseXOR(F.shiftright(x, shift)) * F.lit(factor)).bitwiseAND(F.lit(_MASK31)))
    x = F.col(f"{target}_c")
    return frame.withColumn(target, x.bitwiseXOR(F.shiftright(x, 15))).drop(*[f"{target}_{c}" for c in "abc"])


def with_shuffle_key(frame, seed: int, file_idx: str = "file_idx", line: str = "line", target: str = "key"):
    """``frame`` + column ``target`` = ``layout.shuffle_key(seed, file_idx, line)`` (Spark version)."""
    from pyspark.sql import functions as F

    frame = _with_mix31(frame, F.col(file_idx).cast("long"), "_k_file")
    frame = _with_mix31(frame, F.lit(seed).cast("long").bitwiseXOR(F.col("_k_file")), "_k_salt")
    frame = _with_mix31(frame, F.col(line).bitwiseXOR(F.col("_k_salt")), "_k_hi")
    frame = _with_mix31(frame, F.col(line), "_k_line")
    frame = _with_mix31(frame, F.col("_k_hi").bitwiseXOR(F.col("_k_line")), "_k_lo")
    return (frame.withColumn(target, F.col("_k_hi") * F.lit(1 << 31) + F.col("_k_lo"))
            .drop("_k_file", "_k_salt", "_k_hi", "_k_line", "_k_lo"))


def numerical_column(x, rule: str):
    """The numerical transform of a bigint column (null = missing) as a float column."""
    from pyspark.sql import functions as F

    value = x.cast("double")
    if rule == "clamp":
        result = F.log(F.greatest(F.coalesce(value, F.lit(0.0)), F.lit(NUMERICAL_FLOOR)) + NUMERICAL_SHIFT)
    else:
        shifted = value + NUMERICAL_SHIFT
        result = F.when(value.isNotNull() & (shifted > 0), F.log(shifted)).otherwise(F.lit(0.0))
    return result.cast("float")


def _piece_writer(out_dir: str, dtypes: list[str]):
    """The pandas function that writes one piece (runs in the Python workers)."""

    def write(frame):
        import pandas as pd

        mapping, bucket = str(frame["mapping"].iloc[0]), int(frame["bucket"].iloc[0])
        if bucket >= 0:
            frame = frame.sort_values(["key", "file_idx", "line"], kind="stable")
            name = f"piece-{mapping}-bucket-{bucket:08d}"
            file_idx, block, first = -1, -1, -1
        else:
            frame = frame.sort_values("pos", kind="stable")
            file_idx, block = int(frame["file_idx"].iloc[0]), int(frame["block"].iloc[0])
            first = int(frame["pos"].iloc[0])
            name = f"piece-{mapping}-{file_idx:05d}-{block:016d}-{first:020d}"
        good = frame[~frame["bad"]]
        target = Path(out_dir) / name
        target.mkdir(exist_ok=True)     # never parents: a late task must not re-create a removed temporary
        arrays = {"label.bin": good["label"].to_numpy(dtype=np.int8).astype(np.bool_),
                  "numerical.bin": good[[f"n{i}" for i in range(NUM_INT)]].to_numpy(dtype=np.float32)
                  .astype(np.float16)}
        for i, dtype in enumerate(dtypes):
            arrays[f"cat_{i}.bin"] = good[f"id{i}"].to_numpy(dtype=np.int64).astype(dtype)
        if bucket >= 0:
            arrays[ORDER_FILE] = good[["key", "file_idx", "line"]].to_numpy(dtype=np.int64)
        for file, array in arrays.items():
            tmp = target / f".{file}.{os.getpid()}"
            with open(tmp, "wb") as handle:     # not ndarray.tofile: its short-write error has no errno
                handle.write(np.ascontiguousarray(array).data)
            os.replace(tmp, target / file)
        per_file = frame.groupby("file_idx")["bad"].agg(["size", "sum"])
        return pd.DataFrame({"piece": name, "mapping": mapping, "bucket": bucket, "file_idx": per_file.index,
                             "block": block, "first_pos": first,
                             "rows": (per_file["size"] - per_file["sum"]).to_numpy(),
                             "bad": per_file["sum"].to_numpy()})

    return write


def _line_numbers(spark, rows, file_indexes: list[int]):
    """(DataFrame file_idx, block, first, offset) of the splits of ``file_indexes``, {file_idx: lines}."""
    from pyspark.sql import functions as F

    if not file_indexes:
        return None, {}
    splits = (rows.where(F.col("file_idx").isin(file_indexes)).groupBy("file_idx", "block")
              .agg(F.count("*").alias("n"), F.min("pos").alias("first")).collect())
    offsets, lines = [], {}
    for r in sorted(splits, key=lambda r: (r["file_idx"], r["block"])):
        start = lines.get(r["file_idx"], 0)
        offsets.append((int(r["file_idx"]), int(r["block"]), int(r["first"]), start))
        lines[r["file_idx"]] = start + int(r["n"])
    schema = "file_idx int, block long, first long, offset long"
    return spark.createDataFrame(offsets, schema), lines


def transform_shard(spark, staging: Staging, dictionary: dict, shard: int, num_shards: int,
                    bad_row_policy: str) -> dict:
    """Transform the files of one shard into ``staging.shard(shard, num_shards)``; returns its manifest."""
    from pyspark.sql import functions as F

    rules = Rules.from_dict(dictionary["rules"])
    files = [(f["file_idx"], f["day"], Path(f["path"])) for f in dictionary["files"]
             if shard_of(f["file_idx"], num_shards) == shard]
    last_day = dictionary["last_day"]
    shuffle = rules.train_order == "shuffle"
    cardinalities = dictionary["cardinalities"]
    dtypes = [categorical_dtype(c) for c in cardinalities]
    final = staging.shard(shard, num_shards)
    with atomic_dir(final, overwrite=True, verify=lambda d: verify_shard(d, cardinalities)) as tmp:
        written = []
        if files:
            log.info("transform: shard %d/%d, %d day file(s): %s", shard, num_shards, len(files),
                     ", ".join(p.name for _, _, p in files))
            rows = read_days(spark, files)
            numbered = [idx for idx, day, _ in files if shuffle or day == last_day]
            offsets, lines = _line_numbers(spark, rows, numbered)
            for f in dictionary["files"]:
                if f["file_idx"] in lines and lines[f["file_idx"]] != f["lines"]:
                    raise PreprocError(f"{f['path']}: {lines[f['file_idx']]} lines now, {f['lines']} when the "
                                       "dictionary was built (input changed: re-run the dictionary stage)")
            if offsets is not None:
                rows = rows.join(F.broadcast(offsets), on=["file_idx", "block"], how="left").select(
                    "*", (F.col("offset") + F.col("pos") - F.col("first")).alias("line"))
            else:
                rows = rows.select("*", F.lit(None).cast("long").alias("line"))
            last = [f for f in dictionary["files"] if f["day"] == last_day][0]
            cut = test_rows(last["lines"])
            mapping = (F.when(F.col("day") < F.lit(last_day), F.lit("train"))
                       .when(F.col("line") < F.lit(cut), F.lit("test")).otherwise(F.lit("validation")))
            values = spark.read.parquet(str(staging.dictionary / "values"))
            columns = ["file_idx", "block", "pos", "line", "bad", F.coalesce("label", F.lit(0)).alias("label")]
            columns += [numerical_column(F.col(f"i{i}"), rules.numerical).alias(f"n{i}") for i in range(NUM_INT)]
            frame = rows.select("*", mapping.alias("mapping"))
            columns.append("mapping")
            for i in range(NUM_CAT):
                table = values.where(F.col("col") == i).select(F.col("value").alias(f"c{i}"),
                                                               F.col("id").alias(f"id{i}"))
                if cardinalities[i] - 1 <= BROADCAST_MAX_VALUES:
                    table = F.broadcast(table)
                frame = frame.join(table, on=f"c{i}", how="left")
            columns += [F.coalesce(F.col(f"id{i}"), F.lit(0)).cast("int").alias(f"id{i}") for i in range(NUM_CAT)]
            frame = frame.select(*columns)
            shuffled = (F.col("mapping") == "train") & F.lit(shuffle)
            if shuffle:
                frame = with_shuffle_key(frame, rules.seed)
            else:
                frame = frame.withColumn("key", F.lit(None).cast("long"))
            key = F.col("key")
            frame = frame.select(
                "*",
                F.when(shuffled, F.pmod(key, F.lit(int(dictionary["shuffle_buckets"])))).otherwise(F.lit(-1))
                .cast("long").alias("bucket"),
                F.when(shuffled, F.lit(-1)).otherwise(F.col("file_idx")).alias("g_file"),
                F.when(shuffled, F.lit(-1)).otherwise(F.col("block")).alias("g_block"),
                F.when(shuffled, F.lit(-1)).otherwise(F.shiftright(F.col("pos"), PIECE_BITS)).alias("g_piece"))
            written = [r.asDict() for r in frame.groupBy("mapping", "bucket", "g_file", "g_block", "g_piece")
                       .applyInPandas(_piece_writer(str(tmp), dtypes), PIECE_SCHEMA).collect()]
        pieces = {}
        for r in written:
            piece = pieces.setdefault(r["piece"], dict(r, file_idx=r["file_idx"] if r["bucket"] < 0 else -1,
                                                       rows=0, bad=0))
            piece["rows"] += r["rows"]
            piece["bad"] += r["bad"]
        pieces = sorted(pieces.values(), key=piece_order)
        stats = {}
        for idx, _, path in files:
            mine = [r for r in written if r["file_idx"] == idx]
            stats[str(path)] = (sum(r["bad"] for r in mine), sum(r["rows"] + r["bad"] for r in mine))
        report = bad_rows.enforce(stats, bad_row_policy, what="criteo transform")
        manifest = {"format": SPEC_VERSION, "dictionary_id": dictionary["id"], "shard": shard,
                    "num_shards": num_shards, "file_idx": [idx for idx, _, _ in files], "pieces": pieces,
                    "bad_rows": report}
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    log.info("transform: shard %d/%d wrote %d rows in %d piece(s)", shard, num_shards,
             sum(p["rows"] for p in pieces), len(pieces))
    return manifest


def piece_order(piece: dict) -> tuple:
    """Output order of pieces within a mapping: buckets in order, else input order."""
    return (piece["mapping"], piece["bucket"], piece["file_idx"], piece["block"], piece["first_pos"])


def read_manifest(directory: Path) -> dict:
    return read_json(directory / "manifest.json", "transform shard manifest", "re-run that transform task")


def verify_shard(directory: Path, cardinalities: list[int]) -> None:
    """Every piece file exists and holds exactly rows x record size bytes."""
    manifest = read_manifest(directory)
    for piece in manifest.get("pieces", ()):
        sizes = dict(record_sizes(cardinalities))
        if piece["bucket"] >= 0:
            sizes[ORDER_FILE] = 3 * 8
        for file, size in sizes.items():
            path = directory / piece["piece"] / file
            want = piece["rows"] * size
            got = path.stat().st_size if path.exists() else None
            if got != want:
                raise PreprocError(f"verification failed: {path}: {got} bytes, expected {want} "
                                   f"({piece['rows']} rows x {size} B); re-run that transform task")


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
        manifest = read_manifest(directory)
        if manifest.get("dictionary_id") != dictionary["id"]:
            raise PreprocError(f"{directory}: made with another dictionary (re-run the transform stage)")
        verify_shard(directory, dictionary["cardinalities"])
        for piece in manifest["pieces"]:
            piece["dir"] = str(directory / piece["piece"])
        manifests.append(manifest)
    return manifests
