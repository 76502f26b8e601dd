"""`--run-mode predict --predictions DIR` (issue 45 section 2): a checkpoint's score of every test row,
one parquet file per rank with the dataset's key columns, `file`, `row` and `score`.

A small table from CSV with a key column goes through `preproc tabular run` (two files per
mapping) and `tabular apply` on new rows without the label; Wide & Deep and DLRM are trained on
it. The predictions are checked row by row: every row of the test files exactly once, each key
the one stored in its (file, row), the scores of 1 and 2 ranks (mpirun; DLRM model-parallel in
lockstep, with ranks of unequal batch counts) equal, and the scores reproduce `--run-mode
evaluate`'s BCE of the same checkpoint (recomputed here in numpy) and its AUC (sklearn).
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from conftest import REPO, base_env, mpirun_cmd, read_log, run_train, summary, train_cmd

FLAGS = {"wide_deep": ["--model", "wide_deep", "--eval-batch-size", "16"],
         "dlrm": ["--model", "dlrm", "--eval-batch-size", "16", "--embedding-dim", "4", "--bottom-mlp", "8,4"]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
    from preproc.cli import main

    out = tmp_path_factory.mktemp("predict")
    rng = np.random.default_rng(1)
    rows = 600
    colour, shape = rng.choice(["red", "blue", "pink"], rows), rng.choice(["box", "ball"], rows)
    x = rng.normal(size=rows).round(3)
    clicked = (rng.random(rows) < np.where(colour == "red", 0.7, 0.2) + 0.1 * x).astype(int)
    frame = pd.DataFrame({"id": [f"u{i * 13}" for i in range(rows)], "clicked": clicked, "colour": colour,
                          "shape": shape, "x": x})
    frame.iloc[:500].to_csv(out / "table.csv", index=False)
    frame.iloc[500:].drop(columns="clicked").to_csv(out / "new.csv", index=False)
    (out / "cfg.yaml").write_text(yaml.safe_dump({"label": "clicked", "categorical": ["colour", "shape"],
                                                  "numerical": ["x"], "keys": ["id"]}))
    assert main(["tabular", "run", "--input", str(out / "table.csv"), "--config", str(out / "cfg.yaml"),
                 "--output", str(out / "data"), "--num-files", "2"]) == 0
    assert main(["tabular", "apply", "--dataset", str(out / "data"), "--input", str(out / "new.csv"),
                 "--output", str(out / "new"), "--num-files", "2"]) == 0
    for model in FLAGS:
        res = run_train([*FLAGS[model], "--feature-spec", out / "data" / f"feature_spec_{model}.yaml",
                         "--checkpoint-dir", out / f"ck-{model}", "--epochs", "2", "--log-path", out / f"{model}.jsonl"])
        assert res.returncode == 0, res.stderr[-3000:]
    return out, frame


def _spec(out, dataset, model):
    return out / dataset / f"feature_spec_{model}.yaml"


def _predict(out, model, dataset, name, ranks=1, extra=()):
    args = [*FLAGS[model], "--feature-spec", _spec(out, dataset, model), "--checkpoint-dir", out / f"ck-{model}",
            "--run-mode", "predict", "--predictions", out / name, "--log-path", out / f"{name}.jsonl", *extra]
    cmd = train_cmd(*args) if ranks == 1 else mpirun_cmd(ranks, train_cmd(*args))
    res = subprocess.run(cmd, env=base_env(), cwd=REPO, text=True, capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    s = summary(read_log(out / f"{name}.jsonl"))
    assert s["mode"] == "predict" and s["prediction_files"] == [f"part-{r:05d}.parquet" for r in range(ranks)]
    assert sorted(p.name for p in (out / name).iterdir()) == s["prediction_files"]     # no temporary left
    got = pd.concat([pq.read_table(out / name / f).to_pandas() for f in s["prediction_files"]], ignore_index=True)
    assert list(got.columns) == ["id", "file", "row", "score"] and s["predicted_rows"] == len(got)
    return got, s


def _stored(out, dataset):
    """Every row of the dataset's test files: (file, row) -> label, key."""
    spec = yaml.safe_load(_spec(out, dataset, "wide_deep").read_text())
    parts = []
    for f in spec["source_spec"]["test"][0]["files"]:
        t = pq.read_table(out / dataset / f, columns=["label", "key_id"]).to_pandas()
        parts.append(t.assign(file=f, row=np.arange(len(t))))
    return pd.concat(parts, ignore_index=True)


def _every_row_once(got, stored):
    assert not got.duplicated(["file", "row"]).any() and len(got) == len(stored)
    joined = got.merge(stored, on=["file", "row"], how="inner", validate="one_to_one")
    assert len(joined) == len(stored)
    assert (joined["id"] == joined["key_id"]).all()          # the key of the row the score is for
    return joined


@pytest.mark.parametrize("model", ["wide_deep", "dlrm"])
def test_predictions_of_one_and_two_ranks_score_every_row_once_and_reproduce_evaluate(trained, model):
    out, frame = trained
    stored = _stored(out, "data")
    one, s1 = _predict(out, model, "data", f"pred-{model}-1")
    joined = _every_row_once(one, stored)
    assert s1["evaluated_checkpoint"] and s1["world_size"] == 1
    log = out / f"eval-{model}.jsonl"
    res = run_train([*FLAGS[model], "--feature-spec", _spec(out, "data", model), "--checkpoint-dir",
                     out / f"ck-{model}", "--run-mode", "evaluate", "--log-path", log])
    assert res.returncode == 0, res.stderr[-3000:]
    ev = summary(read_log(log))
    assert ev["evaluated_checkpoint"] == s1["evaluated_checkpoint"]
    y, p = joined["label"].to_numpy(np.float64), np.clip(joined["score"].to_numpy(np.float64), 1e-7, 1 - 1e-7)
    bce = float(np.mean(-(y * np.log(p) + (1 - y) * np.log(1 - p))))
    assert bce == pytest.approx(ev["bce"], rel=1e-4)
    from sklearn.metrics import roc_auc_score
    assert roc_auc_score(y, p) == pytest.approx(ev["auc"], abs=2e-3)
    # two ranks (DLRM's tables model-parallel: every batch an alltoall, ranks in lockstep); each rank
    # reads one of the two test files, whose rows differ, so one rank feeds empty batches at the end
    extra = ["--embedding-placement", "model_parallel"] if model == "dlrm" else []
    two, s2 = _predict(out, model, "data", f"pred-{model}-2", ranks=2, extra=extra)
    _every_row_once(two, stored)
    assert s2["rows_per_file"] == [int((stored["file"] == f).sum()) for f in sorted(stored["file"].unique())]
    both = one.merge(two, on=["file", "row"], suffixes=("_1", "_2"))
    assert len(both) == len(one)
    np.testing.assert_allclose(both["score_1"], both["score_2"], rtol=1e-5, atol=1e-6)


def test_new_rows_without_labels_are_predicted_not_evaluated(trained):
    out, frame = trained
    got, s = _predict(out, "wide_deep", "new", "pred-new")
    _every_row_once(got, _stored(out, "new"))
    assert sorted(got["id"]) == sorted(frame["id"][500:]) and got["score"].between(0, 1).all()
    res = run_train([*FLAGS["wide_deep"], "--data-path", out / "new", "--checkpoint-dir", out / "ck-wide_deep",
                     "--run-mode", "evaluate"])
    assert res.returncode == 2
    assert res.stderr.strip().splitlines()[-1].endswith(
        "feature_spec.yaml: has no labels (new rows without the label column): use --run-mode predict")
    assert "tensorflow" not in res.stderr.lower()


@pytest.mark.fast
@pytest.mark.parametrize("flags, needle", [
    (["--model", "wide_deep", "--predictions", "{tmp}/p"], "--predictions needs --run-mode predict (the run mode is train)"),
    (["--model", "wide_deep", "--run-mode", "predict"], "--run-mode predict needs --predictions DIR"),
    (["--model", "ncf", "--run-mode", "predict", "--predictions", "{tmp}/p"], "NCF's test mapping is a ranking set"),
    (["--model", "wide_deep", "--run-mode", "predict", "--predictions", "{tmp}/full"], "--predictions {tmp}/full: not empty"),
    (["--model", "wide_deep", "--run-mode", "predict", "--predictions", "{tmp}/file"],
     "--predictions {tmp}/file: exists and is not a directory"),
])
def test_predict_flags_are_refused_in_one_line(tmp_path, flags, needle):
    from recsys.configuration.train_config import TrainConfig
    from recsys.errors import EngineError
    from recsys.train import build_parser

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "part-00000.parquet").write_text("")
    (tmp_path / "file").write_text("")
    (tmp_path / "ck" / "ckpt-0000000010").mkdir(parents=True)
    (tmp_path / "ck" / "ckpt-0000000010" / "meta.json").write_text("{}")
    argv = [f.format(tmp=tmp_path) for f in flags] + ["--synthetic", "--checkpoint-dir", str(tmp_path / "ck")]
    with pytest.raises(EngineError) as err:
        TrainConfig.from_args(build_parser().parse_args(argv))
    assert needle.format(tmp=tmp_path) in str(err.value) and "\n" not in str(err.value)


pytestmark = pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
