"""Criteo preprocessing follows NVIDIA's DLRM reference by default (docs/criteo.md), on hand-built rows.

Each rule of the table is pinned here: the numerical transform (missing,
negative, zero, huge), ties, the dictionary over all days vs the training days,
the seeded shuffle of the training rows, the test/validation cut at half of the
raw lines, bad rows of the last day under ``fatal``, the id dtypes at the
int8/int16 boundaries, and a feature spec that passes the structural checks of
the reference DLRM loaders (written from their documented format).
"""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from preproc.criteo import pipeline as criteo
from preproc.criteo.layout import (NUM_CAT, NUM_INT, VALIDATION_SPEC, Rules, Staging, categorical_dtype,
                                   numerical_transform, parse_thresholds, shuffle_buckets, shuffle_key)
from preproc.errors import PreprocError

from tests.preproc.test_criteo import line, plan, read_bin, write_days

ROW_ID = NUM_CAT - 1  # cat_25 holds a unique value per line ("r<day><line>") to follow rows through the shuffle
HUGE = 10 ** 12


def rid(day, n):
    return f"r{day}{n:04d}"


# day_0: the numerical cases, ties (cat_0: b3 and a3 both 2x in training -> a3 first), the row ids
DAY0 = [line(1, {0: 0, 1: -1, 2: -2, 3: -3, 4: -10, 5: HUGE, 6: 2 ** 31 - 1}, {0: "b3", ROW_ID: rid(0, 0)}),
        line(0, {}, {0: "a3", 1: "only_test", ROW_ID: rid(0, 1)}),
        line(1, {0: 5}, {0: "b3", ROW_ID: rid(0, 2)}),
        line(0, {0: 1}, {0: "a3", ROW_ID: rid(0, 3)})]
# day_1: 126 distinct cat_3 values (-> cardinality 127, int16 by the reference's rule), more rows to shuffle
DAY1 = [line(i % 2, {0: i}, {3: f"{i:03d}", ROW_ID: rid(1, i)}) for i in range(126)]
# day_2 (last): 8 lines, line 1 bad -> cut at 4 raw lines: test = lines 0, 2, 3; validation = lines 4..7.
# "only_test" is seen once in training and twice here: kept (T=2) only with --dictionary-days all.
DAY2 = [line(1, {0: 7}, {0: "a3", 1: "only_test", ROW_ID: rid(2, 0)}), "1\tnot\tenough",
        line(0, {}, {1: "only_test", ROW_ID: rid(2, 2)}), line(1, {}, {ROW_ID: rid(2, 3)}),
        line(0, {}, {ROW_ID: rid(2, 4)}), line(1, {}, {ROW_ID: rid(2, 5)}), line(0, {}, {ROW_ID: rid(2, 6)}),
        line(1, {}, {ROW_ID: rid(2, 7)})]
THRESHOLDS = "2,C4:1,C26:1"


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    return write_days(tmp_path_factory.mktemp("criteo_ref_raw"), [DAY0, DAY1, DAY2])


def _run(spark, raw, out, rules=Rules(), **kwargs):
    files, last_day = plan(raw)
    return criteo.run(spark, files, last_day, parse_thresholds(THRESHOLDS), str(out), rules=rules, **kwargs)


@pytest.fixture(scope="module")
def default_run(spark, raw, tmp_path_factory):
    out = tmp_path_factory.mktemp("criteo_ref") / "dataset"
    return out, _run(spark, raw, out)


@pytest.fixture(scope="module")
def other_run(spark, raw, tmp_path_factory):
    """Another seed, the dictionary over the training days only, many shuffle buckets."""
    out = tmp_path_factory.mktemp("criteo_ref_other") / "dataset"
    mp = pytest.MonkeyPatch()
    from preproc.criteo import dictionary as criteo_dictionary

    mp.setattr(criteo_dictionary, "shuffle_buckets", lambda n: 7)
    try:
        report = _run(spark, raw, out, Rules(seed=5, dictionary_days="train"), keep_stages=True)
    finally:
        mp.undo()
    return out, report


def row_ids(out, mapping):
    """The row ids (cat_25) of a mapping, as the raw strings: ids follow the value order of the ids."""
    values = sorted([rid(0, n) for n in range(4)] + [rid(1, n) for n in range(126)]
                    + [rid(2, n) for n in (0, 2, 3, 4, 5, 6, 7)])
    ids = read_bin(out, mapping, f"cat_{ROW_ID}.bin", np.int16)
    return [values[i - 1] for i in ids]


def test_numerical_transform_follows_the_reference(default_run):
    out, _ = default_run
    num = read_bin(out, "train", "numerical.bin", np.float16, NUM_INT)
    ids = row_ids(out, "train")
    first = num[ids.index(rid(0, 0))].astype(np.float64)
    expected = [math.log(3), math.log(2), 0.0, 0.0, 0.0, math.log(HUGE + 3), math.log(2 ** 31 + 2)]
    assert first[:7] == pytest.approx(expected, rel=1e-3)  # 0, -1, -2, -3, -10, huge, int32 max
    assert first[7:].tolist() == [0.0] * (NUM_INT - 7)  # missing -> 0, not ln 3
    assert num[ids.index(rid(0, 1))].tolist() == [0.0] * NUM_INT  # all missing
    # the numpy statement of the rule gives the same float16 bits as Spark
    raw_values = np.array([0, -1, -2, -3, -10, HUGE, 2 ** 31 - 1] + [np.nan] * 6)
    assert numerical_transform(raw_values).tobytes() == num[ids.index(rid(0, 0))].tobytes()
    clamp = numerical_transform(np.array([-3, -1, np.nan]), "clamp").astype(np.float64)
    assert clamp == pytest.approx([math.log(3)] * 3, rel=1e-3)


def test_ties_by_ascending_value_and_dictionary_over_all_days(default_run, other_run):
    out, report = default_run
    values = dict(zip(row_ids(out, "train"), read_bin(out, "train", "cat_0.bin", np.int8).tolist()))
    # a3 and b3 tie at 2 in training; with the last day a3 has 3 -> a3 = 1, b3 = 2 either way
    assert values[rid(0, 1)] == 1 and values[rid(0, 0)] == 2 and values[rid(0, 2)] == 2
    # only_test: 1x in training + 2x in the last day: kept at T=2 over all days (the reference) ...
    assert report["cardinalities"][1] == 2
    assert read_bin(out, "test", "cat_1.bin", np.int8).tolist() == [1, 1, 0]
    # ... and left out (-> 0) when the dictionary counts the training days only
    other, other_report = other_run
    other_values = dict(zip(row_ids(other, "train"), read_bin(other, "train", "cat_0.bin", np.int8).tolist()))
    assert other_values[rid(0, 1)] == 1 and other_values[rid(0, 0)] == 2  # a real tie: ascending value
    assert other_report["cardinalities"][1] == 1
    assert read_bin(other, "test", "cat_1.bin", np.int8).tolist() == [0, 0, 0]


def test_last_day_cut_at_half_of_the_raw_lines_with_its_bad_row(default_run):
    out, report = default_run
    assert row_ids(out, "test") == [rid(2, 0), rid(2, 2), rid(2, 3)]  # lines 0..3, line 1 bad
    assert row_ids(out, "validation") == [rid(2, n) for n in range(4, 8)]
    assert report["rows"] == {"train": 130, "test": 3, "validation": 4}
    assert report["bad_rows"] == 1


def test_train_rows_shuffled_by_the_documented_seeded_key(default_run, other_run):
    out, _ = default_run
    got = row_ids(out, "train")
    lines = [(0, n) for n in range(4)] + [(1, n) for n in range(126)]
    buckets = shuffle_buckets(len(lines))
    key = {(f, n): shuffle_key(0, f, n) for f, n in lines}
    want = sorted(lines, key=lambda fl: (key[fl] % buckets, key[fl], fl[0], fl[1]))
    assert got == [rid(f, n) for f, n in want]
    assert got != sorted(got)  # not input order
    # another seed (and 7 buckets): another order of the same rows; test/validation keep input order
    other, _ = other_run
    assert len(list(Path(f"{other}.stages").rglob("piece-train-bucket-*"))) == 7
    other_ids = row_ids(other, "train")
    assert other_ids != got and Counter(other_ids) == Counter(got)
    assert read_bin(other, "validation", "label.bin", np.bool_).tolist() == \
        read_bin(out, "validation", "label.bin", np.bool_).tolist()
    # the same multiset of whole rows (label, numerical, row id) under both orders
    def rows(directory):
        labels = read_bin(directory, "train", "label.bin", np.bool_)
        num = read_bin(directory, "train", "numerical.bin", np.float16, NUM_INT)
        return Counter((rid_, bool(lab), n.tobytes()) for rid_, lab, n in zip(row_ids(directory, "train"), labels, num))
    assert rows(other) == rows(out)


def test_id_dtypes_follow_the_reference_rule(default_run):
    assert [categorical_dtype(k) for k in (1, 126, 127, 128, 32766, 32767, 32768, 2 ** 31 - 2)] == \
        ["int8", "int8", "int16", "int16", "int16", "int32", "int32", "int32"]
    with pytest.raises(PreprocError, match="too large"):
        categorical_dtype(2 ** 31 - 1)
    out, report = default_run
    assert report["cardinalities"][3] == 127
    spec = yaml.safe_load((out / "feature_spec.yaml").read_text())
    assert spec["feature_spec"]["cat_3"]["dtype"] == "int16"
    assert (out / "train" / "cat_3.bin").stat().st_size == 130 * 2


def reference_structure_errors(spec: dict, base: Path) -> list[str]:
    """The structural checks NVIDIA's DLRM loaders make on a feature spec (written from their documented format:
    exactly the mappings train and test, the channels label/numerical/categorical, one label, split_binary
    chunks of one file, one categorical feature per chunk, all numericals in one float16 chunk in channel order,
    a bool label, every feature in every mapping), plus the naming convention (num_<i>, cat_<i>,
    <mapping>/{label,numerical,cat_<i>}.bin) and the reference's dtype rule."""
    errors = []
    features, channels, source = spec["feature_spec"], spec["channel_spec"], spec["source_spec"]
    if sorted(source) != ["test", "train"]:
        errors.append(f"mappings {sorted(source)}")
    if sorted(channels) != ["categorical", "label", "numerical"]:
        errors.append(f"channels {sorted(channels)}")
    cats, nums, labels = channels.get("categorical", []), channels.get("numerical", []), channels.get("label", [])
    if len(labels) != 1 or len(set(cats)) != len(cats) or len(set(nums)) != len(nums):
        errors.append("label / unique names")
    if sorted(features) != sorted(set(cats) | set(nums) | set(labels)):
        errors.append("feature_spec keys != channel features")
    for name, attrs in features.items():
        np.dtype(attrs["dtype"])
    for name in cats:
        card = features[name].get("cardinality")
        if not isinstance(card, int) or features[name]["dtype"] != np.dtype(categorical_dtype(card)).name:
            errors.append(f"{name}: cardinality/dtype")
    if nums != [f"num_{i}" for i in range(NUM_INT)] or cats != [f"cat_{i}" for i in range(NUM_CAT)]:
        errors.append("feature names")
    for mapping in ("train", "test"):
        seen = []
        for chunk in source.get(mapping, []):
            feats, files = chunk["features"], chunk["files"]
            seen += feats
            if chunk["type"] != "split_binary" or len(files) != 1 or not feats:
                errors.append(f"{mapping}: chunk {chunk}")
                continue
            if feats[0] in cats:
                ok = len(feats) == 1 and files[0] == f"{mapping}/{feats[0]}.bin"
            elif feats[0] in nums:
                ok = feats == nums and files[0] == f"{mapping}/numerical.bin" and \
                    all(np.dtype(features[f]["dtype"]) == np.float16 for f in feats)
            elif feats[0] in labels:
                ok = len(feats) == 1 and np.dtype(features[feats[0]]["dtype"]) == np.bool_ and \
                    files[0] == f"{mapping}/label.bin"
            else:
                ok = False
            if not ok:
                errors.append(f"{mapping}: chunk {chunk}")
            if not (base / files[0]).is_file():
                errors.append(f"{files[0]} missing")
        if len(seen) != len(set(seen)) or sorted(seen) != sorted(features):
            errors.append(f"{mapping}: features {sorted(seen)}")
    return errors


def test_feature_spec_passes_the_reference_loader_checks_and_our_reader_reads_validation(default_run):
    from recsys.data import make_reader
    from recsys.features.spec import FeatureSpec

    out, _ = default_run
    spec = yaml.safe_load((out / "feature_spec.yaml").read_text())
    assert reference_structure_errors(spec, out) == []
    assert spec["metadata"]["mapping_specs"] == {"validation": VALIDATION_SPEC}
    validation = yaml.safe_load((out / VALIDATION_SPEC).read_text())
    assert list(validation["source_spec"]) == ["validation"]
    assert validation["feature_spec"] == spec["feature_spec"]
    # the checks catch what NVIDIA's loaders refuse: a third mapping
    combined = dict(spec, source_spec=dict(spec["source_spec"], validation=validation["source_spec"]["validation"]))
    assert reference_structure_errors(combined, out) == ["mappings ['test', 'train', 'validation']"]
    assert FeatureSpec.from_yaml(str(out)).validate() == {"train": 130, "test": 3}
    reader = make_reader(str(out / "feature_spec.yaml"), "validation", batch_size=2)
    labels = np.concatenate([batch[1].reshape(-1) for batch in reader.numpy_batches()])
    assert labels.astype(int).tolist() == [0, 1, 0, 1]


def test_bad_rows_of_the_last_day_are_fatal(spark, tmp_path):
    raw = write_days(tmp_path / "raw", [DAY0, DAY2])
    out = tmp_path / "dataset"
    with pytest.raises(PreprocError, match=r"day_1: 1 bad rows"):
        _run(spark, raw, out, bad_row_policy="fatal")
    assert not out.exists() and not Staging(out).dictionary.exists()


def test_rule_flags_are_checked_before_spark(tmp_path, raw):
    from tests.preproc.test_criteo import run_cli

    for args, message in [(["--train-order", "random"], "argument --train-order: invalid choice: 'random'"),
                          (["--dictionary-days", "test"], "argument --dictionary-days: invalid choice: 'test'"),
                          (["--seed", "-1"], "preproc: error: --seed: -1 is not in 0..2147483647")]:
        result = run_cli("criteo", "run", "--input", str(raw), "--output", str(tmp_path / "o"), *args)
        assert result.returncode == 2, result.stderr
        assert message in result.stderr.strip().splitlines()[-1], result.stderr
        assert "Spark" not in result.stderr and not (tmp_path / "o").exists()


def test_array_shards_and_small_splits_give_the_one_shard_bytes(spark, raw, default_run, tmp_path, monkeypatch):
    """Two transform shards (the shuffle bucket merged in finalize) and tiny input splits: same bytes."""
    from preproc.criteo import transform as criteo_transform
    from preproc.criteo.dictionary import build_dictionary
    from preproc.criteo.finalize import finalize

    reference, _ = default_run
    monkeypatch.setattr(criteo_transform, "PIECE_BITS", 2)
    previous = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "4096")
    try:
        files, last_day = plan(raw)
        staging = Staging(tmp_path / "dataset")
        meta = build_dictionary(spark, staging, files, last_day, parse_thresholds(THRESHOLDS), "skip", Rules())
        for shard in range(2):
            criteo_transform.transform_shard(spark, staging, meta, shard, 2, "skip")
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", previous)
    assert len({p.parent.name for p in staging.shards.rglob("piece-train-bucket-*/order.bin")}) == 1
    assert len(list(staging.shards.rglob("piece-train-bucket-*/order.bin"))) == 2  # one per shard: merged
    finalize(staging, overwrite=False)
    bins = sorted(p.relative_to(reference) for p in reference.glob("*/*.bin"))
    assert len(bins) == 3 * 28
    for rel in bins:
        assert (staging.output / rel).read_bytes() == (reference / rel).read_bytes(), rel
    for name in ("feature_spec.yaml", VALIDATION_SPEC):
        assert (staging.output / name).read_text() == (reference / name).read_text()


def test_reader_refuses_a_validation_spec_with_other_features(tmp_path):
    """``metadata.mapping_specs`` is followed only to a spec describing the same features (no Spark needed)."""
    from recsys.data import make_reader
    from recsys.features.spec import FeatureSpec, FeatureSpecError

    def spec(mappings, cardinality, metadata=None):
        features = {"label": {"dtype": "bool"}, "num_0": {"dtype": "float16"},
                    "cat_0": {"dtype": "int8", "cardinality": cardinality}}
        source = {m: [{"type": "split_binary", "features": [f], "files": [f"{m}/{f}.bin"]}
                      for f in features] for m in mappings}
        return FeatureSpec(features, source, {"label": ["label"], "numerical": ["num_0"], "categorical": ["cat_0"]},
                           metadata or {}, base_directory=str(tmp_path))

    spec(["train", "test"], 5, {"mapping_specs": {"validation": VALIDATION_SPEC}}).to_yaml()
    spec(["validation"], 6).to_yaml(str(tmp_path / VALIDATION_SPEC))
    with pytest.raises(FeatureSpecError, match="features or channels differ"):
        make_reader(str(tmp_path / "feature_spec.yaml"), "validation", batch_size=2)
    with pytest.raises(FeatureSpecError, match="mapping not in spec"):
        make_reader(str(tmp_path / "feature_spec.yaml"), "nosuch", batch_size=2)
