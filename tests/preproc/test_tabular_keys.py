"""`keys:` (issue 45 section 2): row identifiers copied as they are into every parquet file of a
tabular dataset and of `tabular apply`'s, and `tabular apply` on new rows without the label column
(a dataset with `metadata.labels: false` and the placeholder label 0). The config checks are pure
(``fast``); the pipeline runs once on a small generated CSV (~10 s)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from preproc.errors import PreprocError
from preproc.tabular.config import parse_config

CONFIG = {"label": "clicked", "categorical": ["colour"], "numerical": ["x"], "keys": ["id", "colour"]}


@pytest.mark.fast
def test_keys_are_read_and_stored_under_their_own_names():
    config = parse_config(CONFIG, "my.yaml")
    assert config.keys == ("id", "colour") and config.key_columns == {"id": "key_id", "colour": "key_colour"}
    assert config.input_columns == ["clicked", "colour", "x", "id"]
    assert parse_config(config.to_dict()).keys == config.keys
    assert parse_config({k: v for k, v in CONFIG.items() if k != "keys"}).keys == ()


@pytest.mark.fast
@pytest.mark.parametrize("keys, needle", [
    ("id", None),
    ({"id": 1}, "keys: must be a list of columns"),
    (["score"], "keys[0]: 'score' is a column of the predictions (file, row, score)"),
    (["id", "id"], "keys: a column is named twice"),
    (["a/b"], "keys[0]: column 'a/b' has a '/'"),
    (["id"], "keys[0]: its output column 'key_id' is a feature's name"),
])
def test_key_errors_name_the_key(keys, needle):
    raw = dict(CONFIG, keys=keys)
    if needle and "feature's name" in needle:
        raw["numerical"] = ["x", "key_id"]
    if needle is None:
        assert parse_config(raw, "my.yaml").keys == ("id",)
        return
    with pytest.raises(PreprocError) as err:
        parse_config(raw, "my.yaml")
    assert str(err.value).startswith("my.yaml: ") and needle in str(err.value)


@pytest.fixture(scope="module")
def applied(tmp_path_factory):
    pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
    from preproc.cli import main

    out = tmp_path_factory.mktemp("keys")
    rng = np.random.default_rng(0)
    rows = 400
    colour = rng.choice(["red", "blue", "pink"], rows)
    frame = pd.DataFrame({"id": np.arange(rows) * 7 + 3, "clicked": (rng.random(rows) < 0.4).astype(int),
                          "colour": colour, "x": rng.normal(size=rows).round(3)})
    frame.iloc[:300].to_csv(out / "table.csv", index=False)
    new = frame.iloc[300:].drop(columns="clicked")
    new.to_csv(out / "new.csv", index=False)
    (out / "cfg.yaml").write_text(yaml.safe_dump(CONFIG))
    assert main(["tabular", "run", "--input", str(out / "table.csv"), "--config", str(out / "cfg.yaml"),
                 "--output", str(out / "data"), "--num-files", "2"]) == 0
    assert main(["tabular", "apply", "--dataset", str(out / "data"), "--input", str(out / "new.csv"),
                 "--output", str(out / "new"), "--num-files", "2"]) == 0
    return out, frame


def _rows(directory, mapping):
    return pd.concat([pq.read_table(f).to_pandas() for f in sorted((directory / mapping).glob("*.parquet"))])


def test_every_file_holds_the_keys_as_they_are(applied):
    out, frame = applied
    by_id = frame.set_index(frame["id"].astype(str))
    mappings = ("train", "validation", "test")
    for directory, mapping in [(out / "data", m) for m in mappings] + [(out / "new", "test")]:
        got = _rows(directory, mapping)
        assert list(got.columns[-2:]) == ["key_id", "key_colour"]
        assert got["key_id"].is_unique
        # CSV keys are text, exactly as written; a key that is also a feature keeps its raw value
        assert (got["key_colour"].to_numpy() == by_id.loc[got["key_id"], "colour"].to_numpy()).all()
        assert got["colour"].dtype == np.int32          # the feature: its id
    # every row once, in one of the three mappings, with its own key
    keys = pd.concat([_rows(out / "data", m)["key_id"] for m in mappings]).astype(int)
    assert sorted(keys) == list(frame["id"][:300])
    assert sorted(_rows(out / "new", "test")["key_id"].astype(int)) == list(frame["id"][300:])
    spec = yaml.safe_load((out / "data" / "feature_spec.yaml").read_text())
    assert spec["metadata"]["keys"] == {"id": "key_id", "colour": "key_colour"}
    assert "key_id" not in spec["feature_spec"] and "labels" not in spec["metadata"]
    assert all("key_id" not in c["features"] for m in spec["source_spec"].values() for c in m)


def test_apply_without_the_label_writes_a_dataset_without_labels(applied):
    out, frame = applied
    got = _rows(out / "new", "test")
    assert (got["label"] == 0).all() and len(got) == 100
    for name in ("feature_spec.yaml", "feature_spec_dlrm.yaml", "feature_spec_wide_deep.yaml"):
        meta = yaml.safe_load((out / "new" / name).read_text())["metadata"]
        assert meta["labels"] is False and meta["keys"]["id"] == "key_id"


def test_apply_refuses_missing_keys_and_a_mix_of_labelled_files(applied, tmp_path, capsys):
    from preproc.cli import main

    out, frame = applied
    frame.iloc[300:].drop(columns="id").to_csv(tmp_path / "nokey.csv", index=False)
    assert main(["tabular", "apply", "--dataset", str(out / "data"), "--input", str(tmp_path / "nokey.csv"),
                 "--output", str(tmp_path / "o1")]) != 0
    assert "nokey.csv: has no column 'id' (named in" in capsys.readouterr().err
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    frame.iloc[300:350].to_csv(mixed / "a.csv", index=False)
    frame.iloc[350:].drop(columns="clicked").to_csv(mixed / "b.csv", index=False)
    assert main(["tabular", "apply", "--dataset", str(out / "data"), "--input", str(mixed),
                 "--output", str(tmp_path / "o2")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("b.csv: has no label column 'clicked', which " + str(mixed / "a.csv")
                            + " has: give rows with labels or rows without, not both"), err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
