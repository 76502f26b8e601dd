"""Outbrain Click Prediction (Kaggle tables) -> Wide & Deep parquet, with PySpark.

Input: a directory holding the Kaggle CSVs (``<table>.csv`` or ``.csv.gz``;
``page_views_sample.csv`` is accepted for ``page_views``): clicks_train,
events, promoted_content, documents_meta, documents_categories,
documents_topics, documents_entities, page_views. Rows with a wrong field
count, an unparsable number or a missing id are counted per file and skipped or
fatal (``--bad-rows``).

Split (the reference's rule): an event's day is ``floor(timestamp / 86400000)``
(timestamps are ms since the Outbrain epoch 1465876799998, so day 0 starts
2016-06-14 04:00 UTC). Displays of days ``< --split-days`` (default 11, i.e.
``day <= 10`` as in the reference) are split per day: the
``round(0.8 x displays of that day)`` displays with the smallest
``xxhash64(display_id, --seed)`` train, the rest evaluate (an exact, reproducible
80 %, where the reference draws a uniform number per display); only displays
present in clicks_train count (events.csv also lists the Kaggle test displays).
Every display of a later day (the last two days of clicks_train) evaluates. A
display's ads never straddle the split.

Joins: clicks_train -> events (display_id; clicks without an event are
dropped) -> promoted_content (ad_id) -> documents_meta for the page document
(``document_id`` of the event) and for the ad's document (``ad_document_id``).

Feature sets (``--feature-set``): ``reference`` (default), NVIDIA's W&D recipe
set, described in preproc.outbrain.features (``build_reference_features``; the
NVTabular engine, preproc.outbrain.nvt, builds the same one); ``legacy``, below
(``build_features``). Both are null-free, so the parquet reader needs no masks.

Legacy features:

* CTR per context, from the training split only: for each of ad_id,
  ad_document_id, campaign_id, advertiser_id, ad_source_id, ad_publisher_id,
  ``views`` = training impressions and ``clicks`` = training clicks of the
  context value; ``ctr = (clicks + a * p) / (views + a)`` when
  ``views >= max(1, --ctr-min-views)`` (default 5), else ``p``; ``p`` = global training
  CTR, ``a`` = ``--ctr-smoothing`` (default 10; 0 gives the raw ratio). A null
  context gets ``p`` and 0 views. A training row's own click is part of its
  context's counts (no leave-one-out). Features ``<context>_ctr`` and
  ``<context>_views``.
* Page/ad similarity: for categories, topics and entities, the cosine of the
  two documents' confidence vectors, ``sum_k c_page,k c_ad,k / (|c_page| |c_ad|)``
  (0 when either document has none): ``sim_categories``, ``sim_topics``,
  ``sim_entities``.
* Popularity from page_views: ``page_doc_pageviews``, ``ad_doc_pageviews``,
  ``user_pageviews``; and ``ad_doc_age_days`` (event time minus the ad document's
  publish time, clamped at 0; 0 when unknown; publish_time is read in the Spark
  session time zone, ``spark.sql.session.timeZone``).
* Numerical transform: counts (``*_views``, ``*_pageviews``, age) go through
  ``log1p``; then every numerical feature is standardized with the training
  split's mean and population standard deviation (``(x - mean) / std``, std 0
  -> 1), float32.
* One-hot categoricals, hash-bucketed: id ``1 + pmod(xxhash64(str(value), seed),
  B - 1)`` with ``B`` the feature's bucket count (``--buckets name=B,...``),
  id 0 for a missing value, cardinality ``B``. ``platform`` (1-3) keeps its
  value (cardinality 4, unknown -> 0). ``geo_country`` / ``geo_state`` are the
  first one / two ``>``-separated parts of geo_location.
* Multi-hot categoricals: the categories, topics and entities of the page and
  of the ad document, ordered by decreasing confidence (ties: raw id in string order),
  at most ``max_hotness`` (``--hotness name=H,...``) values, each hashed as
  above; a document with none gets ``[0]``. Parquet list<int32> columns of
  variable length <= max_hotness (the reader pads with -1).

Output (both sets and engines; ``OUT/``, written to a temporary sibling, verified against the spec,
then renamed): ``train/part_NNNNN.parquet`` and ``test/part_NNNNN.parquet``,
exactly ``--num-files`` each (at least the number of training ranks); train
rows spread round-robin, test rows placed by ``display_id mod num_files`` so a
display's ads share a file, sorted by display id. Columns: label ``clicked``
(float32), the numerical, one-hot and multi-hot features, and in test only
``display_id`` (int64, channel ``map`` for MAP@12). ``feature_spec.yaml`` holds
channels ``label``, ``numerical``, ``onehot_categorical``,
``multihot_categorical``, ``map`` and the cardinalities.
"""
from __future__ import annotations

import logging

from preproc.dataio import textio
from preproc.outbrain.features import (CTR_CONTEXTS, DEFAULT_FEATURE_SET, DOC_ATTRIBUTES,  # noqa: F401
                                       IDENTITY_ONEHOT, LABEL, LOG_FEATURES, MAP, MAX_AGE_DAYS,
                                       MULTIHOT, NUMERICAL, ONEHOT, ONEHOT_BUCKETS, REFERENCE_AGES,
                                       REFERENCE_BUCKETS, REFERENCE_COUNTS, REFERENCE_CTR_MIN_VIEWS,
                                       REFERENCE_MULTIHOT, REFERENCE_MULTIHOT_ATTRIBUTE, REFERENCE_NUMERICAL,
                                       REFERENCE_ONEHOT, REFERENCE_SIMILARITY, REFERENCE_SOURCES, default_sizes,
                                       feature_layout, feature_spec_dict)
from preproc.outbrain.tables import (DAY_MS, OUTBRAIN_EPOCH_MS, TABLE_FILE_ALIASES, TABLES,  # noqa: F401
                                     check_split_sizes, header_of, locate_tables)

log = logging.getLogger("preproc.outbrain")


# ---------------------------------------------------------------- Spark stages
def load_tables(spark, paths: dict, bad_rows: str = "skip"):
    """{table: DataFrame} without bad rows, and the per-file bad-row report (one counting job for all tables)."""
    from functools import reduce

    from preproc.dataio import bad_rows as bad_rows_policy

    parsed = {table: textio.parse_delimited(spark, path, TABLES[table], ",", header=header_of(table))
              for table, path in paths.items()}
    flags = reduce(lambda a, b: a.unionByName(b), (df.select("_file", "_bad") for df in parsed.values()))
    report = bad_rows_policy.enforce(textio.count_bad_rows(flags), bad_rows, "outbrain")
    return {table: textio.without_bad_rows(df) for table, df in parsed.items()}, report


def split_displays(events, split_days: int = 11, train_fraction: float = 0.8, seed: int = 0):
    """(display_id, day, is_train) for every event, by the rule of the module docstring."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    days = events.select("display_id", F.floor(F.col("timestamp") / DAY_MS).cast("int").alias("day"))
    by_day = Window.partitionBy("day")
    ranked = (days.withColumn("_rank", F.row_number().over(
                  by_day.orderBy(F.xxhash64(F.col("display_id"), F.lit(seed)), "display_id")))
              .withColumn("_n", F.count("*").over(by_day)))
    is_train = (F.col("day") < split_days) & (F.col("_rank") <= F.round(F.col("_n") * float(train_fraction)))
    return ranked.select("display_id", "day", is_train.alias("is_train"))


def _utc_seconds(text):
    """Seconds since 1970 of a 'yyyy-MM-dd HH:mm:ss' time read as UTC (null when unparsable)."""
    from pyspark.sql import functions as F

    return F.unix_timestamp(F.concat(text, F.lit("+0000")), "yyyy-MM-dd HH:mm:ssZ")


def join_tables(tables, split):
    """One row per (display, ad) with the event, ad and both documents' metadata."""
    from pyspark.sql import functions as F

    meta = tables["documents_meta"]
    page_meta = meta.select("document_id", F.col("source_id").alias("page_source_id"),
                            F.col("publisher_id").alias("page_publisher_id"),
                            _utc_seconds(F.col("publish_time")).alias("_page_publish_utc_s"))
    ad_meta = meta.select(F.col("document_id").alias("ad_document_id"), F.col("source_id").alias("ad_source_id"),
                          F.col("publisher_id").alias("ad_publisher_id"),
                          F.unix_timestamp(F.to_timestamp("publish_time")).alias("_ad_publish_s"),
                          _utc_seconds(F.col("publish_time")).alias("_ad_publish_utc_s"))
    promoted = tables["promoted_content"].select(
        "ad_id", F.col("document_id").alias("ad_document_id"), "campaign_id", "advertiser_id")
    events = tables["events"].join(split, "display_id")
    return (tables["clicks_train"].join(events, "display_id")
            .join(promoted, "ad_id", "left")
            .join(page_meta, "document_id", "left")
            .join(ad_meta, "ad_document_id", "left"))


def ctr_features(rows, min_views: int = 5, smoothing: float = 10.0):
    """Add ``<context>_ctr`` and ``<context>_views`` from the training rows (see module docstring)."""
    from pyspark.sql import functions as F

    train = rows.filter("is_train")
    prior = train.agg(F.avg(LABEL)).first()[0] or 0.0
    features = []
    for ctx in CTR_CONTEXTS:
        stats = (train.filter(F.col(ctx).isNotNull()).groupBy(ctx)
                 .agg(F.count("*").alias(f"_v_{ctx}"), F.sum(LABEL).alias(f"_c_{ctx}")))
        rows = rows.join(stats, ctx, "left")
        views = F.coalesce(F.col(f"_v_{ctx}"), F.lit(0))
        ctr = F.when(views >= max(min_views, 1), (F.col(f"_c_{ctx}") + smoothing * prior) / (views + smoothing)) \
            .otherwise(F.lit(prior))
        features += [ctr.cast("double").alias(f"{ctx}_ctr"), views.cast("double").alias(f"{ctx}_views")]
    rows = rows.select(*[c for c in rows.columns if not c.startswith(("_v_", "_c_"))], *features)
    return rows, float(prior)


def _doc_attribute(tables, attribute: str):
    """(document_id, key string, confidence) with one row per (document, key): the highest confidence."""
    from pyspark.sql import functions as F

    table, key = DOC_ATTRIBUTES[attribute]
    return (tables[table].groupBy("document_id", F.col(key).cast("string").alias("key"))
            .agg(F.max("confidence_level").alias("conf")))


def similarity_features(rows, tables, ad_doc="ad_document_id", names=None):
    """Add ``sim_<attribute>`` (or ``names[attribute]``): confidence-weighted cosine between the page
    document (``document_id``) and the ad document (``ad_doc``)."""
    from pyspark.sql import functions as F

    names = names or {a: f"sim_{a}" for a in DOC_ATTRIBUTES}
    rows = rows.withColumnRenamed(ad_doc, "ad_document_id") if ad_doc != "ad_document_id" else rows
    pairs = rows.select("document_id", "ad_document_id").distinct().filter(F.col("ad_document_id").isNotNull())
    for attribute in DOC_ATTRIBUTES:
        attr = _doc_attribute(tables, attribute)
        norms = attr.groupBy("document_id").agg(F.sqrt(F.sum(F.col("conf") ** 2)).alias("norm"))
        page = attr.select("document_id", "key", F.col("conf").alias("c_page"))
        ad = attr.select(F.col("document_id").alias("ad_document_id"), "key", F.col("conf").alias("c_ad"))
        dots = (pairs.join(page, "document_id").join(ad, ["ad_document_id", "key"])
                .groupBy("document_id", "ad_document_id").agg(F.sum(F.col("c_page") * F.col("c_ad")).alias("dot")))
        sims = (dots.join(norms, "document_id")
                .join(norms.select(F.col("document_id").alias("ad_document_id"), F.col("norm").alias("ad_norm")),
                      "ad_document_id")
                .select("document_id", "ad_document_id",
                        (F.col("dot") / (F.col("norm") * F.col("ad_norm"))).alias(names[attribute])))
        rows = rows.join(sims, ["document_id", "ad_document_id"], "left")
    rows = rows.fillna(0.0, [names[a] for a in DOC_ATTRIBUTES])
    return rows.withColumnRenamed("ad_document_id", ad_doc) if ad_doc != "ad_document_id" else rows


def popularity_features(rows, tables):
    """Add page-view counts of the page document, the ad document and the user, and the ad document's age."""
    from pyspark.sql import functions as F

    views = tables["page_views"]
    doc_views = views.groupBy("document_id").agg(F.count("*").cast("double").alias("page_doc_pageviews"))
    user_views = views.groupBy("uuid").agg(F.count("*").cast("double").alias("user_pageviews"))
    event_s = (F.col("timestamp") + F.lit(OUTBRAIN_EPOCH_MS)) / 1000.0
    age = F.greatest((event_s - F.col("_ad_publish_s")) / 86400.0, F.lit(0.0))
    return (rows.join(doc_views, "document_id", "left")
            .join(doc_views.select(F.col("document_id").alias("ad_document_id"),
                                   F.col("page_doc_pageviews").alias("ad_doc_pageviews")), "ad_document_id", "left")
            .join(user_views, "uuid", "left")
            .withColumn("ad_doc_age_days", F.coalesce(age, F.lit(0.0)))
            .fillna(0.0, ["page_doc_pageviews", "ad_doc_pageviews", "user_pageviews"]))


def hash_bucket(column, buckets: int, seed: int = 0):
    """Hash-bucketed id in [1, buckets), 0 for null (see module docstring)."""
    from pyspark.sql import functions as F

    hashed = F.pmod(F.xxhash64(column.cast("string"), F.lit(seed)), F.lit(buckets - 1)) + 1
    return F.when(column.isNull(), F.lit(0)).otherwise(hashed).cast("int")


def attribute_lists(tables, attribute: str, doc_col: str, name: str, buckets: int, hotness: int, seed: int = 0):
    """(doc_col, name): a document's hashed ``attribute`` ids by decreasing confidence, at most ``hotness``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.partitionBy("document_id").orderBy(F.desc("conf"), "key")
    return (_doc_attribute(tables, attribute).withColumn("_r", F.row_number().over(order))
            .filter(F.col("_r") <= hotness).groupBy("document_id")
            .agg(F.sort_array(F.collect_list(F.struct("_r", hash_bucket(F.col("key"), buckets, seed)
                                                       .alias("id")))).alias("_l"))
            .select(F.col("document_id").alias(doc_col), F.col("_l.id").alias(name)))


def with_lists(rows, lists: dict):
    """Join {name: (doc_col, lists frame)} onto ``rows``; a document without any gets ``[0]``."""
    from pyspark.sql import functions as F

    for name, (doc_col, frame) in lists.items():
        rows = rows.join(frame, doc_col, "left")
    filled = [F.coalesce(F.col(n), F.array(F.lit(0))).cast("array<int>").alias(n) for n in lists]
    return rows.select(*[c for c in rows.columns if c not in lists], *filled)


def multihot_features(rows, tables, multihot: dict, seed: int = 0):
    """Add the page/ad document attribute lists (hashed ids, by decreasing confidence, at most max_hotness)."""
    lists = {}
    for attribute in DOC_ATTRIBUTES:
        for side, doc_col in (("page", "document_id"), ("ad", "ad_document_id")):
            name = f"{side}_{attribute}"
            buckets, hotness = multihot[name]
            lists[name] = (doc_col, attribute_lists(tables, attribute, doc_col, name, buckets, hotness, seed))
    return with_lists(rows, lists)


def categorical_features(rows, buckets: dict, seed: int = 0):
    """Add the hashed one-hot ids (overwriting the raw columns) and the identity-mapped platform."""
    from pyspark.sql import functions as F

    geo_parts = F.split(F.col("geo_location"), ">")
    raw = {"geo_country": F.when(F.col("geo_location").isNotNull(), geo_parts.getItem(0)),
           "geo_state": F.when(F.size(geo_parts) >= 2, F.concat_ws(">", geo_parts.getItem(0), geo_parts.getItem(1)))}
    platform = F.col("platform").cast("int")
    ids = [hash_bucket(raw.get(name, F.col(name)), size, seed).alias(name) for name, size in buckets.items()]
    ids.append(F.when(platform.between(1, 3), platform).otherwise(0).cast("int").alias("platform"))
    replaced = set(buckets) | {"platform"}
    return rows.select(*[c for c in rows.columns if c not in replaced], *ids)


def standardize(rows, columns):
    """log1p on LOG_FEATURES, then (x - mean) / std with the training split's statistics; float32."""
    from pyspark.sql import functions as F

    logged = {c: F.log1p(F.col(c)) if c in LOG_FEATURES else F.col(c) for c in columns}
    train = rows.filter("is_train")
    aggs = [F.avg(x).alias(f"m_{c}") for c, x in logged.items()]
    aggs += [F.stddev_pop(x).alias(f"s_{c}") for c, x in logged.items()]
    stats = train.agg(*aggs).first().asDict()
    moments, scaled = {}, []
    for c, x in logged.items():
        mean = float(stats[f"m_{c}"] or 0.0)
        std = float(stats[f"s_{c}"] or 0.0) or 1.0
        moments[c] = {"mean": mean, "std": std}
        scaled.append(((x - F.lit(mean)) / F.lit(std)).cast("float").alias(c))
    return rows.select(*[c for c in rows.columns if c not in logged], *scaled), moments


# ---------------------------------------------------------------- reference feature set (Spark)
def reference_ctr_features(rows):
    """Add ``<context>_ctr`` (thresholded training CTR, 0 below the threshold) and the raw training
    views of the ``REFERENCE_COUNTS`` contexts (see preproc.outbrain.features)."""
    from pyspark.sql import functions as F

    train = rows.filter("is_train")
    features = []
    for ctx, min_views in REFERENCE_CTR_MIN_VIEWS.items():
        stats = (train.filter(F.col(ctx).isNotNull()).groupBy(ctx)
                 .agg(F.count("*").alias(f"_v_{ctx}"), F.sum(LABEL).alias(f"_c_{ctx}")))
        rows = rows.join(stats, ctx, "left")
        views = F.coalesce(F.col(f"_v_{ctx}"), F.lit(0))
        features.append(F.when(views >= min_views, F.col(f"_c_{ctx}") / views).otherwise(F.lit(0.0))
                        .cast("double").alias(f"{ctx}_ctr"))
    features += [F.coalesce(F.col(f"_v_{ctx}"), F.lit(0)).cast("double").alias(name)
                 for name, ctx in REFERENCE_COUNTS.items()]
    return rows.select(*[c for c in rows.columns if not c.startswith(("_v_", "_c_"))], *features)


def age_features(rows):
    """Add the whole days from each document's publish time (UTC) to the event; 0 when negative or
    over MAX_AGE_DAYS; null when the publish time is unknown (filled later)."""
    from pyspark.sql import functions as F

    event_ms = F.col("timestamp") + F.lit(OUTBRAIN_EPOCH_MS)
    for name, side in REFERENCE_AGES.items():
        days = F.floor((event_ms - F.col(f"_{side}_publish_utc_s") * 1000) / F.lit(DAY_MS))
        rows = rows.withColumn(name, F.when((days < 0) | (days > MAX_AGE_DAYS), F.lit(0)).otherwise(days)
                               .cast("double"))
    return rows


def reference_numerical_transform(rows):
    """Ages: missing -> training median, then log1p; counts: log1p, then (x - mean) / sample std of the
    training rows (std 0 -> no scaling); CTRs and similarities unchanged; all float32."""
    from pyspark.sql import functions as F

    train = rows.filter("is_train")
    stats = train.agg(*[F.percentile(F.col(c), 0.5).alias(f"med_{c}") for c in REFERENCE_AGES],
                      *[F.avg(F.log1p(c)).alias(f"m_{c}") for c in REFERENCE_COUNTS],
                      *[F.stddev_samp(F.log1p(c)).alias(f"s_{c}") for c in REFERENCE_COUNTS]).first().asDict()
    medians = {c: float(stats[f"med_{c}"]) if stats[f"med_{c}"] is not None else 0.0 for c in REFERENCE_AGES}
    moments, out = {}, {}
    for c in REFERENCE_AGES:
        out[c] = F.log1p(F.coalesce(F.col(c), F.lit(medians[c])))
    for c in REFERENCE_COUNTS:
        mean, std = float(stats[f"m_{c}"] or 0.0), float(stats[f"s_{c}"] or 0.0)
        moments[c] = {"mean": mean, "std": std}
        out[c] = (F.log1p(c) - F.lit(mean)) / F.lit(std if std > 0 else 1.0)
    scaled = [out.get(c, F.col(c)).cast("float").alias(c) for c in REFERENCE_NUMERICAL]
    return (rows.select(*[c for c in rows.columns if c not in REFERENCE_NUMERICAL], *scaled),
            {"age_medians": medians, "count_moments": moments})


def reference_categoricals(rows, buckets: dict, seed: int = 0):
    """Replace the raw reference columns by their hashed one-hot ids; add the geo parts and platform."""
    from pyspark.sql import functions as F

    geo_parts = F.split(F.col("geo_location"), ">")
    raw = {name: F.col(name) for name in REFERENCE_SOURCES}
    raw.update({"geo_location": F.col("geo_location"),
                "geo_location_country": F.when(F.col("geo_location").isNotNull(), geo_parts.getItem(0)),
                "geo_location_state": F.when(F.size(geo_parts) >= 2,
                                             F.concat_ws(">", geo_parts.getItem(0), geo_parts.getItem(1)))})
    platform = F.col("platform").cast("int")
    ids = {name: hash_bucket(raw[name], size, seed) for name, size in buckets.items()}
    ids["platform"] = F.when(platform.between(1, 3), platform).otherwise(0).cast("int")
    keep = [c for c in rows.columns if c not in ids]
    return rows.select(*keep, *[ids[n].alias(n) for n in REFERENCE_ONEHOT])


def build_reference_features(tables, split_days=11, train_fraction=0.8, seed=0, buckets=None, multihot=None):
    """The reference feature set: (rows, the persisted frame to unpersist, statistics)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    buckets = buckets or REFERENCE_BUCKETS
    multihot = multihot or REFERENCE_MULTIHOT
    clicked_events = tables["events"].join(tables["clicks_train"].select("display_id"), "display_id", "left_semi")
    split = split_displays(clicked_events, split_days, train_fraction, seed)
    joined = join_tables(tables, split).persist(StorageLevel.MEMORY_AND_DISK)
    rows = joined.select(*[c for c in joined.columns if c not in REFERENCE_SOURCES.values()],
                         *[F.col(src).alias(name) for name, src in REFERENCE_SOURCES.items()])
    rows = reference_ctr_features(rows)
    rows = similarity_features(rows, tables, ad_doc="document_id_promo", names=REFERENCE_SIMILARITY)
    rows = age_features(rows)
    rows = with_lists(rows, {name: ("document_id", attribute_lists(
        tables, REFERENCE_MULTIHOT_ATTRIBUTE[name], "document_id", name, b, h, seed))
        for name, (b, h) in multihot.items()})
    rows = reference_categoricals(rows, buckets, seed)
    rows = rows.withColumn(LABEL, F.col(LABEL).cast("float"))
    columns = [LABEL] + REFERENCE_NUMERICAL + REFERENCE_ONEHOT + list(multihot) + [MAP, "is_train"]
    cached = rows.select(*columns).persist(StorageLevel.MEMORY_AND_DISK)
    rows, stats = reference_numerical_transform(cached)
    joined.unpersist()
    return rows.select(*columns), cached, stats


def build_features(tables, split_days=11, train_fraction=0.8, seed=0, min_views=5, smoothing=10.0,
                   buckets=None, multihot=None):
    """(rows with label, features, display_id, is_train; the persisted frame to unpersist; statistics)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    buckets = buckets or ONEHOT_BUCKETS
    multihot = multihot or MULTIHOT
    # events.csv also holds the Kaggle test displays (no clicks): split only the displays with clicks.
    clicked_events = tables["events"].join(tables["clicks_train"].select("display_id"), "display_id", "left_semi")
    split = split_displays(clicked_events, split_days, train_fraction, seed)
    # The join feeds six CTR aggregations and the features: materialize it once.
    joined = join_tables(tables, split).persist(StorageLevel.MEMORY_AND_DISK)
    rows, prior = ctr_features(joined, min_views, smoothing)
    rows = similarity_features(rows, tables)
    rows = popularity_features(rows, tables)
    rows = multihot_features(rows, tables, multihot, seed)
    rows = categorical_features(rows, buckets, seed)
    rows = rows.withColumn(LABEL, F.col(LABEL).cast("float"))
    columns = [LABEL] + NUMERICAL + list(buckets) + list(IDENTITY_ONEHOT) + list(multihot) + [MAP, "is_train"]
    # Materialized once: the statistics, the row counts and both writes all read it.
    cached = rows.select(*columns).persist(StorageLevel.MEMORY_AND_DISK)
    rows, moments = standardize(cached, NUMERICAL)
    joined.unpersist()
    return rows, cached, {"global_ctr": prior, "numerical_moments": moments}


def run(spark, input_dir: str, output: str, num_files: int = 1, split_days: int = 11, train_fraction: float = 0.8,
        seed: int = 0, min_views: int = 5, smoothing: float = 10.0, buckets=None, multihot=None,
        bad_rows: str = "skip", overwrite: bool = False, feature_set: str = DEFAULT_FEATURE_SET) -> dict:
    """The whole pipeline; returns the feature-spec dict written to ``output``."""
    from pyspark.sql import functions as F

    from preproc.dataio.output import atomic_dir, verify_against_spec

    default_buckets, default_multihot = default_sizes(feature_set)
    buckets = dict(buckets or default_buckets)
    multihot = dict(multihot or default_multihot)
    paths = locate_tables(input_dir)
    tables, report = load_tables(spark, paths, bad_rows)
    if feature_set == "legacy":
        rows, cached, stats = build_features(tables, split_days, train_fraction, seed, min_views, smoothing,
                                             buckets, multihot)
        settings = {"ctr_min_views": min_views, "ctr_smoothing": smoothing,
                    "numerical_transform": "log1p on counts, then standardization", "log1p_features": LOG_FEATURES}
    else:
        rows, cached, stats = build_reference_features(tables, split_days, train_fraction, seed, buckets, multihot)
        settings = {"ctr_min_views": REFERENCE_CTR_MIN_VIEWS}
    counts = {r["is_train"]: r["count"] for r in rows.groupBy("is_train").count().collect()}
    expected = {"train": counts.get(True, 0), "test": counts.get(False, 0)}
    log.info("outbrain: %d train and %d test rows", expected["train"], expected["test"])
    train = rows.filter("is_train").drop("is_train", MAP)
    test = rows.filter(~F.col("is_train")).drop("is_train")
    try:
        check_split_sizes(expected, input_dir)
        with atomic_dir(output, overwrite, verify=lambda stage: verify_against_spec(stage, expected)) as stage:
            train_files, _ = textio.write_parquet_files(train, stage, "train", num_files)
            test_files, _ = textio.write_parquet_files(
                test.withColumn("_f", F.pmod(F.col(MAP), F.lit(num_files))), stage, "test", num_files,
                by="_f", sort_by=[MAP])
            metadata = {"dataset": "outbrain", "engine": "spark", "feature_set": feature_set, "rows": expected,
                        "split_days": split_days, "train_fraction": train_fraction, "seed": seed, **settings,
                        **stats, "bad_rows": report}
            spec = feature_spec_dict(feature_layout(feature_set, buckets, multihot), train_files, test_files,
                                     metadata)
            textio.write_feature_spec(spec, stage)
    finally:
        cached.unpersist()
    log.info("outbrain: wrote %s", output)
    return spec

