"""The NVTabular operators of the Outbrain workflow (preproc.outbrain.nvt), and what they share.

Spark's rules bit for bit where the Spark engine's output is the reference: xxhash64 ids
(``SparkHashBucket``), the exact training median (``ExactMedianFill``), the page/ad cosine
(``DocumentCosine``), the thresholded CTR lookups (``TrainingCtr``). They are pandas/numpy code; on
a cudf partition (GPU runtime) ``on_host`` runs them on a host copy and hands cudf back.
"""
from __future__ import annotations

import functools
import struct

import numpy as np
import pandas as pd
import xxhash  # Spark's xxhash64 in Python (not an nvtabular dependency: part of the [nvtabular] extra)
from nvtabular.ops import Operator, StatOperator

from preproc.outbrain.features import LABEL, MAX_AGE_DAYS, REFERENCE_AGES, REFERENCE_SIMILARITY
from preproc.outbrain.tables import DAY_MS, OUTBRAIN_EPOCH_MS

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
