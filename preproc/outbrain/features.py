"""The Outbrain -> Wide & Deep feature sets, by name, shared by both engines (pure Python).

``reference`` (the default) is the feature set of NVIDIA's Wide & Deep TF2 recipe
(its README and ``data/outbrain`` feature lists; read for the facts only): 13
numerical features, 13 one-hot and 3 multi-hot (hotness 3) categoricals with the
recipe's hash-bucket counts, so that our W&D defaults rebuild its ~92M-parameter
model with a total embedding width of 1235 (recsys.models.defaults). ``legacy``
is this project's earlier set (19 numerical, 13 one-hot, 6 multi-hot), kept
behind ``--feature-set legacy`` (built by preproc.outbrain.pipeline; its constants are below).

How each reference feature is computed (both engines, see docs/preprocessing.md):

* ``<context>_ctr`` for the six contexts of ``REFERENCE_CTR_MIN_VIEWS``: training
  clicks / training views of the context value when the views reach the
  context's threshold, else 0 (also 0 for a value never seen in training or a
  missing one); not rescaled.
* ``ad_id_count`` / ``document_id_promo_count``: training views (0 when unseen),
  ``log1p``, then ``(x - mean) / std`` with the training rows' mean and sample
  standard deviation (std 0 -> no scaling).
* ``publish_time[_promo]_days_since_published``: whole days from the page
  (ad) document's publish time (read as UTC) to the event, 0 when negative or over
  ``MAX_AGE_DAYS``; a missing publish time gets the training rows' exact median;
  then ``log1p``.
* ``document_id_document_id_promo_sim_<attribute>``: cosine of the page's and
  the ad document's confidence vectors (0 when either has none).
* one-hot ids: ``1 + pmod(xxhash64(str(value), seed), B - 1)``, 0 for a missing
  value (Spark's xxhash64, computed bit-for-bit in Python by the NVTabular engine);
  ``platform`` keeps its value 1-3 (0 unknown); ``geo_location_country`` /
  ``_state`` are the first one / two ``>``-separated parts of ``geo_location``.
* multi-hot: the page document's topics, entities and categories, by decreasing
  confidence (ties: raw id in string order), at most 3, each hashed as above;
  ``[0]`` for a document with none.
"""
from __future__ import annotations

LABEL, MAP = "clicked", "display_id"
FEATURE_SETS = ("reference", "legacy")
DEFAULT_FEATURE_SET = "reference"

# Where each reference column comes from in the joined event x ad table (engine-internal names).
REFERENCE_SOURCES = {
    "ad_id": "ad_id", "document_id": "document_id", "document_id_promo": "ad_document_id",
    "campaign_id": "campaign_id", "advertiser_id": "advertiser_id", "source_id": "page_source_id",
    "publisher_id": "page_publisher_id", "source_id_promo": "ad_source_id",
    "publisher_id_promo": "ad_publisher_id",
}
# One-hot channel, in the recipe's order; platform is identity-mapped, the rest hashed.
REFERENCE_ONEHOT = ["ad_id", "document_id", "platform", "document_id_promo", "campaign_id", "advertiser_id",
                    "source_id", "geo_location", "geo_location_country", "geo_location_state", "publisher_id",
                    "source_id_promo", "publisher_id_promo"]
REFERENCE_BUCKETS = {
    "document_id": 300_000, "ad_id": 250_000, "document_id_promo": 100_000, "source_id_promo": 4_000,
    "source_id": 4_000, "geo_location": 2_500, "advertiser_id": 2_500, "geo_location_state": 2_000,
    "publisher_id_promo": 1_000, "publisher_id": 1_000, "geo_location_country": 300, "campaign_id": 5_000,
}
REFERENCE_IDENTITY = {"platform": 4}
# multi-hot feature -> (buckets, max_hotness); the page document's attribute lists
REFERENCE_MULTIHOT = {"topic_id_list": (350, 3), "entity_id_list": (10_000, 3), "category_id_list": (100, 3)}
REFERENCE_MULTIHOT_ATTRIBUTE = {"topic_id_list": "topics", "entity_id_list": "entities",
                                "category_id_list": "categories"}
REFERENCE_CTR_MIN_VIEWS = {"ad_id": 5, "source_id_promo": 10, "document_id_promo": 5, "publisher_id_promo": 10,
                           "advertiser_id": 10, "campaign_id": 10}
REFERENCE_COUNTS = {"ad_id_count": "ad_id", "document_id_promo_count": "document_id_promo"}
REFERENCE_AGES = {"publish_time_days_since_published": "page", "publish_time_promo_days_since_published": "ad"}
REFERENCE_SIMILARITY = {a: f"document_id_document_id_promo_sim_{a}" for a in ("categories", "topics", "entities")}
MAX_AGE_DAYS = 3650
REFERENCE_NUMERICAL = (list(REFERENCE_SIMILARITY.values())
                       + ["document_id_promo_ctr", "publisher_id_promo_ctr", "source_id_promo_ctr",
                          "document_id_promo_count", "publish_time_days_since_published", "ad_id_ctr",
                          "advertiser_id_ctr", "campaign_id_ctr", "ad_id_count",
                          "publish_time_promo_days_since_published"])
assert sorted(REFERENCE_NUMERICAL) == sorted([f"{c}_ctr" for c in REFERENCE_CTR_MIN_VIEWS] + list(REFERENCE_COUNTS)
                                             + list(REFERENCE_AGES) + list(REFERENCE_SIMILARITY.values()))

# Legacy feature set (see preproc.outbrain.pipeline's docstring).
CTR_CONTEXTS = ["ad_id", "ad_document_id", "campaign_id", "advertiser_id", "ad_source_id", "ad_publisher_id"]
DOC_ATTRIBUTES = {"categories": ("documents_categories", "category_id"),
                  "topics": ("documents_topics", "topic_id"),
                  "entities": ("documents_entities", "entity_id")}
ONEHOT_BUCKETS = {  # hashed one-hot features and their default bucket counts
    "ad_id": 250_000, "ad_document_id": 200_000, "campaign_id": 40_000, "advertiser_id": 5_000,
    "ad_source_id": 10_000, "ad_publisher_id": 2_000, "document_id": 300_000, "page_source_id": 10_000,
    "page_publisher_id": 2_000, "geo_location": 4_000, "geo_country": 300, "geo_state": 2_000,
}
IDENTITY_ONEHOT = {"platform": 4}
MULTIHOT = {  # multi-hot feature: (buckets, max_hotness)
    "page_categories": (2_000, 3), "page_topics": (1_000, 10), "page_entities": (100_000, 10),
    "ad_categories": (2_000, 3), "ad_topics": (1_000, 10), "ad_entities": (100_000, 10),
}
LOG_FEATURES = [f"{c}_views" for c in CTR_CONTEXTS] + ["page_doc_pageviews", "ad_doc_pageviews",
                                                      "user_pageviews", "ad_doc_age_days"]
NUMERICAL = ([f"{c}_ctr" for c in CTR_CONTEXTS] + [f"{c}_views" for c in CTR_CONTEXTS]
             + [f"sim_{a}" for a in DOC_ATTRIBUTES] + ["page_doc_pageviews", "ad_doc_pageviews",
                                                      "user_pageviews", "ad_doc_age_days"])
ONEHOT = list(ONEHOT_BUCKETS) + list(IDENTITY_ONEHOT)


def feature_layout(feature_set: str, buckets: dict, multihot: dict):
    """(numerical names, {one-hot name: cardinality} in channel order, {multi-hot: (buckets, hotness)})."""
    if feature_set == "legacy":
        return list(NUMERICAL), {**buckets, **IDENTITY_ONEHOT}, dict(multihot)
    cards = {**buckets, **REFERENCE_IDENTITY}
    return list(REFERENCE_NUMERICAL), {n: cards[n] for n in REFERENCE_ONEHOT}, dict(multihot)


def feature_spec_dict(layout, train_files, test_files, metadata) -> dict:
    numerical, onehot, multihot = layout
    features = {LABEL: {"dtype": "float32"}}
    features.update({n: {"dtype": "float32"} for n in numerical})
    features.update({n: {"dtype": "int32", "cardinality": int(c)} for n, c in onehot.items()})
    features.update({n: {"dtype": "int32", "cardinality": int(b), "max_hotness": int(h)}
                     for n, (b, h) in multihot.items()})
    features[MAP] = {"dtype": "int64"}
    stored = [LABEL] + list(numerical) + list(onehot) + list(multihot)
    return {
        "feature_spec": features,
        "source_spec": {"train": [{"type": "parquet", "features": stored, "files": list(train_files)}],
                        "test": [{"type": "parquet", "features": stored + [MAP], "files": list(test_files)}]},
        "channel_spec": {"label": [LABEL], "numerical": list(numerical), "onehot_categorical": list(onehot),
                         "multihot_categorical": list(multihot), "map": [MAP]},
        "metadata": metadata,
    }


def default_sizes(feature_set: str):
    """(one-hot hash buckets, {multi-hot: (buckets, hotness)}) defaults of a feature set."""
    return (dict(ONEHOT_BUCKETS), dict(MULTIHOT)) if feature_set == "legacy" else \
        (dict(REFERENCE_BUCKETS), dict(REFERENCE_MULTIHOT))
