"""Issue 45 section 2: `--run-mode evaluate` on your own table's datasets. It was refused on both
documented paths: on the dataset `preproc tabular apply` writes ("source_spec.train: mapping not in
spec (has test)": the model was built from a training batch) and on a small table's own dataset
("fewer than one batch of 131072 rows": evaluation read the training files at the reference batch,
which the small-data defaults had replaced for training only). A small table from CSV, trained
with Wide & Deep's defaults, is evaluated on its test split (the training run's last AUC, exactly)
and on new rows through the saved workflow."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import read_log, records, run_train, summary


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
    from preproc.cli import main

    out = tmp_path_factory.mktemp("own")
    rng = np.random.default_rng(0)
    rows = 400
    colour = rng.choice(["red", "blue", "pink"], rows)
    x = rng.normal(size=rows).round(3)
    clicked = (rng.random(rows) < np.where(colour == "red", 0.7, 0.2) + 0.05 * x).astype(int)
    frame = pd.DataFrame({"clicked": clicked, "colour": colour, "x": x})
    frame.iloc[:300].to_csv(out / "table.csv", index=False)
    frame.iloc[300:].to_csv(out / "new.csv", index=False)
    # no validation mapping (the old split): the training run's evaluations are the test rows'
    (out / "cfg.yaml").write_text(yaml.safe_dump({"label": "clicked", "categorical": ["colour"], "numerical": ["x"],
                                                  "split": {"validation_fraction": 0}}))
    assert main(["tabular", "run", "--input", str(out / "table.csv"), "--config", str(out / "cfg.yaml"),
                 "--output", str(out / "data")]) == 0
    assert main(["tabular", "apply", "--dataset", str(out / "data"), "--input", str(out / "new.csv"),
                 "--output", str(out / "new")]) == 0
    log = out / "train.jsonl"
    res = run_train(["--model", "wide_deep", "--data-path", out / "data", "--checkpoint-dir", out / "ck",
                     "--epochs", "2", "--log-path", log])
    assert res.returncode == 0, res.stderr[-3000:]
    recs = read_log(log)
    assert {r["mapping"] for r in records(recs, "eval")} == {"test"} and "test_eval" not in summary(recs)
    return out, recs


@pytest.mark.parametrize("dataset", ["data", "new"])
def test_evaluate_runs_on_the_tables_dataset_and_on_new_rows(trained, dataset):
    out, train_log = trained
    log = out / f"eval-{dataset}.jsonl"
    res = run_train(["--model", "wide_deep", "--data-path", out / dataset, "--checkpoint-dir", out / "ck",
                     "--run-mode", "evaluate", "--log-path", log])
    assert res.returncode == 0, res.stderr[-3000:]
    s = summary(read_log(log))
    best = json.loads((out / "ck" / "best.json").read_text())      # small-data defaults: --keep-best
    assert s["mode"] == "evaluate" and s["evaluated_checkpoint"].endswith(f"ckpt-{best['step']:010d}")
    assert 0 < s["auc"] < 1 and np.isfinite(s["bce"])
    if dataset == "data":        # the same weights on the same test rows: the training run's evaluation of them
        then = {r["step"]: r for r in records(train_log, "eval")}[best["step"]]
        assert s["auc"] == pytest.approx(then["auc"], abs=1e-9) and s["bce"] == pytest.approx(then["bce"], rel=1e-6)


@pytest.mark.parametrize("choice", ["best", "latest"])
def test_evaluate_uses_the_checkpoint_best_json_names_or_the_latest(trained, choice):
    """Issue 45 section 2: evaluation restored the newest checkpoint, never the best one the run
    reported. best.json is made to name a checkpoint that is not the newest (whichever step won),
    so the two choices differ; each reproduces the training run's evaluation of that step."""
    out, train_log = trained
    steps = sorted(int(p.name.split("-")[1]) for p in (out / "ck").glob("ckpt-*"))
    assert len(steps) >= 2, steps
    best = json.loads((out / "ck" / "best.json").read_text())
    if best["step"] == steps[-1]:
        best = {**best, "step": steps[0], "checkpoint": str(out / "ck" / f"ckpt-{steps[0]:010d}")}
        (out / "ck" / "best.json").write_text(json.dumps(best))
    log = out / f"eval-{choice}.jsonl"
    res = run_train(["--model", "wide_deep", "--data-path", out / "data", "--checkpoint-dir", out / "ck",
                     "--run-mode", "evaluate", "--evaluate-checkpoint", choice, "--log-path", log])
    assert res.returncode == 0, res.stderr[-3000:]
    step = best["step"] if choice == "best" else steps[-1]
    s = summary(read_log(log))
    assert s["evaluated_checkpoint"].endswith(f"ckpt-{step:010d}")
    then = {r["step"]: r for r in records(train_log, "eval")}[step]
    assert s["auc"] == pytest.approx(then["auc"], abs=1e-9)


def test_keep_best_without_a_checkpoint_dir_says_it_keeps_nothing(tmp_path):
    from recsys.configuration.train_config import TrainConfig
    from recsys.train import build_parser

    cfg = TrainConfig.from_args(build_parser().parse_args(["--model", "dlrm", "--synthetic", "--keep-best"]))
    assert dict(cfg.notes)["keep_best_without_checkpoints"].startswith(
        "warning: --keep-best keeps the best evaluation's checkpoint in --checkpoint-dir, and none is given")
    with_dir = TrainConfig.from_args(build_parser().parse_args(
        ["--model", "dlrm", "--synthetic", "--keep-best", "--checkpoint-dir", str(tmp_path / "ck")]))
    assert "keep_best_without_checkpoints" not in dict(with_dir.notes)
