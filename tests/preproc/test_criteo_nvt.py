"""Criteo with ``--engine nvtabular`` against the Spark pipeline on the same generated days.

Both engines run in-process on the same raw days (3 days, 3000 rows, a few bad
lines added, mixed per-column thresholds) and must give the same dataset: the
same rows per mapping in the same order (the split; training rows in the
seeded shuffle order, or input order), the same labels, the same categorical
ids (NVTabular's vocabularies are put in the reference order after fitting),
and numericals equal within float16 rounding (Spark stores float16, parquet has
no float16 so NVTabular stores float32; the float32 values rounded to float16
equal Spark's). The inherent differences are pinned: the NVTabular output is
parquet (label int8, numericals float32) where Spark writes split-binary (bool,
float16). The workflow saved next to the data re-applied to raw rows gives the
stored ids. Bad input fails with one line and exit 2 before any work.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from preproc.criteo import pipeline as criteo
from preproc.criteo.generate import generate
from preproc.criteo.layout import (CAT_FEATURES, INT_FEATURES, MAPPINGS, VALIDATION_SPEC, Rules, day_files,
                                   parse_thresholds)
from preproc.dataio.output import input_files

pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
pytestmark = pytest.mark.spark
REPO = Path(__file__).resolve().parents[2]
THRESHOLDS = "2,C3:0,cat_5:5"
STRICT = Rules(dictionary_days="train", train_order="input", numerical="clamp", spec_layout="combined")
# wrong field count, unparsable integer, label not 0/1, integer outside int64 (40 fields each but the first)
BAD_LINES = ["1\t2\t3", "0\tabc" + "\t" * 38, "7" + "\t" * 39, "1\t99999999999999999999" + "\t" * 38]


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    base = tmp_path_factory.mktemp("criteo_nvt")
    generate(base / "raw", rows=3000, days=3, seed=11)
    for day, position in ((0, 17), (2, 400)):  # bad lines in a training day and in the test half of the last day
        path = base / "raw" / f"day_{day}"
        lines = path.read_text().splitlines()
        path.write_text("\n".join(lines[:position] + BAD_LINES + lines[position:]) + "\n")
    return base


def _files(raw_dir):
    found = day_files(input_files(raw_dir))
    return [(idx, day, path) for idx, (day, path) in enumerate(found)], found[-1][0]


def read_spark(out: Path, mapping: str) -> dict:
    from recsys.features.spec import FeatureSpec

    spec = FeatureSpec.from_yaml(str(out / "feature_spec.yaml"))
    if mapping not in spec.mappings():
        spec = FeatureSpec.from_yaml(str(out / VALIDATION_SPEC))
    data = {"label": np.fromfile(out / mapping / "label.bin", dtype=np.bool_).astype(np.int8)}
    data["num"] = np.fromfile(out / mapping / "numerical.bin", dtype=np.float16).reshape(-1, len(INT_FEATURES))
    data["cat"] = np.stack([np.fromfile(out / mapping / f"{c}.bin", dtype=spec.dtype(c)).astype(np.int64)
                            for c in CAT_FEATURES], axis=1)
    return data


def read_nvt(out: Path, mapping: str) -> dict:
    import pyarrow.parquet as pq

    parts = sorted((out / mapping).glob("part_*.parquet"))
    table = pq.read_table(parts[0]) if len(parts) == 1 else __import__("pyarrow").concat_tables(
        [pq.read_table(p) for p in parts])
    frame = table.to_pandas()
    return {"label": frame["label"].to_numpy(), "num": frame[INT_FEATURES].to_numpy(),
            "cat": frame[CAT_FEATURES].to_numpy().astype(np.int64), "dtypes": dict(frame.dtypes.astype(str))}


@pytest.mark.parametrize("rules", [Rules(), STRICT], ids=["reference", "strict"])
def test_nvtabular_equals_spark(spark, raw, rules, monkeypatch):
    from preproc.criteo import layout as criteo_layout, nvt as criteo_nvt
    from recsys.features.spec import FeatureSpec

    # 3 shuffle buckets for the 2000 training rows (one per 2**21 rows on real data), in both engines
    monkeypatch.setattr(criteo_layout, "SHUFFLE_BUCKET_ROWS", 700)
    files, last_day = _files(raw / "raw")
    thresholds = parse_thresholds(THRESHOLDS)
    tag = "ref" if rules == Rules() else "strict"
    spark_out, nvt_out = raw / f"spark-{tag}", raw / f"nvt-{tag}"
    spark_report = criteo.run(spark, files, last_day, thresholds, str(spark_out), rules=rules)
    nvt_report = criteo_nvt.run(files, last_day, thresholds, str(nvt_out), rules=rules, part_rows=700)

    assert nvt_report["cardinalities"] == spark_report["cardinalities"]
    assert nvt_report["rows"] == spark_report["rows"] and sum(nvt_report["rows"].values()) == 3000
    assert nvt_report["bad_rows"] == spark_report["bad_rows"] == 2 * len(BAD_LINES)
    for mapping in MAPPINGS:
        s, n = read_spark(spark_out, mapping), read_nvt(nvt_out, mapping)
        np.testing.assert_array_equal(n["label"], s["label"], err_msg=mapping)
        np.testing.assert_array_equal(n["cat"], s["cat"], err_msg=mapping)
        # float32 here, float16 there: the same value once rounded to float16
        np.testing.assert_allclose(n["num"].astype(np.float16).astype(np.float32), s["num"].astype(np.float32),
                                   rtol=1e-3, atol=1e-3, err_msg=mapping)
        # pinned inherent differences: parquet dtypes
        assert n["dtypes"]["label"] == "int8" and n["dtypes"]["num_0"] == "float32"
    # 2000 train rows, --part-rows 700: one file per shuffle bucket (3, about 667 rows each);
    # input order: 2 days x (700 + 300)
    assert len(list((nvt_out / "train").glob("part_*.parquet"))) == (3 if rules.train_order == "shuffle" else 4)
    specs = ["feature_spec.yaml"] + ([VALIDATION_SPEC] if rules.spec_layout == "reference" else [])
    rows = {}
    for name in specs:
        spec = FeatureSpec.from_yaml(str(nvt_out / name))
        rows.update(spec.validate())
        assert {c["type"] for m in spec.mappings() for c in spec.chunks(m)} == {"parquet"}
    assert rows == nvt_report["rows"]


def test_saved_workflow_reapplies_to_raw_rows(raw):
    """The fitted workflow in <output>/workflow turns raw test-day rows into the stored ids."""
    import pandas as pd
    import nvtabular as nvt
    from merlin.io import Dataset

    from preproc.criteo import nvt as criteo_nvt

    out = raw / "nvt-ref"
    if not out.exists():
        files, last_day = _files(raw / "raw")
        criteo_nvt.run(files, last_day, parse_thresholds(THRESHOLDS), str(out))
    workflow = nvt.Workflow.load(str(out / criteo_nvt.WORKFLOW_DIR))
    block = criteo_nvt.blocks([(2, 2, raw / "raw" / "day_2")])[0]
    frame = criteo_nvt.parse_block(block, 0, 2, 10**9, False, 0, 1)
    frame = frame[~frame["bad"]].head(300)
    features = frame[["label"] + INT_FEATURES + CAT_FEATURES].reset_index(drop=True)
    again = workflow.transform(Dataset(features, cpu=True)).to_ddf().compute()
    stored = read_nvt(out, "test")
    np.testing.assert_array_equal(again[CAT_FEATURES].to_numpy().astype(np.int64), stored["cat"][:300])
    np.testing.assert_allclose(again[INT_FEATURES].to_numpy(), stored["num"][:300], rtol=0, atol=0)
    assert isinstance(again, pd.DataFrame)


def _cli(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "preproc", "criteo", "run", "--engine", "nvtabular", *args],
                          capture_output=True, text=True, cwd=str(cwd), timeout=120)


@pytest.mark.parametrize("case", ["missing-input", "output-exists", "gpu-without-gpu", "part-rows"])
def test_bad_input_one_line_exit_2(raw, tmp_path, case):
    out = tmp_path / "out"
    args = {"missing-input": ["--input", str(tmp_path / "nope"), "--output", str(out)],
            "output-exists": ["--input", str(raw / "raw"), "--output", str(raw / "raw")],
            "gpu-without-gpu": ["--input", str(raw / "raw"), "--output", str(out), "--device", "gpu"],
            "part-rows": ["--input", str(raw / "raw"), "--output", str(out), "--part-rows", "0"]}[case]
    env_case = case == "gpu-without-gpu"
    result = subprocess.run([sys.executable, "-m", "preproc", "criteo", "run", "--engine", "nvtabular", *args],
                            capture_output=True, text=True, cwd=str(REPO), timeout=120,
                            env={**__import__("os").environ, **({"CUDA_VISIBLE_DEVICES": ""} if env_case else {})})
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("preproc: error:")]
    assert len(errors) == 1, result.stderr
    flag = {"missing-input": "--input", "output-exists": "--output", "gpu-without-gpu": "--device",
            "part-rows": "--part-rows"}[case]
    assert flag in errors[0]
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))


@pytest.mark.parametrize("device,gpus,cudf,scheduler,cluster_gpus,mode,cpu", [
    ("auto", 0, False, None, 0, "cpu", True),
    ("auto", 2, True, None, 0, "gpu", False),      # a GPU node: one dask-cuda worker per GPU
    ("auto", 2, False, None, 0, "cpu", True),      # GPUs but no cudf: pandas
    ("cpu", 4, True, None, 0, "cpu", True),
    ("auto", 0, False, "/s.json", 0, "multinode", True),
    ("auto", 0, False, "/s.json", 8, "multinode", False),
    ("cpu", 0, False, "/s.json", 8, "multinode", True),
])
def test_runtime_selection(device, gpus, cudf, scheduler, cluster_gpus, mode, cpu):
    from preproc.runtime.dask_cluster import choose_runtime

    runtime = choose_runtime(device, gpus, 16, cudf, scheduler_file=scheduler, cluster_gpus=cluster_gpus)
    assert (runtime.mode, runtime.cpu) == (mode, cpu)
    if mode == "gpu":
        assert runtime.workers == gpus and runtime.threads_per_worker == 1


@pytest.mark.parametrize("device,gpus,cudf,scheduler,needle", [
    ("gpu", 0, False, None, "no GPU visible"), ("gpu", 1, False, None, "cudf"),
    ("gpu", 0, False, "/s.json", "no GPUs"), ("tpu", 0, False, None, "--device")])
def test_runtime_refusals(device, gpus, cudf, scheduler, needle):
    from preproc.errors import PreprocError
    from preproc.runtime.dask_cluster import choose_runtime

    with pytest.raises(PreprocError, match=needle):
        choose_runtime(device, gpus, 4, cudf, scheduler_file=scheduler)


def test_visible_gpus_from_environment():
    from preproc.runtime.dask_cluster import visible_gpus

    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1,3"}) == 3
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == 0


def test_dry_run_prints_the_nvtabular_plan_with_or_without_input(tmp_path):
    """A dry run of the NVTabular engine prints its runtime, thresholds and files; a missing input is noted."""
    raw = tmp_path / "raw"
    generate(raw, rows=900, days=3, seed=0)
    here = _cli("--input", str(raw), "--output", str(tmp_path / "o"), "--threshold", "2", "--dry-run")
    assert here.returncode == 0, here.stderr[-2000:]
    assert "engine nvtabular:" in here.stdout
    assert "last day 2 (day_2): first half test, second half validation" in here.stdout
    absent = _cli("--input", str(tmp_path / "absent"), "--output", str(tmp_path / "o"), "--dry-run")
    assert absent.returncode == 0, absent.stderr[-2000:]
    assert f"input {tmp_path / 'absent'}: not here" in absent.stdout
    assert not (tmp_path / "o").exists()
