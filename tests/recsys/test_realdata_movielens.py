"""Real data: MovieLens-100k through ``preproc movielens`` and NCF with default settings, held to the
standard implicit-feedback baselines of the `implicit` library on the same split.

MovieLens-100k is read out of the ``recbole==1.2.1`` wheel (tests/realdata.py: downloaded once into
the cache, never installed), rewritten in the ml-1m layout, preprocessed by ``python -m preproc
movielens run`` with 100 stored test negatives per user and each user's second latest item held out
as its validation positive (``--validation``), and trained by ``recsys.train --model ncf`` with no
hyper-parameter flag: the small-data defaults apply (recsys.models.defaults), the early stop and the
best epoch chosen on validation, the test set evaluated once with that epoch's weights. The baselines
(tests/realdata.py, the same code as docs/data.md's table, ``python tests/realdata_figures.py``) train
on the same interactions and use the same 100 negatives per user. Measured (docs/data.md): NCF's test
figure is ahead of `implicit`'s BPR and of item popularity, and behind `implicit`'s ALS by 0.005 HR@10
and 0.006 NDCG@10; the test holds it to that, never above ALS.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, base_env, read_log, records, summary

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import realdata  # noqa: E402

pytestmark = pytest.mark.spark
# NCF's HR@10 / NDCG@10 may fall this far below `implicit`'s ALS (measured: 0.024 / 0.012 below).
ALS_TOLERANCE = (0.05, 0.025)


def test_movielens_100k_ncf_defaults_against_implicit_feedback_baselines(tmp_path):
    pytest.importorskip("implicit", reason="the `implicit` library is not installed (pip install .[dev])")
    raw = realdata.ml1m_ratings(tmp_path / "raw")
    data = tmp_path / "ncf"
    env = base_env()
    res = subprocess.run([sys.executable, "-m", "preproc", "movielens", "run", "--input", str(raw),
                          "--output", str(data), "--test-negatives", "100", "--num-files", "1",
                          "--shuffle-partitions", "2", "--validation"], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]

    # NCF trains in its own process while the baselines are computed here: the two overlap
    # instead of following each other
    log, err = tmp_path / "log.jsonl", tmp_path / "train.err"
    with open(err, "w") as stderr_file:
        training = subprocess.Popen([sys.executable, "-m", "recsys.train", "--model", "ncf", "--data-path",
                                     str(data), "--log-path", str(log), "--log-every", "1000"], env=env, cwd=REPO,
                                    stdout=subprocess.DEVNULL, stderr=stderr_file)
    try:
        baselines = realdata.implicit_feedback_baselines(data)
        training.wait(timeout=900)
    finally:
        if training.poll() is None:
            training.kill()
            training.wait()
    stderr = err.read_text()
    assert training.returncode == 0, stderr[-3000:]
    assert "small-data defaults: --batch-size 2048" in stderr, stderr[-3000:]
    assert "--early-stop-patience 2 --early-stop-min-delta 0.001 --keep-best" in stderr, stderr[-3000:]
    run = read_log(log)
    ours = summary(run)
    # the epochs are judged on validation; the result is the one test evaluation, with the best one's weights
    best = ours["best_eval"]
    evals = records(run, "eval")
    assert {e["mapping"] for e in evals} == {"validation"}
    assert best["metric"] == "hr_at_10" and best["value"] == max(e["hr_at_10"] for e in evals)
    test = ours["test_eval"]
    assert test["mapping"] == "test" and test["weights"] == "best" and test["epoch"] == best["epoch"]
    assert len(records(run, "test_eval")) == 1
    hr, ndcg = test["metrics"]["hr_at_10"], test["metrics"]["ndcg_at_10"]
    text = ", ".join(f"{name} {h:.3f} / {n:.3f}" for name, (h, n) in baselines.items())
    print(f"MovieLens-100k HR@10 / NDCG@10: NCF {hr:.3f} / {ndcg:.3f} (test, epoch {test['epoch']} of "
          f"{len(evals)} chosen on validation), {text}")

    pop_hr, pop_ndcg = baselines["popularity"]
    bpr_hr, bpr_ndcg = baselines["implicit BPR"]
    als_hr, als_ndcg = baselines["implicit ALS"]
    # Measured (docs/data.md): NCF 0.580 / 0.309 (test, epoch 5 of 6 chosen on validation), implicit ALS
    # 0.585 / 0.315, implicit BPR 0.541 / 0.296, popularity 0.321 / 0.166. A regression of the defaults (one step per epoch gave 0.31,
    # popularity's level) fails every line.
    assert hr >= pop_hr + 0.15 and ndcg >= pop_ndcg + 0.08
    assert hr >= bpr_hr and ndcg >= bpr_ndcg, ("implicit BPR", hr, ndcg, bpr_hr, bpr_ndcg)
    assert hr >= als_hr - ALS_TOLERANCE[0] and ndcg >= als_ndcg - ALS_TOLERANCE[1], ("implicit ALS", hr, ndcg,
                                                                                     als_hr, als_ndcg)
