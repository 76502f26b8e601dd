"""MovieLens -> NCF preprocessing: exact outputs on hand-built ratings, generated data, bad input.

The hand-built file exercises, with ``--min-ratings 3``:
user 5  -> 5 rows, 4 distinct items: a duplicate (user 5, item 300) whose later
           copy (ts 500) ties with item 100 at ts 500: the larger original item
           id (300) is the test positive;
user 10 -> exactly 3 ratings: kept (threshold boundary);
user 20 -> 3 rows but only 2 distinct items after de-duplication: dropped;
user 7  -> 1 rating (item 5555 seen only here): dropped, and 5555 gets no index.
Dense ids: users 5 -> 0, 10 -> 1; items 42, 100, 300, 999, 7000 -> 0..4.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from preproc.errors import PreprocError
from preproc.movielens import pipeline as movielens

pytestmark = pytest.mark.spark

RATINGS = [  # user, item, rating, timestamp
    (5, 300, 3, 100), (5, 300, 4, 500), (5, 100, 5, 500), (5, 42, 2, 200), (5, 999, 1, 300),
    (10, 42, 1, 50), (10, 999, 5, 60), (10, 7000, 4, 70),
    (20, 42, 3, 10), (20, 42, 4, 20), (20, 100, 1, 30),
    (7, 5555, 3, 1),
]
EXPECTED_TRAIN = {(0, 0), (0, 1), (0, 3), (1, 0), (1, 3)}
EXPECTED_TEST = {(0, 2), (1, 4)}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def write_ratings(directory, fmt, rows, extra_lines=()):
    directory.mkdir(parents=True, exist_ok=True)
    if fmt == "ml-1m":
        path = directory / "ratings.dat"
        lines = [f"{u}::{i}::{r}::{t}" for u, i, r, t in rows]
    else:
        path = directory / "ratings.csv"
        lines = ["userId,movieId,rating,timestamp"] + [f"{u},{i},{r}.0,{t}" for u, i, r, t in rows]
    path.write_text("\n".join(lines + list(extra_lines)) + "\n")
    return path


def pairs(df):
    return set(zip(df["user"].tolist(), df["item"].tolist()))


@pytest.mark.parametrize("fmt", ["ml-1m", "ml-20m"])
def test_hand_built_exact_output(spark, tmp_path, fmt):
    write_ratings(tmp_path / "in", fmt, RATINGS)
    out = tmp_path / "out"
    spec = movielens.run(spark, str(tmp_path / "in"), str(out), min_ratings=3, num_files=1)
    train = pd.read_parquet(out / "train")
    test = pd.read_parquet(out / "test")
    assert pairs(train) == EXPECTED_TRAIN and len(train) == 5
    assert pairs(test) == EXPECTED_TEST and len(test) == 2
    assert set(train["label"]) == {1.0} and set(test["label"]) == {1.0}
    assert str(train["user"].dtype) == "int32" and str(train["label"].dtype) == "float32"
    assert spec["feature_spec"]["user"]["cardinality"] == 2
    assert spec["feature_spec"]["item"]["cardinality"] == 5
    assert spec["metadata"]["format"] == fmt
    assert spec["channel_spec"] == {"user_ch": ["user"], "item_ch": ["item"], "label_ch": ["label"]}


def test_threshold_boundary(spark, tmp_path):
    """min_ratings 4 keeps only user 5 (4 distinct items, duplicates not counted); 5 keeps nobody."""
    write_ratings(tmp_path / "in", "ml-1m", RATINGS)
    path, fmt = movielens.locate_ratings(str(tmp_path / "in"))
    ratings, _ = movielens.read_ratings(spark, path, fmt)
    train, test, n_users, n_items, _ = movielens.split_leave_last_out(ratings, min_ratings=3)
    assert (n_users, n_items) == (2, 5)
    train, test, n_users, n_items, _ = movielens.split_leave_last_out(ratings, min_ratings=4)
    assert (n_users, n_items) == (1, 4)  # user 5 only: items 42, 100, 300, 999 -> 0..3
    assert {(r.user, r.item) for r in test.collect()} == {(0, 2)}
    with pytest.raises(PreprocError, match="--min-ratings"):
        movielens.run(spark, str(tmp_path / "in"), str(tmp_path / "out"), min_ratings=5)
    assert not (tmp_path / "out").exists()


def test_bad_rows_counted_skipped_or_fatal(spark, tmp_path):
    write_ratings(tmp_path / "in", "ml-1m", RATINGS, extra_lines=["5::abc::3::100", "5::1::2", "10::1.5::3::9"])
    spec = movielens.run(spark, str(tmp_path / "in"), str(tmp_path / "out"), min_ratings=3)
    (report,) = spec["metadata"]["bad_rows"].values()
    assert report == {"bad_rows": 3, "rows": len(RATINGS) + 3}
    assert pairs(pd.read_parquet(tmp_path / "out" / "test")) == EXPECTED_TEST
    with pytest.raises(PreprocError, match="3 bad rows"):
        movielens.run(spark, str(tmp_path / "in"), str(tmp_path / "out2"), min_ratings=3, bad_rows="fatal")
    assert not (tmp_path / "out2").exists()


def test_test_negatives_exact_on_hand_built(spark, tmp_path):
    """2 negatives: user 0 has only 1 unseen item (7000) and leaves the test set; user 1 gets 100 and 300."""
    write_ratings(tmp_path / "in", "ml-1m", RATINGS)
    spec = movielens.run(spark, str(tmp_path / "in"), str(tmp_path / "out"), min_ratings=3, test_negatives=2)
    test = pd.read_parquet(tmp_path / "out" / "test")
    assert test["user"].tolist() == [1, 1, 1]
    assert test["label"].tolist() == [1.0, 0.0, 0.0]
    assert test["item"].iloc[0] == 4 and set(test["item"].iloc[1:]) == {1, 2}
    assert spec["metadata"]["test_samples_per_series"] == 3
    assert spec["metadata"]["users_without_full_test_series"] == 1


def test_generated_data_files_reader_and_training(spark, tmp_path):
    from preproc.movielens.generate import generate

    generate(str(tmp_path / "raw"), users=60, items=80, fmt="ml-20m", seed=2)
    out = tmp_path / "out"
    spec = movielens.run(spark, str(tmp_path / "raw"), str(out), num_files=2)
    assert spec["source_spec"]["train"][0]["files"] == ["train/part_00000.parquet", "train/part_00001.parquet"]
    train = pd.read_parquet(out / "train")
    n_users = spec["feature_spec"]["user"]["cardinality"]
    assert 0 < n_users <= 60
    assert set(train["user"]) == set(range(n_users))  # dense, every kept user has training rows
    assert train.groupby("user").size().min() >= 19  # >= 20 ratings, one left out
    for idx in range(2):  # a user's test positive lives in file user % 2
        part = pd.read_parquet(out / "test" / f"part_{idx:05d}.parquet")
        assert set(part["user"] % 2) == {idx}
    test = pd.read_parquet(out / "test")
    assert sorted(test["user"]) == list(range(n_users))
    assert not set(zip(test["user"], test["item"])) & set(zip(train["user"], train["item"]))

    pytest.importorskip("tensorflow")
    from recsys.data import make_dataset
    from recsys.features.spec import FeatureSpec

    fs = FeatureSpec.from_yaml(str(out))
    inputs, labels = next(iter(make_dataset(fs, "train", batch_size=16, rank=1, world_size=2)))
    assert inputs["user"].shape == (16,) and inputs["item"].shape == (16,) and labels.shape == (16, 1)
    assert int(max(inputs["item"].numpy())) < spec["feature_spec"]["item"]["cardinality"]

    if not os.path.exists(os.path.join(REPO, "recsys", "train.py")):
        pytest.skip("recsys.train (ENGINE) is not in this checkout")
    proc = subprocess.run([sys.executable, "-m", "recsys.train", "--model", "ncf", "--data-path", str(out),
                           "--max-steps", "5", "--batch-size", "64",
                           # 80 items: 100 distinct unseen negatives per user do not exist
                           "--valid-negative", "20"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "hr_at_10" in proc.stdout + proc.stderr


def run_cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "preproc", "movielens", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.parametrize("setup,args,message", [
    ("missing", ["--input", "{tmp}/nope"], "no such file"),
    ("empty", ["--input", "{tmp}/in/ratings.dat"], "empty"),
    ("header_only", ["--input", "{tmp}/in"], "no ratings"),
    ("wrong_header", ["--input", "{tmp}/in"], "expected the ml-20m header"),
    ("exists", ["--input", "{tmp}/in"], "pass --overwrite"),
    ("ok", ["--input", "{tmp}/in", "--num-files", "0"], "--num-files"),
])
def test_cli_bad_input_one_line_error_before_spark(tmp_path, setup, args, message):
    (tmp_path / "in").mkdir()
    if setup == "empty":
        (tmp_path / "in" / "ratings.dat").write_text("")
    elif setup == "header_only":
        (tmp_path / "in" / "ratings.csv").write_text("userId,movieId,rating,timestamp\n")
    elif setup == "wrong_header":
        (tmp_path / "in" / "ratings.csv").write_text("user,item\n1,2\n")
    else:
        write_ratings(tmp_path / "in", "ml-1m", RATINGS)
        if setup == "exists":
            (tmp_path / "out").mkdir()
    proc = run_cli("run", *[a.format(tmp=tmp_path) for a in args], "--output", str(tmp_path / "out"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and lines[0].startswith("preproc: error:"), proc.stderr
    assert "spark" not in proc.stderr.lower()


def test_cli_generate_and_dry_run(tmp_path):
    proc = run_cli("generate", "--out", str(tmp_path / "raw"), "--users", "30", "--items", "40", "--format", "ml-1m")
    assert proc.returncode == 0, proc.stderr
    lines = (tmp_path / "raw" / "ratings.dat").read_text().splitlines()
    assert len(lines) >= 30 * 5 and all(len(line.split("::")) == 4 for line in lines)
    proc = run_cli("run", "--input", str(tmp_path / "raw"), "--output", str(tmp_path / "out"), "--dry-run",
                   "--node-cores", "4", "--node-memory-gb", "8")
    assert proc.returncode == 0, proc.stderr
    assert "spark.master=local[4]" in proc.stdout and "# plan: movielens ml-1m" in proc.stdout
    assert not (tmp_path / "out").exists()


def test_validation_leaves_the_second_latest_out_and_test_negatives_skip_it(spark, tmp_path):
    """``--validation`` (issue 45: figures chosen on validation, test evaluated once): each user's second
    latest item is its validation positive, out of training; a stored test negative is never one of the
    user's items, the validation one included (user 0's only unseen item is 4)."""
    write_ratings(tmp_path / "in", "ml-1m", RATINGS)
    out = tmp_path / "out"
    spec = movielens.run(spark, str(tmp_path / "in"), str(out), min_ratings=3, num_files=1, test_negatives=1,
                         validation=True)
    train, held = pd.read_parquet(out / "train"), pd.read_parquet(out / "validation")
    test = pd.read_parquet(out / "test")
    assert pairs(train) == {(0, 3), (0, 0), (1, 0)} and len(train) == 3
    assert pairs(held) == {(0, 1), (1, 3)} and set(held["label"]) == {1.0}
    positives = test[test["label"] == 1.0]
    assert pairs(positives) == EXPECTED_TEST
    negatives = test[test["label"] == 0.0]
    assert dict(zip(negatives["user"], negatives["item"]))[0] == 4
    assert spec["source_spec"]["validation"][0]["files"] == ["validation/part_00000.parquet"]
    assert spec["metadata"]["rows"] == {"train": 3, "test": 4, "validation": 2}


def test_validation_run_judges_epochs_on_it_and_evaluates_test_once(spark, tmp_path):
    """An NCF run on a dataset with ``--validation``: its epoch evaluations read the validation mapping,
    and the test set is evaluated once, with the weights the validation chose (the summary's test_eval)."""
    import json

    from preproc.movielens.generate import generate

    generate(str(tmp_path / "raw"), users=60, items=80, fmt="ml-20m", seed=2)
    out = tmp_path / "out"
    movielens.run(spark, str(tmp_path / "raw"), str(out), num_files=1, validation=True)
    log = tmp_path / "log.jsonl"
    proc = subprocess.run([sys.executable, "-m", "recsys.train", "--model", "ncf", "--data-path", str(out),
                           "--epochs", "2", "--batch-size", "64", "--valid-negative", "20", "--log-path", str(log)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    evals = [r for r in records if r["type"] == "eval"]
    assert len(evals) == 2 and {r.get("mapping") for r in evals} == {"validation"}
    summary = [r for r in records if r["type"] == "summary"][-1]
    assert summary["test_eval"]["mapping"] == "test" and summary["test_eval"]["weights"] == "best"
    assert summary["test_eval"]["epoch"] == summary["best_eval"]["epoch"]
    assert 0.0 <= summary["test_eval"]["metrics"]["hr_at_10"] <= 1.0
