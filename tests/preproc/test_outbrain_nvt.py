"""The reference Outbrain feature set: Spark and NVTabular engines give the same dataset, and the
engine's W&D defaults build the reference model from it.

One Spark run and one NVTabular run over the same generated raw tables (module fixtures); the
comparison holds rows, split, categorical ids and lists exactly, numericals to 1e-5.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from preproc.outbrain import pipeline as outbrain
from preproc.outbrain.features import (REFERENCE_BUCKETS, REFERENCE_MULTIHOT, REFERENCE_NUMERICAL,
                                       REFERENCE_ONEHOT)

pytestmark = pytest.mark.spark
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_FILES = 3
SMALL = {"ad_id": 1000, "document_id": 1000, "document_id_promo": 1000}  # small tables for the 5-step run


def read_mapping(directory, mapping):
    """The rows of one mapping (the ``*.parquet`` parts only: an NVTabular dir also holds the workflow)."""
    return pd.concat([pd.read_parquet(f) for f in sorted(glob.glob(os.path.join(directory, mapping, "*.parquet")))],
                     ignore_index=True)


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    from preproc.outbrain.generate import generate

    base = tmp_path_factory.mktemp("outbrain_ref")
    generate(str(base / "raw"), displays=300, seed=3)
    return base


@pytest.fixture(scope="module")
def spark_out(spark, raw):
    spec = outbrain.run(spark, str(raw / "raw"), str(raw / "spark"), num_files=NUM_FILES, seed=0,
                        buckets={**REFERENCE_BUCKETS, **SMALL})
    return raw / "spark", spec


@pytest.fixture(scope="module")
def nvt_out(raw):
    pytest.importorskip("nvtabular")
    proc = run_cli("run", "--engine", "nvtabular", "--input", str(raw / "raw"), "--output", str(raw / "nvt"),
                   "--num-files", str(NUM_FILES), "--buckets", ",".join(f"{k}={v}" for k, v in SMALL.items()))
    assert proc.returncode == 0, proc.stderr[-3000:]
    import yaml

    with open(raw / "nvt" / "feature_spec.yaml") as f:
        return raw / "nvt", yaml.safe_load(f)


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "preproc", "outbrain", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------- the reference dataset (Spark)
def test_reference_spec_channels_and_ranges(spark_out):
    out, spec = spark_out
    ch, fs = spec["channel_spec"], spec["feature_spec"]
    assert ch["numerical"] == REFERENCE_NUMERICAL and len(ch["numerical"]) == 13
    assert ch["onehot_categorical"] == REFERENCE_ONEHOT and len(ch["onehot_categorical"]) == 13
    assert ch["multihot_categorical"] == ["topic_id_list", "entity_id_list", "category_id_list"]
    assert {n: (fs[n]["cardinality"], fs[n]["max_hotness"]) for n in ch["multihot_categorical"]} == REFERENCE_MULTIHOT
    assert fs["platform"]["cardinality"] == 4 and fs["geo_location"]["cardinality"] == 2500
    assert fs["ad_id"]["cardinality"] == 1000 and spec["metadata"]["feature_set"] == "reference"
    for mapping in ("train", "test"):
        df = read_mapping(out, mapping)
        assert not df.isna().any().any()
        for name in ch["onehot_categorical"]:
            assert df[name].between(0, fs[name]["cardinality"] - 1).all(), name
        for name in ch["multihot_categorical"]:
            assert df[name].map(len).between(1, 3).all(), name
        for name in [c for c in ch["numerical"] if c.endswith("_ctr") or "_sim_" in c]:
            assert df[name].between(0.0, 1.0 + 1e-6).all(), name
        assert (df[[c for c in ch["numerical"] if "days_since" in c]] >= 0).all().all()
    train = read_mapping(out, "train")
    assert (train[["ad_id_count", "document_id_promo_count"]].mean().abs() < 1e-3).all()
    assert (train[["ad_id_count", "document_id_promo_count"]].std() - 1).abs().max() < 1e-3  # sample std


def test_reference_ctr_threshold_by_hand(spark_out, raw):
    """ad_id_ctr of a test row = training clicks / views of its ad when the ad has >= 5 training views, else 0."""
    out, spec = spark_out
    clicks = pd.read_csv(raw / "raw" / "clicks_train.csv")
    test = read_mapping(out, "test")
    train_displays = set(clicks["display_id"]) - set(test["display_id"])
    train = clicks[clicks["display_id"].isin(train_displays)]
    stats = train.groupby("ad_id")["clicked"].agg(["sum", "count"])
    expected = np.where(stats["count"] >= 5, stats["sum"] / stats["count"], 0.0)
    by_ad = dict(zip(stats.index, expected))
    rows = clicks.merge(test[["display_id"]].drop_duplicates(), on="display_id").sort_values("display_id")
    want = sorted(by_ad.get(a, 0.0) for a in rows["ad_id"])
    assert np.allclose(sorted(test["ad_id_ctr"]), want, atol=1e-6)
    assert (np.asarray(expected) == 0).any() and (np.asarray(expected) > 0).any()  # both branches taken


# ---------------------------------------------------------------- NVTabular == Spark
def _sorted(df, spec, mapping):
    ch = spec["channel_spec"]
    df = df.copy()
    for c in ch["multihot_categorical"]:
        df[c] = df[c].map(tuple)
    key = ["clicked"] + ch["onehot_categorical"] + ch["multihot_categorical"] + (["display_id"] * (mapping == "test"))
    rounded = df[ch["numerical"]].round(4).add_prefix("_r_")
    return pd.concat([df, rounded], axis=1).sort_values(key + list(rounded.columns), kind="mergesort") \
        .reset_index(drop=True), key


def test_nvtabular_equals_spark(spark_out, nvt_out):
    (s_dir, s_spec), (n_dir, n_spec) = spark_out, nvt_out
    assert n_spec["feature_spec"] == s_spec["feature_spec"] and n_spec["channel_spec"] == s_spec["channel_spec"]
    assert n_spec["metadata"]["rows"] == s_spec["metadata"]["rows"]
    assert n_spec["metadata"]["age_medians"] == s_spec["metadata"]["age_medians"]
    for mapping in ("train", "test"):
        assert [os.path.basename(f) for f in n_spec["source_spec"][mapping][0]["files"]] == \
               [f"part_{i:05d}.parquet" for i in range(NUM_FILES)]
        s, key = _sorted(read_mapping(s_dir, mapping), s_spec, mapping)
        n, _ = _sorted(read_mapping(n_dir, mapping), n_spec, mapping)
        assert len(s) == len(n) > 0
        for c in key:  # same rows, split, ids and lists, exactly
            assert (s[c] == n[c]).all(), (mapping, c)
        for c in s_spec["channel_spec"]["numerical"]:
            assert np.allclose(s[c], n[c], rtol=0, atol=1e-5), (mapping, c)
        for c in s.columns:
            if not c.startswith("_r_"):
                assert str(s[c].dtype) == str(n[c].dtype), c
    test_parts = sorted(glob.glob(str(n_dir / "test" / "*.parquet")))
    for i, path in enumerate(test_parts):  # a display's ads share a file, sorted by display id
        part = pd.read_parquet(path)
        assert set(part["display_id"] % NUM_FILES) == {i} and part["display_id"].is_monotonic_increasing


def test_nvtabular_saved_workflow_transforms_new_data(nvt_out, raw):
    """The workflow saved next to the data, loaded again, gives the written test rows from the raw frame."""
    import nvtabular as nvt
    from merlin.io import Dataset

    from preproc.outbrain import nvt as outbrain_nvt

    out, spec = nvt_out
    assert os.path.isdir(out / "workflow") and spec["metadata"]["workflow"] == "workflow"
    workflow = nvt.Workflow.load(str(out / "workflow"))
    tables, _ = outbrain_nvt.load_tables(outbrain.locate_tables(str(raw / "raw")))
    frame = outbrain_nvt.joined_frame(tables)
    test_displays = set(read_mapping(out, "test")["display_id"])
    frame = frame[frame["display_id"].isin(test_displays)]
    written = read_mapping(out, "test")
    again = workflow.transform(Dataset(frame, cpu=True)).to_ddf().compute()[list(written.columns)]
    written, key = _sorted(written, spec, "test")
    again, _ = _sorted(again.astype({c: "float32" for c in REFERENCE_NUMERICAL + ["clicked"]}), spec, "test")
    assert len(again) == len(written)
    for c in key:
        assert (again[c] == written[c]).all(), c
    for c in REFERENCE_NUMERICAL:
        assert np.allclose(again[c], written[c], atol=1e-6), c


def test_spark_xxhash64_matches_spark(spark):
    import struct

    from pyspark.sql import functions as F

    pytest.importorskip("nvtabular")
    from preproc.outbrain.nvt import spark_xxhash64

    values = ["US>CA>807", "", "é", "1234567", "a" * 33]
    got = spark.createDataFrame([(v, i * 977) for i, v in enumerate(values)], "s string, n long") \
        .select(F.xxhash64("s", F.lit(7)).alias("hs"), F.xxhash64("n", F.lit(0)).alias("hn")).collect()
    assert [r.hs for r in got] == [spark_xxhash64(v.encode(), 7) for v in values]
    assert [r.hn for r in got] == [spark_xxhash64(struct.pack("<q", i * 977), 0) for i in range(len(values))]


@pytest.mark.parametrize("reader", ["tfdata", "merlin"])
def test_wide_deep_trains_5_steps_on_nvtabular_output(nvt_out, reader):
    """Both readers train W&D (multi-hot columns included) on the NVTabular output."""
    pytest.importorskip("tensorflow")
    if reader == "merlin":
        pytest.importorskip("merlin.dataloader")
    out, _ = nvt_out
    proc = subprocess.run([sys.executable, "-m", "recsys.train", "--model", "wide_deep", "--data-path", str(out),
                           "--max-steps", "5", "--batch-size", "64", "--reader", reader],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "map_at_12" in proc.stdout + proc.stderr


# ---------------------------------------------------------------- the reference model
def test_wide_deep_defaults_give_the_reference_model(tmp_path):
    """Reference cardinalities + the engine's W&D defaults: total embedding width 1235, ~92M parameters."""
    pytest.importorskip("tensorflow")
    from recsys import train
    from recsys.models.defaults import MODEL_DEFAULTS, embedding_dims
    from preproc.dataio import textio

    layout = outbrain.feature_layout("reference", REFERENCE_BUCKETS, REFERENCE_MULTIHOT)
    spec = outbrain.feature_spec_dict(layout, ["train/part_00000.parquet"], ["test/part_00000.parquet"], {})
    row = {"clicked": np.float32(0), **{n: np.float32(0) for n in layout[0]}, **{n: np.int32(0) for n in layout[1]},
           **{n: [np.array([0], dtype="int32")] for n in layout[2]}}
    for mapping in ("train", "test"):  # one row per mapping: the spec must point at real files
        (tmp_path / mapping).mkdir()
        extra = {"display_id": np.int64(1)} if mapping == "test" else {}
        pd.DataFrame({k: v if isinstance(v, list) else [v] for k, v in {**row, **extra}.items()}) \
            .to_parquet(tmp_path / mapping / "part_00000.parquet")
    textio.write_feature_spec(spec, tmp_path)
    cfg = train.resolve(train.build_parser().parse_args(
        ["--model", "wide_deep", "--feature-spec", str(tmp_path / "feature_spec.yaml"), "--embedding-memory-gb", "64",
         "--batch-size", "1"]))  # the model's size does not depend on the batch; the files hold one row
    deep = [t for t in cfg.embedding_tables if not t[0].endswith("/wide")]
    assert sum(d for _, _, d in deep) == 1235 and len(deep) == 16
    assert {n: d for n, _, d in deep}["platform"] == 19 and {n: d for n, _, d in deep}["document_id"] == 128

    import tensorflow as tf

    from recsys.models.wide_deep import WideDeep

    onehot = [(n, layout[1][n]) for n in layout[1]]
    multihot = [(n, b) for n, (b, _) in layout[2].items()]
    d = MODEL_DEFAULTS["wide_deep"]
    model = WideDeep(onehot, multihot, embedding_dim=embedding_dims("wide_deep", [n for n, _ in onehot + multihot],
                                                                    cfg.embedding_dim),
                     deep_hidden_units=d["deep_hidden_units"])
    batch = {"numerical": tf.zeros([2, 13]), "onehot_categorical": {n: tf.zeros([2], tf.int32) for n, _ in onehot},
             "multihot_categorical": {n: tf.zeros([2, 3], tf.int32) for n, _ in multihot}}
    model(batch)
    params = sum(int(np.prod(v.shape)) for v in model.trainable_variables)  # not the dropout step counters
    embeddings = sum(c * dim for (_, c), dim in zip(onehot + multihot, [t[2] for t in deep]))
    assert params == embeddings + sum(c for _, c in onehot + multihot) + 14 + \
        (1248 * 1024 + 1024) + 4 * (1024 * 1024 + 1024) + 1025
    assert 91.5e6 < params < 92.5e6, params
    # another --embedding-dim, or another feature set (legacy also has document_id / platform), gets one width
    names = [n for n, _ in onehot + multihot]
    assert set(embedding_dims("wide_deep", names, 32)) == {32}
    assert set(embedding_dims("wide_deep", names[:-1] + ["page_topics"], 64)) == {64}


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize("extra,message", [
    (["--engine", "nvtabular", "--feature-set", "legacy"], "--engine nvtabular: builds --feature-set reference only"),
    (["--engine", "nvtabular", "--buckets", "page_topics=9"], "--buckets: bad entry"),
    (["--engine", "nvtabular", "--ctr-smoothing", "3"], "--ctr-smoothing: applies to --feature-set legacy only"),
    (["--engine", "pandas"], "invalid choice: 'pandas'"),
    # the GPU path is asked for on this CPU-only machine: refused before any work, as for Criteo
    (["--engine", "nvtabular", "--device", "gpu"], "--device gpu: no GPU visible on this node"),
])
def test_cli_bad_input_one_line_error(raw, tmp_path, extra, message):
    proc = run_cli("run", "--input", str(raw / "raw"), "--output", str(tmp_path / "out"), *extra, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.strip().splitlines() if not line.startswith("usage:")
             and not line.startswith(" ")]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_nvtabular_missing_table_fails_before_work(raw, tmp_path):
    shutil.copytree(raw / "raw", tmp_path / "raw")
    os.remove(tmp_path / "raw" / "documents_meta.csv")
    proc = run_cli("run", "--engine", "nvtabular", "--input", str(tmp_path / "raw"), "--output",
                   str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"preproc: error: --input: {tmp_path / 'raw' / 'documents_meta.csv'}: missing Outbrain table documents_meta"]
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_nvtabular_bad_rows_as_spark(tmp_path):
    """The pandas reader counts and skips the same bad rows as the Spark reader (or fails with --bad-rows fatal)."""
    pytest.importorskip("nvtabular")
    from preproc.outbrain import nvt as outbrain_nvt
    from preproc.errors import PreprocError
    from preproc.outbrain.generate import generate

    generate(str(tmp_path), displays=20, seed=1)
    good_rows = len(pd.read_csv(tmp_path / "clicks_train.csv"))
    with open(tmp_path / "clicks_train.csv", "a") as f:
        f.write("1,2\nx,3,0\n5,6,1,9\n 7 , 8 ,1\n")
    paths = outbrain.locate_tables(str(tmp_path))
    tables, report = outbrain_nvt.load_tables(paths, "skip")
    bad = {os.path.basename(k): v["bad_rows"] for k, v in report.items()}
    assert bad["clicks_train.csv"] == 3 and sum(bad.values()) == 3
    assert len(tables["clicks_train"]) == good_rows + 1  # " 7 , 8 ,1": fields are trimmed, as Spark does
    with pytest.raises(PreprocError, match="clicks_train.csv: 3 bad rows"):
        outbrain_nvt.load_tables(paths, "fatal")


def test_nvtabular_device_choice_and_host_operators(raw, tmp_path):
    """--device picks the runtime as for Criteo (the dry run names it); operators written for pandas
    pass pandas partitions through untouched (cudf ones take the host round trip: GPU only)."""
    from preproc.outbrain import nvt as outbrain_nvt

    proc = run_cli("run", "--engine", "nvtabular", "--input", str(raw / "raw"), "--output", str(tmp_path / "o"),
                   "--dry-run", "--device", "auto", "--node-cores", "3", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "# engine nvtabular: CPU: dask threaded scheduler, 3 thread(s), pandas" in proc.stdout, proc.stdout
    frame = pd.DataFrame({"platform": [1, 7, None]})
    out = outbrain_nvt.PlatformId().transform(None, frame)
    assert type(out) is pd.DataFrame and out["platform"].tolist() == [1, 0, 0]
    assert outbrain_nvt.to_host(frame) is frame
