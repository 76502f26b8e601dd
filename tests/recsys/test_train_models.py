"""Each model trains on tiny synthetic data: its loss falls and its metric beats a trivial predictor."""
import numpy as np
import pytest

from conftest import SMALL, read_log, records, run_train, summary

# Trivial predictors and the margin each trained model must beat them by.
# DLRM: a constant score has AUC 0.5. W&D: a constant score ranks the click last in
# every display (pessimistic ties): MAP@12 = mean(1/group size), computed from the data.
# NCF: a constant score never hits (pessimistic ties); a random one gets HR@10 = 10/101.
MARGIN = {"dlrm": 0.10, "wide_deep": 0.10, "ncf": 0.25}


def _constant_map12(data_dir):
    from recsys.data import make_reader
    from recsys.models import metrics
    ys, gs = [], []
    for inputs, y in make_reader(str(data_dir / "feature_spec.yaml"), "test", 4096).numpy_batches():
        ys.append(y.reshape(-1))
        gs.append(inputs["map"])
    y, g = np.concatenate(ys), np.concatenate(gs)
    return metrics.map_at_k(np.zeros_like(y), y, g, k=12)


@pytest.mark.parametrize("model,epochs,metric", [("dlrm", 2, "auc"), ("wide_deep", 2, "map_at_12"),
                                                 ("ncf", 3, "hr_at_10")])
def test_model_learns(model, epochs, metric, tiny_data, tmp_path):
    data = tiny_data(model)
    log_path = tmp_path / "log.jsonl"
    res = run_train(["--model", model, "--data-path", data, *SMALL[model], "--epochs", epochs,
                     "--log-path", log_path, "--log-every", "2", "--checkpoint-dir", tmp_path / "ck"])
    assert res.returncode == 0, res.stderr[-3000:]
    log = read_log(log_path)
    steps = records(log, "step")
    losses = [r["loss"] for r in steps]
    k = max(2, len(losses) // 4)
    assert np.mean(losses[-k:]) < np.mean(losses[:k]) - 0.01, losses
    trivial = {"dlrm": 0.5, "ncf": 10 / 101}.get(model) or _constant_map12(data)
    s = summary(log)
    assert s[metric] > trivial + MARGIN[model], (metric, s[metric], trivial)
    evals = records(log, "eval")
    assert [e["epoch"] for e in evals] == list(range(1, epochs + 1))
    # one checkpoint per epoch, the last at the final step
    ckpts = sorted(p.name for p in (tmp_path / "ck").glob("ckpt-*"))
    assert ckpts[-1] == f"ckpt-{s['step']:010d}"
