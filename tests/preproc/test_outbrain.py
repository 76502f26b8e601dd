"""Outbrain -> Wide & Deep preprocessing: split, CTR and similarity by hand, full pipeline (the legacy
feature set; the reference set and the NVTabular engine: test_outbrain_nvt.py), bad input."""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from preproc.errors import PreprocError
from preproc.outbrain import pipeline as outbrain

pytestmark = pytest.mark.spark
DAY = outbrain.DAY_MS
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_FILES = 3


# ---------------------------------------------------------------- split
def test_split_exact_fraction_per_day_and_last_days_all_eval(spark):
    from pyspark.sql import functions as F

    days = {0: range(1, 11), 3: range(11, 16), 10: range(16, 21), 11: range(21, 24), 12: range(24, 26)}
    events = spark.createDataFrame([(d, day * DAY + 1000 * d) for day, ids in days.items() for d in ids],
                                   "display_id long, timestamp long")
    split = {r.display_id: (r.day, r.is_train) for r in outbrain.split_displays(events, 11, 0.8, seed=0).collect()}
    assert {d: day for d, (day, _) in split.items()} == {d: day for day, ids in days.items() for d in ids}
    train_per_day = {day: sorted(d for d in ids if split[d][1]) for day, ids in days.items()}
    # round(0.8 n): 10 -> 8, 5 -> 4; days >= 11 never train
    assert {day: len(ids) for day, ids in train_per_day.items()} == {0: 8, 3: 4, 10: 4, 11: 0, 12: 0}
    # the train displays of a day are those with the smallest xxhash64(display_id, seed)
    hashed = {r.id: r.h for r in spark.range(1, 26).select("id", F.xxhash64("id", F.lit(0)).alias("h")).collect()}
    for day, ids in days.items():
        if day < 11:
            expected = sorted(sorted(ids, key=lambda d: (hashed[d], d))[:len(train_per_day[day])])
            assert train_per_day[day] == expected
    again = {r.display_id: r.is_train for r in outbrain.split_displays(events, 11, 0.8, seed=0).collect()}
    assert again == {d: t for d, (_, t) in split.items()}
    other_seed = {r.display_id: r.is_train for r in outbrain.split_displays(events, 11, 0.8, seed=1).collect()}
    assert other_seed != again


# ---------------------------------------------------------------- CTR by hand
def ctr_rows(spark):
    cols = ["is_train", "clicked"] + outbrain.CTR_CONTEXTS
    data = [  # is_train, clicked, ad_id, ad_document_id, campaign_id, advertiser_id, ad_source_id, ad_publisher_id
        (True, 1, 1, None, 7, None, None, None),
        (True, 0, 1, None, 7, None, None, None),
        (True, 0, 1, None, 7, None, None, None),
        (True, 1, 2, None, None, None, None, None),
        (False, 1, 1, None, 7, None, None, None),  # eval rows never count
        (False, 0, 3, None, None, None, None, None),
    ]
    schema = "is_train boolean, clicked int, " + ", ".join(f"{c} long" for c in outbrain.CTR_CONTEXTS)
    return spark.createDataFrame(data, schema).select(*cols)


@pytest.mark.parametrize("min_views,smoothing,expected_ad,expected_campaign", [
    # prior p = 2 clicks / 4 train views = 0.5
    (2, 1.0, {1: (1 + 0.5) / (3 + 1), 2: 0.5, 3: 0.5}, {7: (1 + 0.5) / (3 + 1), None: 0.5}),
    (1, 0.0, {1: 1 / 3, 2: 1.0, 3: 0.5}, {7: 1 / 3, None: 0.5}),
])
def test_ctr_values_by_hand(spark, min_views, smoothing, expected_ad, expected_campaign):
    rows, prior = outbrain.ctr_features(ctr_rows(spark), min_views=min_views, smoothing=smoothing)
    assert prior == pytest.approx(0.5)
    out = rows.collect()
    assert len(out) == 6
    for r in out:
        assert r.ad_id_ctr == pytest.approx(expected_ad[r.ad_id])
        assert r.campaign_id_ctr == pytest.approx(expected_campaign[r.campaign_id])
        assert r.ad_publisher_id_ctr == pytest.approx(0.5) and r.ad_publisher_id_views == 0
    views = {r.ad_id: r.ad_id_views for r in out}
    assert views == {1: 3, 2: 1, 3: 0}


# ---------------------------------------------------------------- similarity, multi-hot, hashing
def doc_tables(spark):
    def table(rows, key_type):
        return spark.createDataFrame(rows, f"document_id long, key {key_type}, confidence_level double")

    cats = table([(1, 10, 0.6), (1, 20, 0.8), (2, 10, 1.0), (3, 20, 0.5), (3, 30, 0.5)], "long")
    return {"documents_categories": cats.withColumnRenamed("key", "category_id"),
            "documents_topics": table([(1, 5, 0.3)], "long").withColumnRenamed("key", "topic_id"),
            "documents_entities": table([], "string").withColumnRenamed("key", "entity_id")}


def test_similarity_cosine_by_hand(spark):
    pairs = spark.createDataFrame([(1, 2), (1, 3), (1, 4), (4, 2)], "document_id long, ad_document_id long")
    out = outbrain.similarity_features(pairs, doc_tables(spark)).collect()
    sims = {(r.document_id, r.ad_document_id): r for r in out}
    assert sims[(1, 2)].sim_categories == pytest.approx(0.6)
    assert sims[(1, 3)].sim_categories == pytest.approx(0.8 * 0.5 / math.sqrt(0.5))
    assert sims[(1, 4)].sim_categories == 0.0 and sims[(4, 2)].sim_categories == 0.0
    assert all(r.sim_topics == 0.0 and r.sim_entities == 0.0 for r in sims.values())


def test_multihot_order_hotness_and_missing(spark):
    from pyspark.sql import functions as F

    rows = spark.createDataFrame([(1, 3), (4, 1)], "document_id long, ad_document_id long")
    multihot = {name: (50, 1 if name == "ad_categories" else 3) for name in outbrain.MULTIHOT}
    out = {r.document_id: r for r in outbrain.multihot_features(rows, doc_tables(spark), multihot, seed=0).collect()}
    ids = {r.k: r.h for r in spark.createDataFrame([(10,), (20,), (30,), (5,)], "k long")
           .select("k", outbrain.hash_bucket(F.col("k"), 50).alias("h")).collect()}
    assert out[1].page_categories == [ids[20], ids[10]]  # by decreasing confidence 0.8, 0.6
    assert out[1].page_topics == [ids[5]]
    assert out[1].ad_categories == [ids[20]]  # doc 3: 20 and 30 tie at 0.5, smaller raw id first; hotness 1
    assert out[4].page_categories == [0] and out[4].page_entities == [0]  # a document without any -> [0]
    assert out[1].ad_categories != [0]


def test_hash_bucket_range(spark):
    from pyspark.sql import functions as F

    df = spark.range(2000).select(F.when(F.col("id") % 100 == 0, None).otherwise(F.col("id")).alias("v"))
    values = [r.b for r in df.select(outbrain.hash_bucket(F.col("v"), 7, seed=5).alias("b")).collect()]
    assert set(values) == set(range(7))  # 0 only for the nulls, 1..6 all used
    assert values.count(0) == 20


# ---------------------------------------------------------------- whole pipeline on generated tables
@pytest.fixture(scope="module")
def generated(spark, tmp_path_factory):
    from preproc.outbrain.generate import generate

    base = tmp_path_factory.mktemp("outbrain")
    generate(str(base / "raw"), displays=300, seed=3)
    spec = outbrain.run(spark, str(base / "raw"), str(base / "out"), num_files=NUM_FILES, seed=0,
                        buckets={**outbrain.ONEHOT_BUCKETS, "ad_id": 1000, "document_id": 1000}, feature_set="legacy")
    return base, spec


def test_pipeline_files_split_and_map_channel(generated):
    base, spec = generated
    assert spec["metadata"]["feature_set"] == "legacy"
    assert [len(spec["channel_spec"][c]) for c in ("numerical", "onehot_categorical", "multihot_categorical")] \
        == [19, 13, 6]
    out = base / "out"
    for mapping in ("train", "test"):
        files = spec["source_spec"][mapping][0]["files"]
        assert files == [f"{mapping}/part_{i:05d}.parquet" for i in range(NUM_FILES)]
        assert sorted(os.listdir(out / mapping)) == [os.path.basename(f) for f in files]
    assert spec["channel_spec"]["map"] == ["display_id"]
    assert "display_id" not in spec["source_spec"]["train"][0]["features"]
    assert "display_id" in spec["source_spec"]["test"][0]["features"]
    train = pd.read_parquet(out / "train")
    assert "display_id" not in train.columns
    parts = [pd.read_parquet(out / "test" / f"part_{i:05d}.parquet") for i in range(NUM_FILES)]
    for i, part in enumerate(parts):  # a display's ads share one file, sorted by display id
        assert set(part["display_id"] % NUM_FILES) == {i}
        assert part["display_id"].is_monotonic_increasing
    test = pd.concat(parts)

    events = pd.read_csv(base / "raw" / "events.csv")
    clicks = pd.read_csv(base / "raw" / "clicks_train.csv")
    assert len(events) > clicks["display_id"].nunique()  # events also hold displays without clicks
    events = events[events["display_id"].isin(clicks["display_id"])]
    events["day"] = events["timestamp"] // DAY
    test_displays = set(test["display_id"])
    assert set(events.loc[events["day"] >= 11, "display_id"]) <= test_displays  # last two days: all eval
    for day, group in events[events["day"] < 11].groupby("day"):
        n_eval = len(set(group["display_id"]) & test_displays)
        assert len(group) - n_eval == math.floor(0.8 * len(group) + 0.5)
    assert len(train) + len(test) == len(clicks) == sum(spec["metadata"]["rows"].values())
    assert (test.groupby("display_id")["clicked"].sum() >= 1).all()


def test_pipeline_feature_ranges(generated):
    base, spec = generated
    fs = spec["feature_spec"]
    for mapping in ("train", "test"):
        df = pd.read_parquet(base / "out" / mapping)
        assert not df.isna().any().any()
        for name in spec["channel_spec"]["onehot_categorical"]:
            assert df[name].between(0, fs[name]["cardinality"] - 1).all(), name
        for name in spec["channel_spec"]["multihot_categorical"]:
            lengths = df[name].map(len)
            assert lengths.between(1, fs[name]["max_hotness"]).all(), name
            assert all(0 <= v < fs[name]["cardinality"] for row in df[name] for v in row), name
        assert str(df["clicked"].dtype) == "float32"
        assert all(str(df[n].dtype) == "float32" for n in spec["channel_spec"]["numerical"])
        if mapping == "train":  # standardized with the training statistics
            means = df[spec["channel_spec"]["numerical"]].mean()
            assert (means.abs() < 1e-3).all(), means
    assert fs["ad_id"]["cardinality"] == 1000 and fs["platform"]["cardinality"] == 4


def test_pipeline_reader_and_short_training(generated):
    base, spec = generated
    pytest.importorskip("tensorflow")
    from recsys.data import make_dataset
    from recsys.features.spec import FeatureSpec

    fs = FeatureSpec.from_yaml(str(base / "out"))
    assert fs.validate() == spec["metadata"]["rows"]
    inputs, labels = next(iter(make_dataset(fs, "train", batch_size=32, rank=2, world_size=NUM_FILES)))
    assert labels.shape == (32, 1) and "map" not in inputs
    assert inputs["numerical"].shape == (32, len(outbrain.NUMERICAL))
    assert inputs["multihot_categorical"]["page_topics"].shape == (32, outbrain.MULTIHOT["page_topics"][1])
    inputs, _ = next(iter(make_dataset(fs, "test", batch_size=32)))
    assert inputs["map"].dtype.name == "int64"

    if not os.path.exists(os.path.join(REPO, "recsys", "train.py")):
        pytest.skip("recsys.train (ENGINE) is not in this checkout")
    proc = subprocess.run([sys.executable, "-m", "recsys.train", "--model", "wide_deep", "--data-path",
                           str(base / "out"), "--max-steps", "5", "--batch-size", "64"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "map_at_12" in proc.stdout + proc.stderr


# ---------------------------------------------------------------- bad input
def test_bad_rows_counted_then_skipped_or_fatal(spark, tmp_path):
    from preproc.outbrain.generate import generate

    generate(str(tmp_path), displays=20, seed=1)
    good_rows = len(pd.read_csv(tmp_path / "clicks_train.csv"))
    with open(tmp_path / "clicks_train.csv", "a") as f:
        f.write("1,2\nx,3,0\n5,6,1,9\n")
    paths = outbrain.locate_tables(str(tmp_path))
    tables, report = outbrain.load_tables(spark, paths, "skip")
    bad = {os.path.basename(k): v["bad_rows"] for k, v in report.items()}
    assert bad["clicks_train.csv"] == 3 and sum(bad.values()) == 3
    assert tables["clicks_train"].count() == good_rows
    with pytest.raises(PreprocError, match="clicks_train.csv: 3 bad rows"):
        outbrain.load_tables(spark, paths, "fatal")


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "preproc", "outbrain", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def raw_tables(tmp_path_factory):
    from preproc.outbrain.generate import generate

    raw = tmp_path_factory.mktemp("outbrain_cli") / "raw"
    generate(str(raw), displays=30, seed=2)
    return raw


@pytest.mark.parametrize("breakage,extra,message", [
    ("missing", [], "missing Outbrain table events"),
    ("header_only", [], "has a header but no rows"),
    ("empty", [], "input file is empty"),
    ("wrong_header", [], "expected 'ad_id,document_id,campaign_id,advertiser_id'"),
    (None, ["--buckets", "ad_id=1"], "--buckets: bad entry"),
    (None, ["--hotness", "nope=3"], "--hotness: bad entry"),
    ("exists", [], "pass --overwrite"),
])
def test_cli_bad_input_one_line_error_before_spark(raw_tables, tmp_path, breakage, extra, message):
    raw = tmp_path / "raw"
    shutil.copytree(raw_tables, raw)
    if breakage == "missing":
        os.remove(raw / "events.csv")
    elif breakage == "header_only":
        (raw / "documents_topics.csv").write_text(outbrain.header_of("documents_topics") + "\n")
    elif breakage == "empty":
        (raw / "page_views.csv").write_text("")
    elif breakage == "wrong_header":
        (raw / "promoted_content.csv").write_text("ad,doc\n1,2\n")
    elif breakage == "exists":
        (tmp_path / "out").mkdir()
    proc = run_cli("run", "--input", str(raw), "--output", str(tmp_path / "out"), *extra)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("preproc: error:"), proc.stderr


def test_generator_skewed_ads_and_one_click_per_display(tmp_path):
    from preproc.outbrain.generate import generate

    generate(str(tmp_path), displays=600, seed=7)
    clicks = pd.read_csv(tmp_path / "clicks_train.csv")
    assert (clicks.groupby("display_id")["clicked"].sum() == 1).all()
    impressions = clicks["ad_id"].value_counts()
    top = impressions.iloc[:max(1, len(impressions) // 10)].sum()
    assert top > 0.3 * impressions.sum()  # power law: the top 10 % of ads get over 30 % of impressions
    events = pd.read_csv(tmp_path / "events.csv")
    assert set(clicks["display_id"]) < set(events["display_id"])
    assert (events["timestamp"] // DAY).between(0, 12).all() and (events["timestamp"] // DAY).nunique() == 13
    assert events["display_id"].is_monotonic_increasing and events["timestamp"].is_monotonic_increasing


def test_cli_generate_tables_and_dry_run(tmp_path):
    proc = run_cli("generate", "--out", str(tmp_path / "raw"), "--displays", "40", "--seed", "4")
    assert proc.returncode == 0, proc.stderr
    for table in outbrain.TABLES:
        df = pd.read_csv(tmp_path / "raw" / f"{table}.csv")
        assert ",".join(df.columns) == outbrain.header_of(table) and len(df) > 0
    clicks = pd.read_csv(tmp_path / "raw" / "clicks_train.csv")
    assert clicks["display_id"].nunique() == 40
    assert (clicks.groupby("display_id")["clicked"].sum() >= 1).all()
    assert clicks.groupby("display_id").size().between(2, 12).all()
    proc = run_cli("run", "--input", str(tmp_path / "raw"), "--output", str(tmp_path / "out"), "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "spark.master=local[" in proc.stdout and "# plan: outbrain" in proc.stdout
    assert not (tmp_path / "out").exists()
