"""The engine's console summary line (recsys.monitoring.logger.short_summary)."""
import pytest

pytestmark = pytest.mark.fast


def test_the_console_summary_is_short_and_says_why_the_run_stopped():
    """Issue 45 section 2: the console's summary is one short line for a person; the full record
    stays the JSON log's (it was 1,100 characters of Python reprs)."""
    from recsys.monitoring.logger import short_summary

    record = {"mode": "train", "model": "dlrm", "world_size": 2, "step": 80, "epoch": 5, "eval_step": 80,
              "auc": 0.71234567, "bce": 0.45, "final_loss": 0.44321, "throughput_samples_per_s": 51234.5,
              "mean_step_time_ms": 9.99, "interrupted": False,
              "best_eval": {"metric": "auc", "value": 0.7201, "step": 48, "epoch": 3, "checkpoint": "c"},
              "early_stopped": {"step": 80, "epoch": 5, "patience": 2}, "provenance": {"python": "3.11"}}
    line = short_summary(record, "full record: log.jsonl")
    assert line == ("dlrm train on 2 ranks, step 80 epoch 5: early stop at epoch 5 step 80 (patience 2); last eval "
                    "(step 80): auc 0.71235 bce 0.45000; best auc 0.72010 at epoch 3 step 48; final loss 0.44321; "
                    "51,234 samples/s, 9.99 ms/step; full record: log.jsonl")
    assert "every step done" in short_summary({**record, "early_stopped": None})
    assert "interrupted" in short_summary({**record, "interrupted": True})
    assert short_summary({"mode": "evaluate", "model": "ncf", "world_size": 1, "evaluated_checkpoint": "ck/ckpt-9",
                          "step": 9, "epoch": 1}).endswith(": evaluated ck/ckpt-9")


def test_the_console_summary_shows_the_one_test_evaluation():
    """Issue 45 section 2: a run judged on a validation split says so, and shows its test figure."""
    from recsys.monitoring.logger import short_summary

    record = {"mode": "train", "model": "wide_deep", "world_size": 1, "step": 40, "epoch": 4, "eval_step": 40,
              "auc": 0.7, "bce": 0.5, "interrupted": False, "early_stopped": None,
              "best_eval": {"metric": "auc", "value": 0.72, "step": 20, "epoch": 2, "checkpoint": None},
              "test_eval": {"mapping": "test", "weights": "best", "step": 20, "epoch": 2,
                            "metrics": {"auc": 0.7123456, "bce": 0.51}}}
    assert short_summary(record) == (
        "wide_deep train on 1 rank, step 40 epoch 4: every step done; last validation eval (step 40): auc 0.70000 "
        "bce 0.50000; best validation auc 0.72000 at epoch 2 step 20; test (best weights, step 20): auc 0.71235 "
        "bce 0.51000")
    assert "test (" not in short_summary({**record, "test_eval": None})
