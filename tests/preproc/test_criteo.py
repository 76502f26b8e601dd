"""Criteo -> DLRM split-binary: exact outputs on a hand-built click log, in Spark local mode.

The hand-built log has 3 days (day_0, day_1 train; day_2 split into test and
validation) and is designed so that every rule is visible in a few rows: ids by
frequency with ties, global and per-column thresholds, missing and unseen
values, the numerical transform, the split of the last day and bad rows.
The pipeline runs here with our stricter rules (``STRICT``: dictionary over the
training days, input order, clamped numericals, one spec with three mappings);
the reference rules, the defaults, are pinned in test_criteo_reference.py.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from preproc.criteo import pipeline as criteo
from preproc.criteo.layout import NUM_CAT, NUM_INT, Rules, Staging, day_files, parse_thresholds
from preproc.dataio.output import input_files
from preproc.errors import PreprocError

pytestmark = pytest.mark.spark


def line(label, ints=None, cats=None):
    """One raw Criteo line: ``ints`` {index: value}, ``cats`` {index: value}; the rest empty."""
    ints, cats = ints or {}, cats or {}
    fields = [str(label)] + [str(ints.get(i, "")) for i in range(NUM_INT)]
    fields += [str(cats.get(i, "")) for i in range(NUM_CAT)]
    return "\t".join(fields)


# cat_0 over the training days: aaaa x3, bbbb x2, cccc x2, dddd x1 (+1 missing)
# cat_1 (threshold 1 by override): x1 once, x2 twice
# cat_2: 200 distinct values once each (threshold 0 by override) -> cardinality 201 -> int16
DAY0 = [line(1, {0: 5, 1: -3}, {0: "aaaa", 1: "x1", 2: "v000"}),
        line(0, {0: 0}, {0: "cccc", 1: "x2", 2: "v001"}),
        "1\t2\t3",  # bad: wrong field count
        line(0, {0: "abc"}, {0: "aaaa"}),  # bad: unparsable integer (its aaaa must not count)
        line(1, {}, {0: "bbbb", 1: "x2", 2: "v002"}),
        line(0, {2: 1000000}, {0: "aaaa", 2: "v003"})]
DAY1 = [line(0, {1: -1}, {0: "cccc", 2: "v004"}), line(1, {}, {0: "bbbb", 2: "v005"}),
        line(0, {}, {0: "dddd", 2: "v006"}), line(1, {}, {0: "aaaa", 2: "v007"})]
DAY1 += [line(i % 2, {}, {2: f"v{i:03d}"}) for i in range(8, 200)]  # cat_0 missing
# last day: 5 rows -> test = first 2, validation = last 3
DAY2 = [line(1, {0: 10}, {0: "aaaa"}), line(0, {}, {0: "eeee"}), line(1, {}, {0: "dddd", 1: "x1"}),
        line(0, {}, {0: "bbbb"}), line(1, {}, {0: "cccc"})]
THRESHOLDS = "2,cat_1:1,C3:0"
STRICT = Rules(dictionary_days="train", train_order="input", numerical="clamp", spec_layout="combined")


def write_days(directory: Path, days) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for d, rows in enumerate(days):
        (directory / f"day_{d}").write_text("\n".join(rows) + "\n")
    return directory


def read_bin(out: Path, mapping: str, name: str, dtype, width=1):
    array = np.fromfile(out / mapping / name, dtype=dtype)
    return array.reshape(-1, width) if width > 1 else array


@pytest.fixture(scope="module")
def hand_built(tmp_path_factory):
    return write_days(tmp_path_factory.mktemp("criteo_raw"), [DAY0, DAY1, DAY2])


def plan(input_dir, days=None):
    found = day_files(input_files(input_dir), days)
    return [(idx, day, path) for idx, (day, path) in enumerate(found)], found[-1][0]


@pytest.fixture(scope="module")
def run_output(spark, hand_built, tmp_path_factory):
    files, last_day = plan(hand_built)
    out = tmp_path_factory.mktemp("criteo_out") / "dataset"
    report = criteo.run(spark, files, last_day, parse_thresholds(THRESHOLDS), str(out), rules=STRICT)
    return out, report


def test_dictionary_ids_by_frequency_ties_threshold_and_missing(run_output):
    out, report = run_output
    # cat_0 train counts: aaaa 3, bbbb 2, cccc 2, dddd 1 -> T=2 keeps a=1, b=2, c=3 (tie by value), d -> 0
    cardinalities = report["cardinalities"]
    assert cardinalities[0] == 4
    assert cardinalities[1] == 3  # x2 (2x) = 1, x1 (1x) = 2: kept by the per-column threshold 1
    assert cardinalities[2] == 201  # threshold 0 keeps all 200 values of cat_2
    assert cardinalities[3:] == [1] * (NUM_CAT - 3)  # always missing
    train0 = read_bin(out, "train", "cat_0.bin", np.int8)
    # day_0 good rows: aaaa, cccc, bbbb, aaaa; day_1: cccc, bbbb, dddd, aaaa, then missing
    assert train0[:8].tolist() == [1, 3, 2, 1, 3, 2, 0, 1]
    assert set(train0[8:].tolist()) == {0}
    train1 = read_bin(out, "train", "cat_1.bin", np.int8)
    assert train1[:4].tolist() == [2, 1, 1, 0]
    # last day: eeee unseen in training -> 0, dddd below threshold -> 0
    assert read_bin(out, "test", "cat_0.bin", np.int8).tolist() == [1, 0]
    assert read_bin(out, "validation", "cat_0.bin", np.int8).tolist() == [0, 2, 3]
    assert read_bin(out, "validation", "cat_1.bin", np.int8).tolist() == [2, 0, 0]


def test_split_binary_dtypes_by_cardinality_and_feature_spec(run_output):
    from recsys.features.spec import FeatureSpec

    out, _ = run_output
    spec = FeatureSpec.from_yaml(str(out / "feature_spec.yaml"))
    rows = spec.validate()
    assert rows == {"train": 4 + 196, "test": 2, "validation": 3}
    assert spec.dtype("cat_0") == "int8" and spec.dtype("cat_2") == "int16" and spec.dtype("label") == "bool"
    assert spec.dtype("num_0") == "float16"
    assert spec.cardinalities("categorical")[:3] == [4, 3, 201]
    assert (out / "train" / "cat_2.bin").stat().st_size == 200 * 2
    assert (out / "train" / "numerical.bin").stat().st_size == 200 * NUM_INT * 2
    # cat_2 ids follow frequency (all 1) then value: v000 -> 1 ... in input order here
    assert read_bin(out, "train", "cat_2.bin", np.int16).tolist() == [1, 2, 3, 4] + list(range(5, 201))


def test_labels_and_test_validation_split_keep_input_order(run_output):
    out, _ = run_output
    good_day0 = [1, 0, 1, 0]
    day1 = [0, 1, 0, 1] + [i % 2 for i in range(8, 200)]
    assert read_bin(out, "train", "label.bin", np.bool_).astype(int).tolist() == good_day0 + day1
    assert read_bin(out, "test", "label.bin", np.bool_).astype(int).tolist() == [1, 0]
    assert read_bin(out, "validation", "label.bin", np.bool_).astype(int).tolist() == [1, 0, 1]


def test_numerical_transform_missing_negative_and_large(run_output):
    out, _ = run_output
    num = read_bin(out, "train", "numerical.bin", np.float16, NUM_INT).astype(np.float64)
    ln3 = math.log(3)
    assert num[0, 0] == pytest.approx(math.log(8), rel=1e-3)  # 5
    assert num[0, 1] == pytest.approx(ln3, rel=1e-3)  # -3 clamps to 0
    assert num[1, 0] == pytest.approx(ln3, rel=1e-3)  # 0
    assert num[3, 2] == pytest.approx(math.log(1000003), rel=1e-3)
    assert num[2, :].tolist() == pytest.approx([ln3] * NUM_INT, rel=1e-3)  # all missing
    assert num[4, 1] == pytest.approx(ln3, rel=1e-3)  # -1 clamps to 0
    test = read_bin(out, "test", "numerical.bin", np.float16, NUM_INT).astype(np.float64)
    assert test[0, 0] == pytest.approx(math.log(13), rel=1e-3)


def test_bad_rows_counted_per_file_and_size_report(run_output):
    out, report = run_output
    assert report["bad_rows"] == 2
    meta = json.loads((out / "dictionary" / "dictionary.json").read_text())
    per_file = {Path(k).name: v for k, v in meta["bad_rows"].items()}
    assert per_file["day_0"] == {"bad_rows": 2, "rows": 6}
    assert per_file["day_1"] == {"bad_rows": 0, "rows": 196}
    assert report["bytes"]["train"]["cat_2.bin"] == 400
    assert report["embedding_rows"]["chosen"] == 4 + 3 + 201 + 23
    assert report["embedding_rows"]["T=0"] == 5 + 3 + 201 + 23  # dddd kept at T=0
    assert report["embedding_gib_fp32"]["chosen"] == pytest.approx(231 * 128 * 4 / 2**30)
    assert "embedding tables" in (out / "size_report.txt").read_text()
    assert not Staging(out).root.exists()  # stages cleaned after publishing


def test_bad_rows_fatal_names_the_file_and_writes_nothing(spark, hand_built, tmp_path):
    files, last_day = plan(hand_built)
    out = tmp_path / "dataset"
    with pytest.raises(PreprocError, match=r"day_0: 2 bad rows"):
        criteo.run(spark, files, last_day, parse_thresholds("2"), str(out), bad_row_policy="fatal")
    assert not out.exists()
    assert not Staging(out).dictionary.exists()


def test_array_stages_match_single_run_and_rerun_is_safe(spark, hand_built, run_output, tmp_path):
    from preproc.criteo.dictionary import build_dictionary
    from preproc.criteo.finalize import finalize
    from preproc.criteo.transform import transform_shard

    reference, _ = run_output
    files, last_day = plan(hand_built)
    staging = Staging(tmp_path / "dataset")
    meta = build_dictionary(spark, staging, files, last_day, parse_thresholds(THRESHOLDS), "skip", STRICT)
    transform_shard(spark, staging, meta, 0, 2, "skip")
    first = {p.relative_to(staging.shards): p.read_bytes() for p in staging.shards.rglob("*.bin")}
    transform_shard(spark, staging, meta, 0, 2, "skip")  # re-run of a finished task: same bytes
    second = {p.relative_to(staging.shards): p.read_bytes() for p in staging.shards.rglob("*.bin")}
    assert first == second and first
    with pytest.raises(PreprocError, match="shard 1 of 2 missing"):
        finalize(staging, overwrite=False)
    transform_shard(spark, staging, meta, 1, 2, "skip")
    # a killed earlier writer left a temporary dir behind: the next writer removes it
    stale = staging.output.parent / f".{staging.output.name}.tmp-1-deadbeef"
    stale.mkdir()
    finalize(staging, overwrite=False, keep_stages=True)
    assert not stale.exists()
    for path in sorted(reference.rglob("*.bin")):
        if "dictionary" not in path.parts:
            assert path.read_bytes() == (staging.output / path.relative_to(reference)).read_bytes(), path
    with pytest.raises(PreprocError, match="output appeared while writing|pass --overwrite"):
        finalize(staging, overwrite=False, keep_stages=True)
    # a damaged shard is caught by verification (sizes vs rows), never trusted
    piece = next(staging.shards.rglob("cat_0.bin"))
    piece.write_bytes(piece.read_bytes()[:-1])
    with pytest.raises(PreprocError, match="verification failed"):
        finalize(staging, overwrite=True)
    assert (staging.output / "feature_spec.yaml").exists()  # the published dataset is untouched


def test_row_order_survives_many_splits_and_pieces(spark, hand_built, run_output, tmp_path, monkeypatch):
    """Small input splits (several per day file) and 16-row pieces give the same bytes."""
    from preproc.criteo import transform as criteo_transform

    reference, _ = run_output
    monkeypatch.setattr(criteo_transform, "PIECE_BITS", 4)
    previous = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "2048")
    try:
        files, last_day = plan(hand_built)
        out = tmp_path / "split"
        criteo.run(spark, files, last_day, parse_thresholds(THRESHOLDS), str(out), keep_stages=True, rules=STRICT)
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", previous)
    pieces = list(Path(f"{out}.stages").rglob("piece-*"))
    assert len(pieces) > 6  # several splits per file and several pieces per split
    for path in sorted(reference.glob("*/*.bin")):
        assert path.read_bytes() == (out / path.relative_to(reference)).read_bytes(), path


def test_fewer_days_option(spark, hand_built, tmp_path):
    files, last_day = plan(hand_built, days=2)  # day_0 train, day_1 split
    out = tmp_path / "two_days"
    report = criteo.run(spark, files, last_day, parse_thresholds("1"), str(out))
    assert report["rows"] == {"train": 4, "test": 98, "validation": 98}
    assert read_bin(out, "test", "label.bin", np.bool_).astype(int).tolist()[:4] == [0, 1, 0, 1]


def run_cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "preproc", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_one_line_errors_before_spark(tmp_path, hand_built):
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    (tmp_path / "zero").mkdir()
    (tmp_path / "zero" / "day_0").write_text("")
    existing = tmp_path / "exists"
    existing.mkdir()
    cases = [
        (["nosuch", "run"], "unknown dataset 'nosuch'"),
        (["criteo", "run", "--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o")],
         "no such file or directory"),
        (["criteo", "run", "--input", str(empty_dir), "--output", str(tmp_path / "o")], "holds no input files"),
        (["criteo", "run", "--input", str(tmp_path / "zero"), "--output", str(tmp_path / "o")], "is empty"),
        (["criteo", "run", "--input", str(hand_built), "--output", str(existing)], "pass --overwrite"),
        (["criteo", "dictionary", "--input", str(hand_built), "--output", str(tmp_path / "o"),
          "--threshold", "C99:3"], "unknown column 'C99'"),
        (["criteo", "run", "--input", str(hand_built), "--output", str(tmp_path / "o"), "--days", "1"],
         "--days: need at least 2 days"),
        (["criteo", "transform", "--output", str(tmp_path / "o"), "--shard", "3", "--num-shards", "2"],
         "--shard: 3 is not in 0..1"),
        (["criteo", "finalize", "--output", str(tmp_path / "o")], "no finished dictionary stage"),
    ]
    for args, message in cases:
        result = run_cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        lines = [x for x in result.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and message in lines[0], (args, result.stderr)
        assert "Spark" not in result.stderr


def test_dry_run_prints_configuration_and_plan(hand_built, tmp_path):
    result = run_cli("criteo", "run", "--input", str(hand_built), "--output", str(tmp_path / "o"),
                     "--node-cores", "8", "--node-memory-gb", "64", "--spark-master", "spark://n1:7077",
                     "--nodes", "2", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "spark.master=spark://n1:7077" in result.stdout
    assert "spark.executor.cores=5" in result.stdout
    assert "# last day 2 (day_2): first half test, second half validation" in result.stdout
    assert not (tmp_path / "o").exists()


def test_generator_layout_and_determinism(tmp_path):
    from preproc.criteo.generate import generate

    generate(tmp_path / "a", rows=3000, days=3, seed=7)
    generate(tmp_path / "b", rows=3000, days=3, seed=7)
    for d in range(3):
        assert (tmp_path / "a" / f"day_{d}").read_bytes() == (tmp_path / "b" / f"day_{d}").read_bytes()
    rows = (tmp_path / "a" / "day_0").read_text().splitlines()
    assert len(rows) == 1000
    fields = [r.split("\t") for r in rows]
    assert {len(f) for f in fields} == {40}
    assert {f[0] for f in fields} == {"0", "1"}
    assert any(f[1] == "" for f in fields) and any(f[-1] == "" for f in fields)  # missing values
    assert any(f[2].startswith("-") for f in fields)  # I2 negatives
    cats = [f[14] for f in fields]
    assert all(len(c) == 8 and int(c, 16) >= 0 for c in cats)
    counts = sorted(np.unique(cats, return_counts=True)[1], reverse=True)
    assert counts[0] > 10 * counts[len(counts) // 2]  # skewed (power-law) frequencies


def test_generated_data_trains(spark, tmp_path):
    """The reader loads the output and a short DLRM training run starts on it."""
    from preproc.criteo.generate import generate

    raw = tmp_path / "raw"
    generate(raw, rows=4000, days=2, seed=3)
    files, last_day = plan(raw)
    out = tmp_path / "dataset"
    criteo.run(spark, files, last_day, parse_thresholds("2"), str(out))
    pytest.importorskip("tensorflow")
    from recsys.data import make_reader

    reader = make_reader(str(out / "feature_spec.yaml"), "train", batch_size=256)
    inputs, labels = next(iter(reader.numpy_batches()))
    assert inputs["categorical"].shape == (256, NUM_CAT) and inputs["numerical"].shape == (256, NUM_INT)
    if not Path(__file__).parents[2].joinpath("recsys", "train.py").exists():
        pytest.skip("recsys.train not available yet")
    result = subprocess.run([sys.executable, "-m", "recsys.train", "--model", "dlrm", "--data-path", str(out),
                             "--max-steps", "5", "--batch-size", "128"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_dry_run_plans_the_nodes_given_without_input_jar_or_master(tmp_path):
    """Issue 15 item 5: a plan for a 4-node DGX-2 cluster from the flags alone (no input, no jar,
    no --spark-master here): the standalone layout, not one local executor with a huge driver."""
    result = run_cli("criteo", "run", "--input", str(tmp_path / "absent"), "--output", str(tmp_path / "o"),
                     "--dry-run", "--node-cores", "80", "--node-memory-gb", "1500", "--nodes", "4",
                     "--gpus-per-node", "16", "--rapids-jar", str(tmp_path / "rapids.jar"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "spark.master=spark://<first node of the job>:7077" in out
    assert "# mode=cluster-gpu executors_per_node=16 executor_cores=5" in out
    assert "spark.cores.max=320" in out and "spark.driver.memory=32g" in out   # 4 x 16 x 5; 32g, not 750g
    assert f"# input {tmp_path / 'absent'}: not here" in out
    assert not (tmp_path / "o").exists()


def test_dry_run_notes_an_existing_output_and_a_real_run_refuses_nodes_without_master(hand_built, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    result = run_cli("criteo", "run", "--input", str(hand_built), "--output", str(out), "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"# note: --output {out} exists: the run needs --overwrite" in result.stdout
    result = run_cli("criteo", "run", "--input", str(hand_built), "--output", str(tmp_path / "new"), "--nodes", "4")
    assert result.returncode == 2
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "--nodes: 4 nodes need a Spark standalone cluster" in lines[0], result.stderr
