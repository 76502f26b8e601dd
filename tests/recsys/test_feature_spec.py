"""Feature spec: YAML round trip, helpers, and one test per validation error (one line naming the culprit)."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml

from recsys.features.spec import FeatureSpec, FeatureSpecError, categorical_dtype, parse_transform

pytestmark = pytest.mark.fast


def write_dlrm(tmp_path, rows=10, cards=(5, 300, 70000)):
    """A tiny hand-made DLRM split-binary dataset: label, 2 numericals, 3 categoricals."""
    cats = [f"cat_{i}" for i in range(len(cards))]
    spec = {
        "feature_spec": {"label": {"dtype": "bool"}, "num_0": {"dtype": "float16"}, "num_1": {"dtype": "float16"},
                         **{c: {"dtype": categorical_dtype(k), "cardinality": k} for c, k in zip(cats, cards)}},
        "source_spec": {"train": [
            {"type": "split_binary", "features": ["label"], "files": ["train/label.bin"]},
            {"type": "split_binary", "features": ["num_0", "num_1"], "files": ["train/numerical.bin"]},
        ] + [{"type": "split_binary", "features": [c], "files": [f"train/cat_{i}.bin"]} for i, c in enumerate(cats)]},
        "channel_spec": {"label": ["label"], "numerical": ["num_0", "num_1"], "categorical": cats},
        "metadata": {"note": "hand-made"},
    }
    (tmp_path / "train").mkdir(parents=True, exist_ok=True)
    np.arange(rows, dtype=np.int64).__mod__(2).astype(bool).tofile(tmp_path / "train/label.bin")
    np.arange(rows * 2, dtype=np.float16).tofile(tmp_path / "train/numerical.bin")
    for i, k in enumerate(cards):
        (np.arange(rows) % k).astype(categorical_dtype(k)).tofile(tmp_path / f"train/cat_{i}.bin")
    path = tmp_path / "feature_spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path, spec


def load_edited(tmp_path, spec, edit):
    edit(spec)
    path = tmp_path / "feature_spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def assert_one_line(err, *fragments):
    msg = str(err.value)
    assert "\n" not in msg
    for frag in fragments:
        assert frag in msg, (frag, msg)


def test_round_trip_keeps_order_and_resolves_paths_relative_to_yaml(tmp_path):
    path, raw = write_dlrm(tmp_path / "a")
    spec = FeatureSpec.from_yaml(path)
    assert list(spec.feature_spec) == list(raw["feature_spec"])
    assert spec.channel_spec["categorical"] == ["cat_0", "cat_1", "cat_2"]
    assert spec.validate() == {"train": 10}
    # moving the directory keeps it valid: files are relative to the YAML
    shutil.move(str(tmp_path / "a"), str(tmp_path / "b"))
    moved = FeatureSpec.from_yaml(tmp_path / "b")  # a directory means its feature_spec.yaml
    assert moved.path("train/label.bin") == str(tmp_path / "b/train/label.bin")
    out = moved.to_yaml(str(tmp_path / "c/spec.yaml"))
    again = FeatureSpec.from_yaml(out)
    assert again.to_dict() == moved.to_dict()
    text = open(out).read()
    assert "&id" not in text and "*id" not in text  # shared lists written in full
    assert text.index("feature_spec") < text.index("source_spec") < text.index("channel_spec") < text.index("metadata")


def test_helpers(tmp_path):
    path, _ = write_dlrm(tmp_path, rows=12)
    spec = FeatureSpec.from_yaml(path)
    assert spec.cardinalities("categorical") == [5, 300, 70000]
    assert spec.num_rows("train") == 12
    assert spec.features("missing_channel") == []
    assert spec.chunk_type("train") == "split_binary"
    assert [categorical_dtype(k) for k in (1, 128, 129, 32768, 32769, 2 ** 31)] == \
        ["int8", "int8", "int16", "int16", "int32", "int32"]
    assert parse_transform("log(x + 3)") == 3.0 and parse_transform(None) is None


def test_missing_file_is_named(tmp_path):
    path, _ = write_dlrm(tmp_path)
    os.remove(tmp_path / "train/cat_1.bin")
    with pytest.raises(FeatureSpecError) as err:
        FeatureSpec.from_yaml(path).validate()
    assert_one_line(err, str(tmp_path / "train/cat_1.bin"), "missing")


def test_channel_feature_not_declared(tmp_path):
    path, raw = write_dlrm(tmp_path)
    path = load_edited(tmp_path, raw, lambda s: s["channel_spec"]["numerical"].append("num_9"))
    with pytest.raises(FeatureSpecError) as err:
        FeatureSpec.from_yaml(path)
    assert_one_line(err, "channel_spec.numerical", "'num_9'", "not declared")


def test_chunk_feature_not_declared(tmp_path):
    path, raw = write_dlrm(tmp_path)
    path = load_edited(tmp_path, raw, lambda s: s["source_spec"]["train"][0]["features"].append("ghost"))
    with pytest.raises(FeatureSpecError) as err:
        FeatureSpec.from_yaml(path)
    assert_one_line(err, "source_spec.train[0]", "'ghost'")


def test_missing_cardinality(tmp_path):
    path, raw = write_dlrm(tmp_path)
    path = load_edited(tmp_path, raw, lambda s: s["feature_spec"]["cat_1"].pop("cardinality"))
    with pytest.raises(FeatureSpecError) as err:
        FeatureSpec.from_yaml(path)
    assert_one_line(err, "feature_spec.cat_1", "no cardinality")


@pytest.mark.parametrize("feature,dtype,fragment", [("num_0", "string", "cannot be read"),
                                                    ("num_0", "complex64", "cannot be read"),
                                                    ("cat_0", "float32", "integer dtype")])
def test_unreadable_dtype(tmp_path, feature, dtype, fragment):
    path, raw = write_dlrm(tmp_path)
    path = load_edited(tmp_path, raw, lambda s: s["feature_spec"][feature].update(dtype=dtype))
    with pytest.raises(FeatureSpecError) as err:
        FeatureSpec.from_yaml(path)
    assert_one_line(err, f"feature_spec.{feature}", fragment)


def test_float16_in_parquet_is_refused(tmp_path):
    spec = dict(feature_spec={"label": {"dtype": "bool"}, "x": {"dtype": "float16"}},
                source_spec={"train": [{"type": "parquet", "features": ["label", "x"], "files": ["a.parquet"]}]},
                channel_spec={"label": ["label"], "numerical": ["x"]})
    with pytest.raises(FeatureSpecError) as err:
        FeatureSpec(**spec)
    assert_one_line(err, "feature_spec.x", "float16", "parquet")


def test_unknown_chunk_type(tmp_path):
    path, raw = write_dlrm(tmp_path)
    path = load_edited(tmp_path, raw, lambda s: s["source_spec"]["train"][0].update(type="tfrecord"))
    with pytest.raises(FeatureSpecError) as err:
        FeatureSpec.from_yaml(path)
    assert_one_line(err, "source_spec.train[0]", "'tfrecord'")


def test_file_size_not_a_multiple_of_the_row_size(tmp_path):
    path, _ = write_dlrm(tmp_path)
    with open(tmp_path / "train/numerical.bin", "ab") as f:
        f.write(b"\0\0")  # one fp16 more: 21 values for 2 features
    with pytest.raises(FeatureSpecError) as err:
        FeatureSpec.from_yaml(path).validate()
    assert_one_line(err, "numerical.bin", "not a multiple of the row size 4 B")


def test_file_rows_disagree_with_the_mapping(tmp_path):
    path, _ = write_dlrm(tmp_path, rows=10)
    np.zeros(11, dtype=np.int32).tofile(tmp_path / "train/cat_2.bin")  # 11 rows, others 10
    with pytest.raises(FeatureSpecError) as err:
        FeatureSpec.from_yaml(path).validate()
    assert_one_line(err, "cat_2.bin", "11 rows", "label.bin has 10")


def test_bad_yaml_and_missing_sections(tmp_path):
    (tmp_path / "a.yaml").write_text("feature_spec: [unclosed\n")
    with pytest.raises(FeatureSpecError) as err:
        FeatureSpec.from_yaml(tmp_path / "a.yaml")
    assert_one_line(err, "a.yaml", "malformed YAML")
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"feature_spec": {"x": {"dtype": "bool"}}}))
    with pytest.raises(FeatureSpecError) as err:
        FeatureSpec.from_yaml(tmp_path / "b.yaml")
    assert_one_line(err, "b.yaml: source_spec", "missing")
    with pytest.raises(FeatureSpecError) as err:
        FeatureSpec.from_yaml(tmp_path / "nothere.yaml")
    assert_one_line(err, "nothere.yaml", "not found")


def test_a_spec_with_three_mistakes_reports_all_three(tmp_path):
    """Issue 44 item 3: a feature spec is checked as profiles, study specs and tabular configs are
    (slurm.common.checker.Problems): every mistake at once, one line each naming the file and the key,
    an unknown key or name with "did you mean" (it stopped at the first mistake, no hint)."""
    path, spec = write_dlrm(tmp_path)
    spec["metdata"] = spec.pop("metadata")
    spec["feature_spec"]["num_0"]["dtype"] = "float8"
    spec["source_spec"]["train"][2]["type"] = "parqet"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    with pytest.raises(FeatureSpecError) as err:
        FeatureSpec.from_yaml(path)
    assert err.value.problems == [
        f"{path}: metdata: unknown key (did you mean 'metadata'? known: feature_spec, source_spec, channel_spec, "
        "metadata)",
        f"{path}: feature_spec.num_0: dtype 'float8' cannot be read (readable: bool, int8, int16, int32, int64, "
        "float16, float32, float64)",
        f"{path}: source_spec.train[2]: chunk type 'parqet' cannot be read (known: split_binary, parquet, csv) "
        "(did you mean 'parquet'?)"]
    assert str(err.value) == err.value.problems[0]          # a single mistake stays one line
    bad = subprocess.run([sys.executable, "-m", "recsys.features.spec", str(path)], capture_output=True, text=True)
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [f"error: {p}" for p in err.value.problems]
    spec["metadata"] = spec.pop("metdata")           # without the top-level mistake: the same two from the constructor
    with pytest.raises(FeatureSpecError) as err:
        FeatureSpec(spec["feature_spec"], spec["source_spec"], spec["channel_spec"], origin="s.yaml")
    assert [p.split(": ")[1] for p in err.value.problems] == ["feature_spec.num_0", "source_spec.train[2]"]


def test_cli_validates_and_exits_nonzero_with_one_line(tmp_path):
    path, _ = write_dlrm(tmp_path)
    ok = subprocess.run([sys.executable, "-m", "recsys.features.spec", str(path)], capture_output=True, text=True)
    assert ok.returncode == 0 and "train: 10 rows" in ok.stdout
    os.remove(tmp_path / "train/label.bin")
    bad = subprocess.run([sys.executable, "-m", "recsys.features.spec", str(path)], capture_output=True, text=True)
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "label.bin" in bad.stderr


def test_no_tensorflow_at_import():
    code = ("import sys, recsys.features.spec, recsys.models.metrics, recsys.data, recsys.data.synthetic, "
            "recsys.data.transcode, recsys.data.ncf; "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
