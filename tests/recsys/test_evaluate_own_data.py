"""Issue 45 section 2: `--run-mode evaluate` on your own table's datasets. It was refused on both
documented paths: on the dataset `preproc tabular apply` writes ("source_spec.train: mapping not in
spec (has test)": the model was built from a training batch) and on a small table's own dataset
("fewer than one batch of 131072 rows": evaluation read the training files at the reference batch,
which the small-data defaults had replaced for training only). A small table from CSV, trained
with Wide & Deep's defaults, is evaluated on its test split (the training run's last AUC, exactly)
and on new rows through the saved workflow."""
from __future__ import annotations

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
    (out / "cfg.yaml").write_text(yaml.safe_dump({"label": "clicked", "categorical": ["colour"], "numerical": ["x"]}))
    assert main(["tabular", "run", "--input", str(out / "table.csv"), "--config", str(out / "cfg.yaml"),
                 "--output", str(out / "data")]) == 0
    assert main(["tabular", "apply", "--dataset", str(out / "data"), "--input", str(out / "new.csv"),
                 "--output", str(out / "new")]) == 0
    log = out / "train.jsonl"
    res = run_train(["--model", "wide_deep", "--data-path", out / "data", "--checkpoint-dir", out / "ck",
                     "--epochs", "2", "--log-path", log])
    assert res.returncode == 0, res.stderr[-3000:]
    return out, read_log(log)


@pytest.mark.parametrize("dataset", ["data", "new"])
def test_evaluate_runs_on_the_tables_dataset_and_on_new_rows(trained, dataset):
    out, train_log = trained
    log = out / f"eval-{dataset}.jsonl"
    res = run_train(["--model", "wide_deep", "--data-path", out / dataset, "--checkpoint-dir", out / "ck",
                     "--run-mode", "evaluate", "--log-path", log])
    assert res.returncode == 0, res.stderr[-3000:]
    s = summary(read_log(log))
    assert s["mode"] == "evaluate" and s["evaluated_checkpoint"].endswith(f"ckpt-{summary(train_log)['step']:010d}")
    assert 0 < s["auc"] < 1 and np.isfinite(s["bce"])
    if dataset == "data":        # the same weights on the same test rows: the training run's last evaluation
        last = records(train_log, "eval")[-1]
        assert s["auc"] == pytest.approx(last["auc"], abs=1e-9) and s["bce"] == pytest.approx(last["bce"], rel=1e-6)
