"""Transcoder round trips (CSV -> split_binary / parquet -> reader gives the CSV values) and its errors."""
import subprocess
import sys

import numpy as np
import pytest
import yaml

from recsys.data import make_reader
from recsys.data.transcode import transcode
from recsys.features.spec import FeatureSpec, FeatureSpecError

CARDS = [5, 200, 40000]  # int8, int16, int32 ids in split_binary


def dlrm_csv(tmp_path, rows=37, seed=0, sep=","):
    rng = np.random.default_rng(seed)
    label = rng.integers(0, 2, rows)
    num = rng.integers(0, 64, (rows, 2)) / 4.0  # exactly representable in float16
    cats = np.stack([rng.integers(0, k, rows) for k in CARDS], axis=1)
    lines = [sep.join([str(label[r])] + [f"{x:g}" for x in num[r]] + [str(c) for c in cats[r]]) for r in range(rows)]
    (tmp_path / "in").mkdir()
    (tmp_path / "in/train.csv").write_text("\n".join(lines) + "\n")
    spec = {"feature_spec": {"label": {"dtype": "bool"}, "num_0": {"dtype": "float16"}, "num_1": {"dtype": "float16"},
                             **{f"cat_{i}": {"dtype": "int32", "cardinality": k} for i, k in enumerate(CARDS)}},
            "source_spec": {"train": [{"type": "csv", "files": ["train.csv"],
                                       "features": ["label", "num_0", "num_1", "cat_0", "cat_1", "cat_2"]}]},
            "channel_spec": {"label": ["label"], "numerical": ["num_0", "num_1"],
                             "categorical": ["cat_0", "cat_1", "cat_2"]}}
    (tmp_path / "in/spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return tmp_path / "in", label, num, cats


def wd_csv(tmp_path):
    rows = [  # label, num_0, onehot_0, tags (multi-hot), display_id
        (1, 0.5, 3, "1;2", 10), (0, 1.5, 0, "", 10), (0, 2.0, 4, "7", 10),
        (0, 0.0, 1, "3;3;3", 11), (1, 9.0, 2, "0", 11),
        (1, 3.0, 2, "4;5", 12), (0, 2.5, 0, "", 13), (1, 1.0, 1, "2", 13),
    ]
    (tmp_path / "in/train").mkdir(parents=True)
    (tmp_path / "in/train/a.csv").write_text("".join(",".join(map(str, r)) + "\n" for r in rows))
    feats = {"label": {"dtype": "bool"}, "num_0": {"dtype": "float32"},
             "onehot_0": {"dtype": "int32", "cardinality": 5},
             "tags": {"dtype": "int32", "cardinality": 8, "max_hotness": 3}, "display_id": {"dtype": "int64"}}
    spec = {"feature_spec": feats,  # target-format chunks: the CSV columns follow the chunk's feature order
            "source_spec": {"train": [{"type": "parquet", "features": list(feats), "files": ["x.parquet"]}]},
            "channel_spec": {"label": ["label"], "numerical": ["num_0"], "onehot_categorical": ["onehot_0"],
                             "multihot_categorical": ["tags"], "map": ["display_id"]}}
    (tmp_path / "in/spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return tmp_path / "in", rows


@pytest.mark.parametrize("sep", [",", "\t"])
def test_csv_to_split_binary_round_trip(tmp_path, sep):
    src, label, num, cats = dlrm_csv(tmp_path, sep=sep)
    out = transcode(FeatureSpec.from_yaml(src / "spec.yaml"), str(src), str(tmp_path / "out"), "split_binary",
                    delimiter=sep, log=lambda *_: None)
    assert [out.dtype(f"cat_{i}") for i in range(3)] == ["int8", "int16", "int32"]
    assert sorted(p.name for p in (tmp_path / "out/train").iterdir()) == \
        ["cat_0.bin", "cat_1.bin", "cat_2.bin", "label.bin", "numerical.bin"]
    inputs, labels = next(make_reader(out, "train", 37).numpy_batches())
    assert np.array_equal(labels[:, 0], label)
    assert np.array_equal(inputs["numerical"], num)
    assert np.array_equal(inputs["categorical"], cats)
    assert not list(tmp_path.glob("out.tmp-*"))  # built under a temporary name, renamed


def test_csv_to_parquet_round_trip_keeps_display_groups_in_one_file(tmp_path):
    src, rows = wd_csv(tmp_path)
    out = transcode(FeatureSpec.from_yaml(src / "spec.yaml"), str(src), str(tmp_path / "out"), "parquet",
                    num_files=3, log=lambda *_: None)
    files = out.chunks("train")[0]["files"]
    assert len(files) == 3
    got = []
    for r in range(3):  # rank r reads file r
        (inputs, labels), = list(make_reader(out, "train", 100, r, 3, drop_remainder=False).numpy_batches())
        groups = set(inputs["map"].tolist())
        got.append(groups)
        for g in inputs["map"]:
            expected = [row for row in rows if row[4] == g]
            assert sum(1 for x in inputs["map"] if x == g) == len(expected)  # whole group in this file
        for lab, n, oh, mh, g in zip(labels[:, 0], inputs["numerical"][:, 0], inputs["onehot_categorical"]["onehot_0"],
                                     inputs["multihot_categorical"]["tags"], inputs["map"]):
            match = [row for row in rows if row[4] == g and row[1] == n]
            assert len(match) == 1
            row = match[0]
            assert (lab, oh) == (row[0], row[2])
            ids = [int(x) for x in row[3].split(";") if x]
            assert list(mh) == ids + [-1] * (3 - len(ids))
    assert sum(len(g) for g in got) == 4 and set().union(*got) == {10, 11, 12, 13}


def test_declared_transform_is_applied_once_and_recorded(tmp_path):
    src, label, num, cats = dlrm_csv(tmp_path)
    spec = FeatureSpec.from_yaml(src / "spec.yaml")
    spec.feature_spec["num_1"]["transform"] = "log(x+3)"
    out = transcode(spec, str(src), str(tmp_path / "out"), "split_binary", log=lambda *_: None)
    inputs, _ = next(make_reader(out, "train", 37).numpy_batches())
    assert np.array_equal(inputs["numerical"][:, 0], num[:, 0])  # untouched without a transform
    assert np.allclose(inputs["numerical"][:, 1], np.log(num[:, 1] + 3), rtol=1e-3)
    assert "transform" not in out.feature_spec["num_1"]
    assert out.metadata["transcoded_transforms"] == {"num_1": "log(x+3)"}


def test_id_outside_cardinality_names_feature_and_file(tmp_path):
    src, *_ = dlrm_csv(tmp_path)
    text = (src / "train.csv").read_text().splitlines()
    text[5] = ",".join(text[5].split(",")[:-1] + ["40000"])
    (src / "train.csv").write_text("\n".join(text) + "\n")
    with pytest.raises(FeatureSpecError) as err:
        transcode(FeatureSpec.from_yaml(src / "spec.yaml"), str(src), str(tmp_path / "out"), "split_binary")
    assert "train.csv" in str(err.value) and "cat_2" in str(err.value) and "40000" in str(err.value)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("out.tmp-*"))


def test_cli_errors_are_one_line_and_nonzero(tmp_path):
    src, *_ = dlrm_csv(tmp_path)
    (src / "train.csv").write_text("1,2,3\n")  # 3 fields for 6 columns
    cmd = [sys.executable, "-m", "recsys.data.transcode", "--input", str(src), "--spec", str(src / "spec.yaml"),
           "--output", str(tmp_path / "out"), "--format", "split_binary"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "train.csv" in r.stderr
    (tmp_path / "out").mkdir()
    (tmp_path / "out/keep").write_text("x")
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 2 and "--overwrite" in r.stderr and (tmp_path / "out/keep").exists()
    (src / "train.csv").unlink()
    r = subprocess.run(cmd[:-4] + ["--output", str(tmp_path / "o2"), "--format", "parquet"], capture_output=True, text=True)
    assert r.returncode == 2 and "train.csv" in r.stderr and "missing" in r.stderr
