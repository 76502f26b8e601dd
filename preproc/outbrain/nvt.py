"""Outbrain -> Wide & Deep reference dataset with NVTabular (``outbrain run --engine nvtabular``).

Builds the same dataset as the Spark engine (preproc.outbrain.pipeline, reference
feature set of preproc.outbrain.features): same rows, split, ids, lists and numericals
(to float tolerance), same output layout and ``feature_spec.yaml``.

Two steps, as NVIDIA's recipe splits them:

1. Raw tables -> one event x ad frame (pandas): the CSVs are parsed with the
   Spark engine's bad-row rules, clicks_train is joined to events,
   promoted_content and both documents' metadata, and every display is split
   train/test by the same rule (``xxhash64(display_id, seed)`` rank per day).
2. An ``nvtabular.Workflow`` fitted on the training rows turns that frame into
   features: thresholded CTRs and view counts (``TrainingCtr``, a stat op),
   ``FillMissing`` / ``LogOp`` / ``Normalize``, the exact training median for
   unknown document ages (``ExactMedianFill``), the page/ad cosine similarities
   (``DocumentCosine``), the page document's attribute lists through
   ``JoinExternal``, and Spark-compatible hashed ids (``SparkHashBucket``).
   The fitted workflow is saved as ``OUT/workflow`` (``nvtabular.Workflow.load``
   then ``transform`` of a frame from :func:`joined_frame` applies the same
   transform to new data).

Where the workflow runs is decided as for Criteo (``--device auto|cpu|gpu``,
``preproc.runtime.dask_cluster``): pandas partitions on dask's threads (CPU, the
default without GPUs), cudf partitions on a ``LocalCUDACluster`` with one worker
per GPU (``--device gpu``, or ``auto`` where GPUs are visible and cudf imports),
or the workers of a dask cluster started by slurm/dask-cluster.sh. On the GPU,
NVTabular's own operators (``FillMissing``, ``LogOp``, ``Normalize``,
``JoinExternal``) and the statistics' group-bys run on cudf; the operators whose
rule is Spark's bit for bit (the xxhash64 ids, the exact median, the cosine, the
thresholded CTR lookups) are pandas/numpy code and run on a host copy of each
partition (``on_host``), handing cudf back. ``Categorify`` is not used because its
ids depend on the fitted data's frequencies, while the hashed ids are
data-independent and equal Spark's bit for bit. Step 1 and the final gather are
in memory (sized for one node).
"""
from __future__ import annotations

import csv
import functools
import logging
import os
import re
import struct

import numpy as np
import pandas as pd
import xxhash  # Spark's xxhash64 in Python (not an nvtabular dependency: part of the [nvtabular] extra)
from nvtabular.ops import Operator, StatOperator

from preproc.errors import PreprocError
from preproc.outbrain.features import (DOC_ATTRIBUTES, LABEL, MAP, MAX_AGE_DAYS, REFERENCE_AGES, REFERENCE_COUNTS,
                                       REFERENCE_CTR_MIN_VIEWS, REFERENCE_MULTIHOT_ATTRIBUTE,
                                       REFERENCE_SIMILARITY, REFERENCE_SOURCES, default_sizes, feature_layout,
                                       feature_spec_dict)
from preproc.outbrain.tables import DAY_MS, OUTBRAIN_EPOCH_MS, TABLES, check_split_sizes, locate_tables

log = logging.getLogger("preproc.outbrain_nvt")
_INTEGER = re.compile(r"^[+-]?[0-9]+$")
SPARK_HASH_SEED = 42  # Spark's xxhash64(*cols) starts from seed 42 and chains the columns


# ---------------------------------------------------------------- host and GPU partitions
def _is_cudf(obj) -> bool:
    return type(obj).__module__.startswith("cudf")


def to_host(obj):
    """A cudf frame or series (GPU runtime) as pandas; pandas and numpy pass through."""
    return obj.to_pandas() if _is_cudf(obj) else obj


def to_cudf(frame: pd.DataFrame):
    """A pandas frame as cudf; list cells (numpy arrays) as Python lists, which cudf reads as lists."""
    import cudf

    frame = frame.copy()
    for name in frame.columns:
        if frame[name].dtype == object and any(isinstance(v, np.ndarray) for v in frame[name].head(64)):
            frame[name] = [v.tolist() if isinstance(v, np.ndarray) else v for v in frame[name]]
    return cudf.from_pandas(frame)


def on_host(transform):
    """An operator's ``transform`` written for pandas/numpy (Spark's hash, exact medians): on a cudf
    partition it runs on a host copy and the result goes back to the GPU."""
    @functools.wraps(transform)
    def wrapper(self, col_selector, df):
        if not _is_cudf(df):
            return transform(self, col_selector, df)
        return to_cudf(transform(self, col_selector, df.to_pandas()))
    return wrapper


# ---------------------------------------------------------------- Spark-compatible hashing
def _signed(h: int) -> int:
    return h - (1 << 64) if h >= (1 << 63) else h


def spark_xxhash64(data: bytes, seed_literal: int) -> int:
    """Spark's ``xxhash64(<value>, lit(seed_literal))``: XXH64 of the value with seed 42, then of the int
    literal (4 bytes, little endian) seeded with that; as a signed 64-bit integer."""
    first = xxhash.xxh64_intdigest(data, SPARK_HASH_SEED)
    return _signed(xxhash.xxh64_intdigest(struct.pack("<i", seed_literal), first))


def hash_strings(values: pd.Series, buckets: int, seed: int) -> np.ndarray:
    """``1 + pmod(xxhash64(str), buckets - 1)`` per string, 0 for a missing one (int32)."""
    uniques = values.dropna().unique()
    table = {v: 1 + spark_xxhash64(str(v).encode("utf-8"), seed) % (buckets - 1) for v in uniques}
    return values.map(table).fillna(0).astype("int32").to_numpy()


def id_strings(values: pd.Series) -> pd.Series:
    """Integer ids (nullable) as the strings Spark's cast(bigint as string) gives; None when missing."""
    ints = pd.array(values, dtype="Int64")
    return pd.Series(ints, index=values.index).astype("string").astype(object).where(~pd.isna(ints), None)


# ---------------------------------------------------------------- step 1: tables -> joined frame
def read_table(path: str, table: str):
    """(frame of the table's typed columns without bad rows, (bad rows, rows)) under the Spark engine's
    rules (preproc.dataio.textio.parse_delimited): field count, integer/double syntax, required fields."""
    columns = TABLES[table]
    header = ",".join(c for c, _, _ in columns)
    lines = pd.read_csv(path, sep="\x01", header=None, names=["_line"], dtype=str, keep_default_na=False,
                        quoting=csv.QUOTE_NONE, skip_blank_lines=False, compression="infer")["_line"]
    lines = lines.str.replace(r"\r$", "", regex=True)
    lines = lines[(lines.str.strip() != "") & (lines != header)]
    fields = lines.str.split(",", regex=False)
    bad = fields.str.len() != len(columns)
    out = {}
    for i, (name, typ, required) in enumerate(columns):
        text = fields.str[i].str.strip()
        empty = text.isna() | (text == "")
        if typ == "string":
            value, unparsable = text.where(~empty, None), pd.Series(False, index=text.index)
        elif typ in ("bigint", "int"):
            ok = text.fillna("").str.match(_INTEGER)
            value = pd.to_numeric(text.where(ok & ~empty), errors="coerce").astype("Int64")
            unparsable = ~empty & ~ok
        else:
            value = pd.to_numeric(text.where(~empty), errors="coerce")
            unparsable = ~empty & value.isna()
        bad |= unparsable | (empty & required)
        out[name] = value
    frame = pd.DataFrame(out)[~bad].reset_index(drop=True)
    return frame, (int(bad.sum()), int(len(lines)))


def load_tables(paths: dict, bad_rows: str = "skip"):
    from preproc.dataio import bad_rows as bad_rows_policy

    tables, counts = {}, {}
    for table, path in paths.items():
        tables[table], counts[path] = read_table(path, table)
    report = bad_rows_policy.enforce(counts, bad_rows, "outbrain")
    return tables, report


def split_displays(events: pd.DataFrame, split_days: int, train_fraction: float, seed: int) -> pd.DataFrame:
    """(display_id, is_train): the Spark engine's per-day rank of xxhash64(display_id, seed)."""
    ids = events["display_id"].astype("int64")
    day = np.floor(events["timestamp"].astype("int64").to_numpy() / DAY_MS).astype("int64")
    hashed = [spark_xxhash64(struct.pack("<q", int(d)), seed) for d in ids]
    frame = pd.DataFrame({"display_id": ids.to_numpy(), "day": day, "_h": hashed})
    frame = frame.sort_values(["day", "_h", "display_id"], kind="mergesort")
    frame["_rank"] = frame.groupby("day").cumcount() + 1
    n = frame.groupby("day")["display_id"].transform("size")
    keep = np.floor(n * float(train_fraction) + 0.5)  # Spark's round(): half up
    frame["is_train"] = (frame["day"] < split_days) & (frame["_rank"] <= keep)
    return frame[["display_id", "is_train"]]


def joined_frame(tables: dict, split: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (display, ad): clicks x events x promoted content x both documents' metadata,
    with the reference column names (and ``is_train`` when ``split`` is given)."""
    meta = tables["documents_meta"]
    publish_ms = (pd.to_datetime(meta["publish_time"], format="%Y-%m-%d %H:%M:%S", errors="coerce")
                  .astype("int64") // 1_000_000).astype("float64")
    publish_ms[pd.to_datetime(meta["publish_time"], format="%Y-%m-%d %H:%M:%S", errors="coerce").isna()] = np.nan
    page = pd.DataFrame({"document_id": meta["document_id"], "page_source_id": meta["source_id"],
                         "page_publisher_id": meta["publisher_id"], "publish_time": publish_ms})
    ad = pd.DataFrame({"ad_document_id": meta["document_id"], "ad_source_id": meta["source_id"],
                       "ad_publisher_id": meta["publisher_id"], "publish_time_promo": publish_ms})
    promoted = tables["promoted_content"].rename(columns={"document_id": "ad_document_id"})
    events = tables["events"]
    if split is not None:
        events = events.merge(split, on="display_id")
    rows = (tables["clicks_train"].merge(events, on="display_id")
            .merge(promoted, on="ad_id", how="left")
            .merge(page, on="document_id", how="left")
            .merge(ad, on="ad_document_id", how="left"))
    rows = rows.rename(columns={src: name for name, src in REFERENCE_SOURCES.items()})
    rows = rows.drop(columns=["uuid"])
    for c in REFERENCE_SOURCES:  # nullable ids as float64 (exact below 2**53) for the dask/merlin dtypes
        rows[c] = rows[c].astype("float64")
    rows["display_id"] = rows["display_id"].astype("int64")
    rows["timestamp"] = rows["timestamp"].astype("int64")
    rows[LABEL] = rows[LABEL].astype("int64")
    return rows.reset_index(drop=True)


def attribute_frames(tables: dict) -> dict:
    """{attribute: (document_id, key string, confidence)}, one row per (document, key) at its highest confidence."""
    out = {}
    for attribute, (table, key) in DOC_ATTRIBUTES.items():
        t = tables[table]
        keys = id_strings(t[key]) if key != "entity_id" else t[key].astype(object)
        frame = pd.DataFrame({"document_id": t["document_id"].astype("int64"), "key": keys,
                              "conf": t["confidence_level"].astype("float64")})
        out[attribute] = frame.groupby(["document_id", "key"], as_index=False)["conf"].max()
    return out


def document_lists(attributes: dict, multihot: dict, seed: int) -> pd.DataFrame:
    """Per page document: the hashed multi-hot lists (decreasing confidence, ties by key, at most hotness)."""
    lists = None
    for name, (buckets, hotness) in multihot.items():
        frame = attributes[REFERENCE_MULTIHOT_ATTRIBUTE[name]]
        frame = frame.sort_values(["document_id", "conf", "key"], ascending=[True, False, True], kind="mergesort")
        frame = frame.groupby("document_id", sort=False).head(hotness).copy()
        frame["id"] = hash_strings(frame["key"], buckets, seed)
        docs, starts = np.unique(frame["document_id"].to_numpy(), return_index=True)
        ids = np.split(frame["id"].to_numpy(dtype="int32"), starts[1:])
        grouped = pd.DataFrame({"document_id": docs, name: ids})
        lists = grouped if lists is None else lists.merge(grouped, on="document_id", how="outer")
    lists["document_id"] = lists["document_id"].astype("float64")
    return lists


# ---------------------------------------------------------------- step 2: the workflow's operators
class SparkHashBucket(Operator):
    """Ids ``1 + pmod(xxhash64(str(value), seed), B - 1)`` (Spark's, bit for bit), 0 when missing;
    ``geo_location_country`` / ``_state`` are derived from ``geo_location`` on the way."""

    def __init__(self, buckets: dict, seed: int = 0):
        super().__init__()
        self.buckets, self.seed = dict(buckets), int(seed)

    @on_host
    def transform(self, col_selector, df):
        out = type(df)()
        geo = df["geo_location"] if "geo_location" in df.columns else None
        for name in self.buckets:
            if name == "geo_location_country":
                values = geo.astype(object).where(geo.notna(), None).str.split(">").str[0]
            elif name == "geo_location_state":
                parts = geo.astype(object).where(geo.notna(), None).str.split(">")
                values = (parts.str[0] + ">" + parts.str[1]).where(parts.str.len() >= 2, None)
            elif name == "geo_location":
                values = geo.astype(object).where(geo.notna(), None)
            else:
                values = id_strings(df[name])
            out[name] = hash_strings(values, self.buckets[name], self.seed)
        return out

    def column_mapping(self, col_selector):
        return {name: ["geo_location"] if name.startswith("geo_location") else [name] for name in self.buckets}

    @property
    def output_dtype(self):
        return np.int32


class PlatformId(Operator):
    """``platform`` 1-3 kept as the id, anything else 0 (cardinality 4)."""

    @on_host
    def transform(self, col_selector, df):
        values = pd.to_numeric(df["platform"].astype(object), errors="coerce")
        return type(df)({"platform": values.where(values.isin([1, 2, 3]), 0).fillna(0).astype("int32")})

    @property
    def output_dtype(self):
        return np.int32


class TrainingCtr(StatOperator):
    """Per context: training clicks / views when views >= the context's threshold, else 0
    (``<context>_ctr``); ``<context>_count`` = training views (NaN when unseen)."""

    def __init__(self, min_views: dict, counts: dict):
        super().__init__()
        self.min_views, self.counts, self.stats = dict(min_views), dict(counts), {}

    def fit(self, col_selector, ddf):
        return {c: ddf[[c, LABEL]].dropna(subset=[c]).groupby(c)[LABEL].agg(["sum", "count"])
                for c in self.min_views}

    def fit_finalize(self, dask_stats):
        self.stats = {c: to_host(t).rename(columns={"sum": "_clicks", "count": "_views"})
                      for c, t in dask_stats.items()}

    def clear(self):
        self.stats = {}

    @on_host
    def transform(self, col_selector, df):
        out = type(df)(index=df.index)
        for c, threshold in self.min_views.items():
            m = df[[c]].merge(self.stats[c], left_on=c, right_index=True, how="left")
            views = m["_views"].to_numpy(dtype="float64")
            ok = np.nan_to_num(views) >= threshold
            ctr = np.where(ok, m["_clicks"].to_numpy(dtype="float64") / np.where(ok, views, 1.0), 0.0)
            out[f"{c}_ctr"] = ctr
        for name, c in self.counts.items():
            m = df[[c]].merge(self.stats[c], left_on=c, right_index=True, how="left")
            out[name] = m["_views"].to_numpy(dtype="float64")
        return out

    def column_mapping(self, col_selector):
        mapping = {f"{c}_ctr": [c] for c in self.min_views}
        mapping.update({name: [c] for name, c in self.counts.items()})
        return mapping

    @property
    def dependencies(self):
        return [LABEL]

    @property
    def output_dtype(self):
        return np.float64


class DaysSincePublished(Operator):
    """Whole days from each document's publish time (ms, UTC) to the event; 0 when negative or over
    MAX_AGE_DAYS; NaN when the publish time is unknown."""

    @on_host
    def transform(self, col_selector, df):
        event_ms = df["timestamp"].to_numpy(dtype="float64") + OUTBRAIN_EPOCH_MS
        out = type(df)(index=df.index)
        for name, side in REFERENCE_AGES.items():
            source = "publish_time" if side == "page" else "publish_time_promo"
            days = np.floor((event_ms - df[source].to_numpy(dtype="float64")) / DAY_MS)
            out[name] = np.where((days < 0) | (days > MAX_AGE_DAYS), 0.0, days)
        return out

    def column_mapping(self, col_selector):
        return {name: ["timestamp", "publish_time" if side == "page" else "publish_time_promo"]
                for name, side in REFERENCE_AGES.items()}

    @property
    def output_dtype(self):
        return np.float64


class ExactMedianFill(StatOperator):
    """Missing values -> the exact median of the fitted rows (whole-number columns: from value counts,
    so it scales; the average of the two middle values for an even count, as Spark's percentile)."""

    def __init__(self):
        super().__init__()
        self.medians = {}

    def fit(self, col_selector, ddf):
        return {c: ddf[c].dropna().value_counts() for c in col_selector.names}

    def fit_finalize(self, dask_stats):
        self.medians = {}
        for c, counts in dask_stats.items():
            counts = to_host(counts).sort_index()
            n = int(counts.sum())
            if n == 0:
                self.medians[c] = 0.0
                continue
            cum = counts.cumsum().to_numpy()
            values = counts.index.to_numpy(dtype="float64")
            lo, hi = values[np.searchsorted(cum, (n - 1) // 2 + 1)], values[np.searchsorted(cum, n // 2 + 1)]
            self.medians[c] = float((lo + hi) / 2)

    def clear(self):
        self.medians = {}

    @on_host
    def transform(self, col_selector, df):
        for c in col_selector.names:
            df[c] = df[c].fillna(self.medians[c])
        return df


class DocumentCosine(Operator):
    """Cosine of the page (``document_id``) and ad (``document_id_promo``) documents' confidence
    vectors per attribute; 0 when either has none."""

    def __init__(self, attributes: dict):
        super().__init__()
        self.vectors = {}
        for attribute, frame in attributes.items():
            norms = np.sqrt((frame["conf"] ** 2).groupby(frame["document_id"]).transform("sum"))
            self.vectors[attribute] = pd.DataFrame({"document_id": frame["document_id"].astype("float64"),
                                                    "key": frame["key"], "unit": frame["conf"] / norms})

    @on_host
    def transform(self, col_selector, df):
        pairs = df[["document_id", "document_id_promo"]]
        out = type(df)(index=df.index)
        unique = pairs.dropna().drop_duplicates()
        for attribute, name in REFERENCE_SIMILARITY.items():
            vec = self.vectors[attribute]
            page = unique.merge(vec, on="document_id")
            both = page.merge(vec.rename(columns={"document_id": "document_id_promo", "unit": "unit_ad"}),
                              on=["document_id_promo", "key"])
            both["dot"] = both["unit"] * both["unit_ad"]
            sims = both.groupby(["document_id", "document_id_promo"], as_index=False)["dot"].sum()
            m = pairs.merge(sims, on=["document_id", "document_id_promo"], how="left")
            out[name] = m["dot"].fillna(0.0).to_numpy()
        return out

    def column_mapping(self, col_selector):
        return {name: ["document_id", "document_id_promo"] for name in REFERENCE_SIMILARITY.values()}

    @property
    def output_dtype(self):
        return np.float64


class EmptyListToZero(Operator):
    """A document without any attribute gets ``[0]`` (the Spark engine's rule)."""

    @on_host
    def transform(self, col_selector, df):
        zero = np.zeros(1, dtype="int32")
        for c in col_selector.names:   # numpy arrays from pandas, lists from a cudf partition's host copy
            df[c] = [np.asarray(v, dtype="int32") if isinstance(v, (np.ndarray, list)) and len(v) else zero
                     for v in df[c]]
        return df


class AsFloat32(Operator):
    def transform(self, col_selector, df):
        for c in col_selector.names:
            df[c] = df[c].astype("float32")
        return df

    @property
    def output_dtype(self):
        return np.float32


def make_workflow(attributes: dict, lists: pd.DataFrame, buckets: dict, multihot: dict, seed: int):
    """The unfitted ``nvtabular.Workflow`` of the reference features (input: a :func:`joined_frame`)."""
    import nvtabular as nvt
    from nvtabular.ops import FillMissing, JoinExternal, LogOp, Normalize

    hashed_inputs = sorted({n if not n.startswith("geo_location") else "geo_location" for n in buckets})
    onehot = hashed_inputs >> SparkHashBucket(buckets, seed)
    platform = ["platform"] >> PlatformId()
    ctr = list(REFERENCE_CTR_MIN_VIEWS) >> TrainingCtr(REFERENCE_CTR_MIN_VIEWS, REFERENCE_COUNTS)
    rates = ctr[[f"{c}_ctr" for c in REFERENCE_CTR_MIN_VIEWS]]
    counts = ctr[list(REFERENCE_COUNTS)] >> FillMissing(fill_val=0) >> LogOp() >> Normalize()
    ages = (["timestamp", "publish_time", "publish_time_promo"] >> DaysSincePublished()
            >> ExactMedianFill() >> LogOp())
    sims = ["document_id", "document_id_promo"] >> DocumentCosine(attributes)
    joined = ["document_id"] >> JoinExternal(lists, on="document_id", how="left",
                                             columns_ext=["document_id", *multihot])
    lists_out = joined[list(multihot)] >> EmptyListToZero()
    numerical = (rates + counts + ages + sims) >> AsFloat32()
    label = [LABEL] >> AsFloat32()
    return nvt.Workflow(label + numerical + onehot + platform + lists_out + [MAP])


# ---------------------------------------------------------------- output
def _arrow_table(frame: pd.DataFrame, layout, with_map: bool):
    import pyarrow as pa

    numerical, onehot, multihot = layout
    arrays, fields = [], []
    arrays.append(pa.array(frame[LABEL].to_numpy(dtype="float32")))
    fields.append(pa.field(LABEL, pa.float32()))
    for n in numerical:
        arrays.append(pa.array(frame[n].to_numpy(dtype="float32")))
        fields.append(pa.field(n, pa.float32()))
    for n in onehot:
        arrays.append(pa.array(frame[n].to_numpy(dtype="int32")))
        fields.append(pa.field(n, pa.int32()))
    for n in multihot:
        arrays.append(pa.array([np.asarray(v, dtype="int32") for v in frame[n]], type=pa.list_(pa.int32())))
        fields.append(pa.field(n, pa.list_(pa.int32())))
    if with_map:
        arrays.append(pa.array(frame[MAP].to_numpy(dtype="int64")))
        fields.append(pa.field(MAP, pa.int64()))
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))


def write_parts(frame: pd.DataFrame, stage, name: str, num_files: int, layout, by_display: bool) -> list[str]:
    """``<stage>/<name>/part_NNNNN.parquet``, exactly ``num_files``: round-robin rows, or (test) by
    ``display_id mod num_files`` sorted by display id, as the Spark engine lays them out."""
    import pyarrow.parquet as pq

    if by_display:
        index = (frame[MAP] % num_files).to_numpy()
        frame = frame.assign(_f=index).sort_values(["_f", MAP], kind="mergesort")
        index = frame["_f"].to_numpy()
    else:
        index = np.arange(len(frame)) % num_files
    os.makedirs(os.path.join(stage, name), exist_ok=True)
    files = []
    for i in range(num_files):
        part = frame[index == i]
        if part.empty:
            raise PreprocError(f"{name}: file {i} of --num-files {num_files} would be empty "
                               "(fewer rows or groups than files; lower --num-files)")
        rel = os.path.join(name, f"part_{i:05d}.parquet")
        pq.write_table(_arrow_table(part, layout, with_map=by_display), os.path.join(stage, rel))
        files.append(rel)
    return files


def run(input_dir: str, output: str, num_files: int = 1, split_days: int = 11, train_fraction: float = 0.8,
        seed: int = 0, buckets=None, multihot=None, bad_rows: str = "skip", overwrite: bool = False,
        runtime=None) -> dict:
    """The whole NVTabular pipeline on ``runtime`` (a ``preproc.runtime.dask_cluster.Runtime``; default
    CPU threads); returns the feature-spec dict written to ``output``."""
    from merlin.io import Dataset

    from preproc.dataio import textio
    from preproc.dataio.output import atomic_dir, verify_against_spec
    from preproc.runtime import dask_cluster

    runtime = runtime or dask_cluster.choose_runtime("cpu", 0, os.cpu_count() or 1, False)

    default_buckets, default_multihot = default_sizes("reference")
    buckets = dict(buckets or default_buckets)
    multihot = dict(multihot or default_multihot)
    paths = locate_tables(input_dir)
    tables, report = load_tables(paths, bad_rows)
    clicked = tables["events"][tables["events"]["display_id"].isin(tables["clicks_train"]["display_id"])]
    rows = joined_frame(tables, split_displays(clicked, split_days, train_fraction, seed))
    attributes = attribute_frames(tables)
    lists = document_lists(attributes, multihot, seed)
    # JoinExternal moves its table to the partitions' device itself; lists go to cudf as Python lists
    workflow = make_workflow(attributes, lists if runtime.cpu else to_cudf(lists), buckets, multihot, seed)
    train_rows, test_rows = rows[rows["is_train"]].drop(columns="is_train"), rows[~rows["is_train"]].drop(
        columns="is_train")
    expected = {"train": len(train_rows), "test": len(test_rows)}
    check_split_sizes(expected, input_dir)
    log.info("outbrain (nvtabular): %d train and %d test rows on %s", expected["train"], expected["test"],
             runtime.describe())
    if not runtime.cpu:   # cudf partitions: the GPU runs NVTabular's operators and the statistics
        train_rows, test_rows = to_cudf(train_rows), to_cudf(test_rows)
    with dask_cluster.start(runtime):
        train_ds, test_ds = Dataset(train_rows, cpu=runtime.cpu), Dataset(test_rows, cpu=runtime.cpu)
        workflow.fit(train_ds)
        train = to_host(workflow.transform(train_ds).to_ddf().compute())
        test = to_host(workflow.transform(test_ds).to_ddf().compute())
    layout = feature_layout("reference", buckets, multihot)
    with atomic_dir(output, overwrite, verify=lambda stage: verify_against_spec(stage, expected)) as stage:
        train_files = write_parts(train, stage, "train", num_files, layout, by_display=False)
        test_files = write_parts(test, stage, "test", num_files, layout, by_display=True)
        workflow.save(os.path.join(stage, "workflow"))
        stats = {"age_medians": {c: _op_of(workflow, "ExactMedianFill").medians[c] for c in REFERENCE_AGES},
                 "count_moments": _count_moments(workflow)}
        metadata = {"dataset": "outbrain", "engine": "nvtabular", "feature_set": "reference", "rows": expected,
                    "split_days": split_days, "train_fraction": train_fraction, "seed": seed,
                    "ctr_min_views": REFERENCE_CTR_MIN_VIEWS, **stats, "bad_rows": report,
                    "workflow": "workflow"}
        spec = feature_spec_dict(layout, train_files, test_files, metadata)
        textio.write_feature_spec(spec, stage)
    log.info("outbrain (nvtabular): wrote %s", output)
    return spec


def _ops(workflow):
    seen, stack = [], [workflow.output_node]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.append(node)
            stack.extend(node.parents_with_dependencies)
    return [n.op for n in seen if n.op is not None]


def _op_of(workflow, class_name: str):
    return next(op for op in _ops(workflow) if type(op).__name__ == class_name)


def _count_moments(workflow) -> dict:
    normalize = _op_of(workflow, "Normalize")
    return {c: {"mean": float(normalize.means[c]), "std": float(normalize.stds[c])} for c in REFERENCE_COUNTS}

