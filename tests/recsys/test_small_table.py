"""Issue 45 section 2: a tiny table trains past its warm-up. Breast cancer (569 rows, the copy inside
scikit-learn's wheel) made 3 steps an epoch at the small-data batch of 128, and the early stop, one
evaluation an epoch, ended the run during the learning rate's warm-up, after 9 steps, at AUC 0.9913
(0.9990 trained on). Now an epoch keeps at least 16 steps (a smaller batch), and the patience counts
from the warm-up's end."""
from __future__ import annotations

import pytest
import yaml

from conftest import read_log, records, run_train, summary
from recsys.checkpoints.atomic import BestEvaluation
from recsys.models.defaults import SMALL_DATA_MIN_STEPS_PER_EPOCH, small_data_batch


@pytest.mark.fast
@pytest.mark.parametrize("samples, ranks", [(455, 1), (240, 1), (100, 1), (455, 2), (26048, 1), (495285, 1)])
def test_an_epoch_of_a_small_table_keeps_its_steps(samples, ranks):
    batch = small_data_batch(samples, ranks)
    assert samples // batch >= SMALL_DATA_MIN_STEPS_PER_EPOCH and batch % ranks == 0
    if samples >= 128 * 16:                    # larger tables keep the batch they had
        assert batch == {26048: 128, 495285: 2048}[samples]


@pytest.mark.fast
def test_evaluations_inside_the_warm_up_are_judged_but_not_counted():
    best = BestEvaluation("auc", patience=2)
    best.update(10, 1, {"auc": 0.9}, counting=False)
    best.update(20, 2, {"auc": 0.8}, counting=False)      # worse, but still warming up
    assert best.since_best == 0 and not best.stop and best.value == 0.9
    best.update(30, 3, {"auc": 0.85})
    best.update(40, 4, {"auc": 0.85})
    assert best.since_best == 2 and best.stop and best.step == 10


def test_breast_cancer_trains_past_its_warm_up(tmp_path):
    sklearn = pytest.importorskip("sklearn.datasets", reason="scikit-learn is part of [dev]")
    pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
    from preproc.cli import main

    frame = sklearn.load_breast_cancer(as_frame=True).frame
    frame.columns = [c.replace(" ", "_") for c in frame.columns]
    frame.to_csv(tmp_path / "bc.csv", index=False)
    (tmp_path / "bc.yaml").write_text(yaml.safe_dump({"label": "target",
                                                      "numerical": [c for c in frame.columns if c != "target"]}))
    assert main(["tabular", "run", "--input", str(tmp_path / "bc.csv"), "--config", str(tmp_path / "bc.yaml"),
                 "--output", str(tmp_path / "data")]) == 0
    log = tmp_path / "bc.jsonl"
    res = run_train(["--model", "wide_deep", "--data-path", tmp_path / "data", "--log-path", log])
    assert res.returncode == 0, res.stderr[-3000:]
    assert "small-data defaults: --batch-size 16 " in res.stderr
    recs = read_log(log)
    evals = [r["step"] for r in records(recs, "eval")]
    per_epoch = evals[0]                       # one evaluation at each epoch's end, the first at its steps
    assert per_epoch >= SMALL_DATA_MIN_STEPS_PER_EPOCH
    s = summary(recs)
    # the deep part warms up for one epoch: no stop can come before two evaluations after it
    assert s["early_stopped"] is None or s["early_stopped"]["step"] >= 3 * per_epoch
    assert s["best_eval"]["value"] > 0.99, s["best_eval"]
