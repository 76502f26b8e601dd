"""`preproc tabular`: a user's table + YAML -> feature-spec dataset (NVTabular on CPU), its saved
workflow applied to new rows, and `recsys-submit preprocess --dataset tabular` on the local backend.

The config and split checks are pure (``fast``). The pipeline runs twice on a small generated
table (module fixtures, ~10 s each): CSV with a time split, a group column, a multi-hot column and
NCF channels; and parquet through ``recsys-submit --profile local`` with a random split by group.
"""
from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from preproc.errors import PreprocError
from preproc.tabular import split
from preproc.tabular.config import parse_config

REPO = Path(__file__).resolve().parents[2]
CONFIG = {
    "label": {"column": "clicked", "positive": ["yes"]},
    "categorical": ["user", "item", {"column": "color", "threshold": 2}],
    "multihot": [{"column": "tags", "separator": "|", "max_hotness": 2}],
    "numerical": ["price", {"column": "views", "transform": "log"}],
    "map": "session",
    "time": "ts",
    "missing_values": ["NA"],
    "models": ["wide_deep", "ncf"],
    "ncf": {"user": "user", "item": "item"},
}


def table(rows: int = 400, seed: int = 0) -> pd.DataFrame:
    """Clicks follow the colour; 'green' is seen once (rare), 'NA'/empty are missing colours; rows
    BAD (a missing label, an unparsable price) are bad rows."""
    rng = np.random.default_rng(seed)
    color = rng.choice(["red", "red", "red", "blue", "blue", "pink"], rows).astype(object)
    color[:3] = ["green", "NA", ""]
    clicked = np.where(rng.random(rows) < np.where(color == "red", 0.7, 0.2), "yes", "no").astype(object)
    clicked[3] = "NA"                                             # a missing label: a bad row
    tags = np.array(["a|b", "b", "", "c|a|b"], dtype=object)[rng.integers(0, 4, rows)]
    price = rng.normal(50, 10, rows).round(2).astype(object)
    price[5], price[6] = "NA", "abc"                              # missing; unparsable: a bad row
    return pd.DataFrame({"clicked": clicked, "user": rng.integers(0, 30, rows), "item": rng.integers(0, 20, rows),
                         "color": color, "tags": tags, "price": price, "views": rng.integers(-2, 1000, rows),
                         "session": rng.integers(0, 60, rows), "ts": np.arange(rows) // 4})


BAD = [3, 6]


def color_ids(train_raw: pd.DataFrame) -> dict:
    """The expected ids of ``color``: by descending training count, ties by value, kept when seen twice."""
    counts = train_raw["color"][~train_raw["color"].isin(["NA", ""])].value_counts()
    counts = counts[counts >= 2]
    order = sorted(counts.index, key=lambda c: (-counts[c], c))
    return {c: i + 1 for i, c in enumerate(order)}


def read_mapping(directory: Path, mapping: str) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(f) for f in sorted(glob.glob(str(directory / mapping / "*.parquet")))],
                     ignore_index=True)


# --- config and split: pure ----------------------------------------------------------------------
@pytest.mark.fast
def test_config_defaults_and_models():
    cfg = parse_config(CONFIG)
    assert cfg.split_method == "time" and cfg.test_fraction == 0.2 and cfg.models == ("wide_deep", "ncf")
    assert [c.threshold for c in cfg.categorical] == [1, 1, 2]
    plain = parse_config({"label": "y", "categorical": ["a"], "numerical": ["x"]})
    assert plain.models == ("wide_deep", "dlrm") and plain.split_method == "random"
    assert parse_config(plain.to_dict()) == plain                          # the saved tabular.yaml reads back


@pytest.mark.fast
@pytest.mark.parametrize("change,needle", [
    ({"label": None}, "label: required"),
    ({"colour": 1}, "colour: unknown key"),
    ({"numerical": [{"column": "price", "transform": "sqrt"}]}, "numerical[0].transform: 'sqrt'"),
    ({"models": ["dlrm"]}, "models: dlrm reads no multi-hot columns"),
    ({"ncf": {"user": "user", "item": "tags"}}, "ncf.item: 'tags' is not one of the categorical columns"),
    ({"split": {"method": "time", "test_fraction": 1.5}}, "split.test_fraction: must be a number in (0, 1)"),
    ({"map": "user"}, "user: column named twice"),
    ({"time": None, "split": {"method": "time"}}, "split.method: time needs a `time` column"),
])
def test_config_errors_name_the_key(change, needle):
    raw = {k: v for k, v in {**CONFIG, **change}.items() if v is not None}
    with pytest.raises(PreprocError) as err:
        parse_config(raw, "my.yaml")
    assert str(err.value).startswith("my.yaml: ") and needle in str(err.value)


@pytest.mark.fast
def test_split_rules():
    rows = np.arange(20000)
    test = split.random_test_rows(rows, seed=3, fraction=0.25)
    assert abs(test.mean() - 0.25) < 0.02
    assert (split.random_test_rows(rows[5000:7000], 3, 0.25) == test[5000:7000]).all()   # partition-independent
    assert (split.random_test_rows(rows, 4, 0.25) != test).any()                         # the seed matters
    groups = pd.Series(rows % 97)
    by_group = split.random_test_rows(rows, 3, 0.25, groups)
    assert pd.Series(by_group).groupby(groups).nunique().max() == 1                      # a group on one side
    counts = pd.Series([4, 4, 4, 4, 4], index=[10.0, 20.0, 30.0, 40.0, 50.0])
    assert split.time_cut(counts, 0.2) == 50.0 and split.time_cut(counts, 0.3) == 40.0   # ties go to test
    assert split.time_cut(pd.Series([9, 1], index=[1.0, 2.0]), 0.5) == 2.0               # keeps training rows
    assert split.time_values(pd.Series(["2024-01-02", None])).iloc[0] == 1704153600e9


# --- the pipeline --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def csv_run(tmp_path_factory):
    pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
    from preproc.tabular import nvt

    base = tmp_path_factory.mktemp("tabular")
    raw = table()
    raw.to_csv(base / "clicks.csv", index=False)
    report = nvt.run(str(base / "clicks.csv"), parse_config(CONFIG), str(base / "out"), num_files=2)
    return base, raw, report


def test_time_split_ids_statistics_and_specs(csv_run):
    from recsys.data import make_reader
    from recsys.features.spec import FeatureSpec

    base, raw, report = csv_run
    out = base / "out"
    train, test = read_mapping(out, "train"), read_mapping(out, "test")
    valid = read_mapping(out, "validation")
    assert report["rows"] == {"train": len(train), "test": len(test), "validation": len(valid)}
    assert len(train) + len(test) + len(valid) == len(raw) - 2
    assert report["bad_rows"] == 2
    good = raw.drop(index=BAD)
    meta = yaml.safe_load((out / "feature_spec.yaml").read_text())["metadata"]
    cut, validation_cut = meta["split"]["cut"], meta["split"]["validation_cut"]
    assert meta["rows"] == report["rows"] and set(meta["label_rate"]) == {"train", "test", "validation"}
    assert report["split"] == meta["split"] and meta["split"]["validation_fraction"] == 0.1
    assert (good["ts"] >= cut).sum() == len(test) and abs(len(test) / len(good) - 0.2) < 0.02
    # validation: the latest rows before the test cut, 0.1 of all; the rows of that window exactly
    window = good[(good["ts"] >= validation_cut) & (good["ts"] < cut)]
    assert validation_cut < cut and len(window) == len(valid) and abs(len(valid) / len(good) - 0.1) < 0.02
    assert np.allclose(np.sort(valid["views"]), np.sort(np.log1p(window["views"].clip(lower=0))), atol=1e-5)
    assert "map" in valid and valid["label"].tolist().count(1.0) == (window["clicked"] == "yes").sum()
    # ids: 1.. by training frequency; rare ('green', once < threshold 2), missing ('NA', '') -> 0
    train_raw = good[good["ts"] < validation_cut]          # fitted on the training rows only
    ids = color_ids(train_raw)
    assert report["cardinalities"]["color"] == len(ids) + 1
    rows = train_raw.index.to_numpy()                      # = row numbers: file k holds rows = k (mod 2)
    by_file = np.concatenate([rows[rows % 2 == k] for k in (0, 1)])
    assert train["color"].tolist() == [ids.get(c, 0) for c in raw["color"].loc[by_file]]
    # numericals: standard with the training mean/std (missing -> 0), log(1 + max(x, 0))
    price = pd.to_numeric(train_raw["price"], errors="coerce")
    got = train["price"].to_numpy()[np.argsort(by_file, kind="stable")]
    z = ((price - price.mean()) / price.std()).fillna(0).to_numpy()
    assert np.allclose(got, z, atol=1e-5)
    assert np.allclose(np.sort(train["views"]), np.sort(np.log1p(train_raw["views"].clip(lower=0))), atol=1e-5)
    assert train["tags"].map(len).max() == 2 and report["cardinalities"]["tags"] == 4   # a, b, c; cut to 2
    assert set(np.concatenate(train["tags"].to_list())) == {1, 2, 3}
    # a test group lives in one file, sorted; every spec reads
    for k in (0, 1):
        part = pd.read_parquet(out / "test" / f"part_{k:05d}.parquet")
        assert (part["map"] % 2 == k).all() and part["map"].is_monotonic_increasing
    for model, channel in (("wide_deep", "onehot_categorical"), ("ncf", "user_ch")):
        spec = FeatureSpec.from_yaml(str(out / f"feature_spec_{model}.yaml"))
        assert spec.validate() == report["rows"] and channel in spec.channel_spec
        inputs, labels = next(iter(make_reader(spec, "test", 64, drop_remainder=False).numpy_batches()))
        assert labels.shape == (64, 1)
    assert (out / "feature_spec.yaml").read_text() == (out / "feature_spec_wide_deep.yaml").read_text()


def test_saved_workflow_applies_to_new_rows(csv_run):
    from preproc.cli import main

    base, raw, _ = csv_run
    new = raw.iloc[100:140].copy()
    new.loc[new.index[0], "color"] = "violet"                          # unseen -> 0
    new.to_parquet(base / "new.parquet", index=False)
    assert main(["tabular", "apply", "--dataset", str(base / "out"), "--input", str(base / "new.parquet"),
                 "--output", str(base / "applied")]) == 0
    got = read_mapping(base / "applied", "test")
    assert len(got) == 40
    spec = yaml.safe_load((base / "applied" / "feature_spec_wide_deep.yaml").read_text())
    original = yaml.safe_load((base / "out" / "feature_spec_wide_deep.yaml").read_text())
    assert spec["feature_spec"] == original["feature_spec"]
    new = new.sort_values("session", kind="stable")                    # test rows are sorted by group
    assert got["map"].tolist() == new["session"].tolist()
    assert got["color"][(new["color"] == "violet").to_numpy()].tolist() == [0]
    cut = original["metadata"]["split"]["cut"]
    good = raw.drop(index=BAD)
    ids = color_ids(good[good["ts"] < original["metadata"]["split"]["validation_cut"]])
    assert got["color"].tolist() == [ids.get(c, 0) for c in new["color"]]


# --- recsys-submit preprocess --dataset tabular, local backend --------------------------------------
def test_recsys_submit_preprocess_tabular_local(tmp_path):
    pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
    data = tmp_path / "my data $HOME"                                 # a path that needs quoting
    data.mkdir()
    rows = table(300, seed=1).drop(columns=["ts", "price", "tags"])
    rows.assign(clicked=(rows["clicked"] == "yes").astype(int)).to_parquet(data / "rows.parquet", index=False)
    config = {"label": "clicked", "categorical": ["user", "item", "color"], "numerical": ["views"],
              "map": "session", "missing_values": ["NA", ""], "split": {"test_fraction": 0.3, "validation_fraction": 0.2, "seed": 5}}
    (data / "cfg.yaml").write_text(yaml.safe_dump(config))
    env = dict(os.environ, RECSYS_RUNS_DIR=str(tmp_path / "runs"))
    env.pop("SLURM_CONF", None)
    proc = subprocess.run([sys.executable, "-m", "jobs.cli", "preprocess", "--profile", "local", "--dataset",
                           "tabular", "--input", "rows.parquet", "--output", "out", "--time", "10", "--",
                           "--config", "cfg.yaml", "--num-files", "2"],
                          cwd=data, env=env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "COMPLETED" in proc.stdout
    spec = yaml.safe_load((data / "out" / "feature_spec.yaml").read_text())
    assert spec["metadata"]["models"] == ["wide_deep", "dlrm"] and spec["channel_spec"]["map"] == ["map"]
    train, test = read_mapping(data / "out", "train"), read_mapping(data / "out", "test")
    valid = read_mapping(data / "out", "validation")
    assert set(train.columns) == {"label", "views", "user", "item", "color"} and "map" in test
    assert abs(len(test) / (len(train) + len(test) + len(valid)) - 0.3) < 0.1
    assert not set(valid["map"]) & set(test["map"])           # a group on one side


def test_one_line_errors_before_any_work(tmp_path):
    from preproc.cli import main

    (tmp_path / "rows.csv").write_text("a,b\n1,2\n")
    (tmp_path / "cfg.yaml").write_text("label: a\ncategorical: [c]\n")
    assert main(["tabular", "run", "--input", str(tmp_path / "none.csv"), "--config", str(tmp_path / "cfg.yaml"),
                 "--output", str(tmp_path / "o")]) == 2
    pytest.importorskip("nvtabular")
    with pytest.raises(PreprocError, match=r"rows.csv: has no column 'c'"):
        from preproc.tabular import nvt
        nvt.run(str(tmp_path / "rows.csv"), parse_config({"label": "a", "categorical": ["c"]}), str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()


# --- the validation split (issue 45 section 2) ---------------------------------------------------
@pytest.mark.fast
def test_validation_fraction_config():
    cfg = parse_config({"label": "y", "numerical": ["x"]})
    assert cfg.validation_fraction == 0.1 and parse_config(cfg.to_dict()) == cfg
    assert parse_config({"label": "y", "numerical": ["x"], "split": {"validation_fraction": 0}}).validation_fraction == 0
    for bad, needle in (({"validation_fraction": 1.5}, "split.validation_fraction: must be a number in [0, 1)"),
                        ({"validation_fraction": "a"}, "split.validation_fraction: must be a number"),
                        ({"test_fraction": 0.5, "validation_fraction": 0.5},
                         "split.validation_fraction: test_fraction + validation_fraction must be below 1")):
        with pytest.raises(PreprocError, match=r"^my.yaml: ") as err:
            parse_config({"label": "y", "numerical": ["x"], "split": bad}, "my.yaml")
        assert needle in str(err.value)


@pytest.mark.fast
def test_validation_draw_is_independent_of_the_test_draw():
    rows = np.arange(40000)
    test = split.random_test_rows(rows, 3, 0.2)
    valid = split.random_validation_rows(rows, 3, 0.1, 0.2)
    assert abs((valid & ~test).mean() - 0.1) < 0.01                   # 0.1 of all rows, from the non-test ones
    assert abs(valid[test].mean() - valid[~test].mean()) < 0.015     # another salt: not the test draw again
    assert (split.random_validation_rows(rows[100:900], 3, 0.1, 0.2) == valid[100:900]).all()
    groups = pd.Series(rows % 101)
    by_group = split.random_validation_rows(rows, 3, 0.1, 0.2, groups)
    assert pd.Series(by_group).groupby(groups).nunique().max() == 1


@pytest.mark.parametrize("with_map", [False, True])
def test_random_validation_rows_are_the_hashed_training_rows(tmp_path, with_map):
    """Each row carries its number (a numerical column kept as is), so the three mappings can be
    compared with the split's own draw: disjoint, complete, the fractions asked for."""
    pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
    from preproc.tabular import nvt

    n = 3000
    rng = np.random.default_rng(1)
    rows = pd.DataFrame({"y": (rng.random(n) < 0.4).astype(int), "rowid": np.arange(n),
                         "c": rng.integers(0, 9, n), "g": rng.integers(0, 400, n)})
    rows.to_csv(tmp_path / "rows.csv", index=False)
    config = {"label": "y", "categorical": ["c"], "numerical": [{"column": "rowid", "transform": "none"}],
              "split": {"test_fraction": 0.2, "validation_fraction": 0.15, "seed": 7}}
    if with_map:
        config["map"] = "g"
    report = nvt.run(str(tmp_path / "rows.csv"), parse_config(config), str(tmp_path / "out"), num_files=2)
    got = {m: set(read_mapping(tmp_path / "out", m)["rowid"].astype(int)) for m in ("train", "test", "validation")}
    assert {m: len(v) for m, v in got.items()} == report["rows"]
    assert not (got["train"] & got["test"] or got["train"] & got["validation"] or got["test"] & got["validation"])
    assert got["train"] | got["test"] | got["validation"] == set(range(n))
    assert abs(len(got["validation"]) / n - 0.15) < (0.05 if with_map else 0.02)
    if not with_map:
        test = split.random_test_rows(np.arange(n), 7, 0.2)
        valid = split.random_validation_rows(np.arange(n), 7, 0.15, 0.2) & ~test
        assert got["test"] == set(np.flatnonzero(test)) and got["validation"] == set(np.flatnonzero(valid))
        return
    # by group: the stored group ids (test and validation files) drawn as the split draws them
    test_rows, valid_rows = (read_mapping(tmp_path / "out", m) for m in ("test", "validation"))
    assert split.random_test_rows(np.arange(len(test_rows)), 7, 0.2, test_rows["map"]).all()
    assert not split.random_test_rows(np.arange(len(valid_rows)), 7, 0.2, valid_rows["map"]).any()
    assert split.random_validation_rows(np.arange(len(valid_rows)), 7, 0.15, 0.2, valid_rows["map"]).all()
    assert not set(valid_rows["map"]) & set(test_rows["map"])


def test_validation_of_one_class_is_refused_naming_the_key(tmp_path):
    pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
    from preproc.tabular import nvt

    n = 200
    frame = pd.DataFrame({"y": [1, 0] * 80 + [1] * 40, "x": np.arange(n), "t": np.arange(n)})
    frame.loc[frame.index[-20:], "y"] = [0, 1] * 10             # the last rows (test) hold both classes
    frame.to_csv(tmp_path / "rows.csv", index=False)
    config = parse_config({"label": "y", "numerical": ["x"], "time": "t",
                           "split": {"test_fraction": 0.1, "validation_fraction": 0.1}}, "my.yaml")
    with pytest.raises(PreprocError, match=r"^validation: all 20 rows have label 1: .*split.validation_fraction"):
        nvt.run(str(tmp_path / "rows.csv"), config, str(tmp_path / "o"))
    assert not (tmp_path / "o").exists()
