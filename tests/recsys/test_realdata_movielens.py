"""Real data: MovieLens-100k through ``preproc movielens`` and NCF with default settings.

MovieLens-100k is read out of the ``recbole==1.2.1`` wheel (tests/realdata.py: downloaded once into
the cache, never installed), rewritten in the ml-1m layout, preprocessed by ``python -m preproc
movielens run`` with 100 stored test negatives per user, and trained by ``recsys.train --model ncf``
with no hyper-parameter flag: the small-data defaults apply (recsys.models.defaults). The metrics
must match two matrix-factorisation baselines, BPR and implicit ALS (numpy), on the same split and
the same 100 negatives per user (within MF_TOLERANCE: measured, NCF is 0.005 / 0.004 above BPR and
0.008 / 0.002 below ALS) and be well above item popularity. docs/data.md has the numbers.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import REPO, base_env, read_log, summary

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from realdata import wheel_member  # noqa: E402

pytestmark = pytest.mark.spark

ML100K = ("recbole", "1.2.1", "recbole/dataset_example/ml-100k/ml-100k.inter")
# NCF's HR@10 / NDCG@10 may fall this far below the matrix-factorisation baseline's.
MF_TOLERANCE = 0.02


def ml1m_ratings(out: Path) -> Path:
    """ml-100k.inter (tab-separated, typed header) -> ``ratings.dat`` (``UserID::MovieID::Rating::Timestamp``)."""
    inter = pd.read_csv(wheel_member(*ML100K), sep="\t")
    inter.columns = [c.split(":")[0] for c in inter.columns]
    out.mkdir(parents=True)
    lines = [f"{u}::{i}::{int(r)}::{int(t)}" for u, i, r, t in
             inter[["user_id", "item_id", "rating", "timestamp"]].itertuples(index=False)]
    (out / "ratings.dat").write_text("\n".join(lines) + "\n")
    return out


def hr_ndcg(scores: np.ndarray, k: int = 10):
    """HR@k, NDCG@k of [users, 1 + negatives] scores, the positive in column 0, ties pessimistic
    (as recsys.metrics.hit_rate_and_ndcg)."""
    rank = (scores[:, 1:] >= scores[:, :1]).sum(axis=1)
    hit = rank < k
    return float(hit.mean()), float(np.where(hit, np.log(2) / np.log(rank + 2), 0.0).mean())


def implicit_als(users, items, num_users, num_items, factors=32, alpha=10.0, reg=10.0, iterations=15, seed=0):
    """Implicit-feedback ALS (Hu, Koren & Volinsky 2008): confidence 1 + alpha on the positives,
    preference 1 there and 0 elsewhere; returns the [users, items] score matrix."""
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 0.01, (num_users, factors))
    y = rng.normal(0, 0.01, (num_items, factors))
    by_user = [np.flatnonzero(users == u) for u in range(num_users)]
    by_item = [np.flatnonzero(items == i) for i in range(num_items)]

    def solve(fixed, rows, other):
        gram = fixed.T @ fixed + reg * np.eye(factors)
        out = np.zeros((len(rows), factors))
        for k, idx in enumerate(rows):
            if idx.size:
                f = fixed[other[idx]]
                out[k] = np.linalg.solve(gram + alpha * f.T @ f, (1 + alpha) * f.sum(axis=0))
        return out

    for _ in range(iterations):
        x = solve(y, by_user, items)
        y = solve(x, by_item, users)
    return x @ y.T


def bpr(users, items, num_users, num_items, factors=32, lr=0.1, reg=0.01, epochs=60, batch=2048, seed=0):
    """BPR matrix factorisation (Rendle et al. 2009): for every training positive (u, i) and an item
    j the user has not rated, drawn uniformly, SGD on -log sigmoid(x_ui - x_uj) with L2; minibatches
    of triples, updates summed per row. Returns the [users, items] score matrix. The defaults are the
    best of a small search here (factors 32 as ALS; lr 0.05-0.2, reg 0.001-0.01, 20-100 epochs):
    HR@10 0.586, NDCG@10 0.318 (factors 64: 0.596 / 0.317)."""
    rng = np.random.default_rng(seed)
    p = rng.normal(0, 0.1, (num_users, factors))
    q = rng.normal(0, 0.1, (num_items, factors))
    rated = np.zeros((num_users, num_items), bool)
    rated[users, items] = True
    for _ in range(epochs):
        order = rng.permutation(len(users))
        for start in range(0, len(order), batch):
            idx = order[start:start + batch]
            u, i = users[idx], items[idx]
            j = rng.integers(0, num_items, len(idx))
            bad = rated[u, j]
            while bad.any():                   # redraw the negatives the user has rated
                j[bad] = rng.integers(0, num_items, int(bad.sum()))
                bad = rated[u, j]
            pu, qi, qj = p[u], q[i], q[j]
            g = 1.0 / (1.0 + np.exp(np.sum(pu * (qi - qj), axis=1)))[:, None]     # sigmoid(-x_uij)
            dp = np.zeros_like(p)
            dq = np.zeros_like(q)
            np.add.at(dp, u, g * (qi - qj) - reg * pu)
            np.add.at(dq, i, g * pu - reg * qi)
            np.add.at(dq, j, -g * pu - reg * qj)
            p += lr * dp
            q += lr * dq
    return p @ q.T


def test_movielens_100k_ncf_defaults_match_matrix_factorisation(tmp_path):
    raw = ml1m_ratings(tmp_path / "raw")
    data = tmp_path / "ncf"
    env = base_env()
    res = subprocess.run([sys.executable, "-m", "preproc", "movielens", "run", "--input", str(raw),
                          "--output", str(data), "--test-negatives", "100", "--num-files", "1",
                          "--shuffle-partitions", "2"], env=env, cwd=REPO, capture_output=True, text=True,
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
        baselines = _baselines(data)
        training.wait(timeout=900)
    finally:
        if training.poll() is None:
            training.kill()
            training.wait()
    stderr = err.read_text()
    assert training.returncode == 0, stderr[-3000:]
    assert "small-data defaults: --batch-size 2048" in stderr, stderr[-3000:]
    ours = summary(read_log(log))
    (pop_hr, pop_ndcg), (als_hr, als_ndcg), (bpr_hr, bpr_ndcg) = baselines

    hr, ndcg = ours["hr_at_10"], ours["ndcg_at_10"]
    print(f"MovieLens-100k HR@10 / NDCG@10: NCF {hr:.3f} / {ndcg:.3f}, BPR {bpr_hr:.3f} / {bpr_ndcg:.3f}, "
          f"implicit ALS {als_hr:.3f} / {als_ndcg:.3f}, popularity {pop_hr:.3f} / {pop_ndcg:.3f}")
    # Measured (docs/data.md): NCF 0.591 / 0.322, BPR 0.586 / 0.318, ALS 0.599 / 0.324, popularity
    # 0.322 / 0.167: on 100k ratings NeuMF with the defaults ties matrix factorisation (ahead of BPR,
    # behind a tuned implicit ALS, by under 0.01); a regression of the defaults (one step per epoch
    # gave 0.31, popularity's level) is far outside MF_TOLERANCE.
    for name, (b_hr, b_ndcg) in (("BPR", (bpr_hr, bpr_ndcg)), ("ALS", (als_hr, als_ndcg))):
        assert hr >= b_hr - MF_TOLERANCE and ndcg >= b_ndcg - MF_TOLERANCE, (name, hr, ndcg, b_hr, b_ndcg)
    assert hr >= pop_hr + 0.15 and ndcg >= pop_ndcg + 0.08


def _baselines(data: Path):
    """(HR@10, NDCG@10) of item popularity, implicit ALS and BPR on the split and the stored
    negatives NCF is evaluated on."""
    train = pd.read_parquet(data / "train")
    test = pd.read_parquet(data / "test")
    num_users, num_items = int(train.user.max()) + 1, int(train.item.max()) + 1
    num_items = max(num_items, int(test.item.max()) + 1)
    # the test mapping holds, per user, the positive then the 100 negatives NCF was evaluated on
    users = test.user.to_numpy().reshape(-1, 101)[:, 0]
    candidates = test.item.to_numpy().reshape(-1, 101)
    assert (test.label.to_numpy().reshape(-1, 101)[:, 0] == 1).all() and len(users) == 943

    u, i = train.user.to_numpy(), train.item.to_numpy()
    popularity = np.bincount(i, minlength=num_items).astype(np.float64)
    pop_hr, pop_ndcg = hr_ndcg(popularity[candidates])
    als = implicit_als(u, i, num_users, num_items)
    als_hr, als_ndcg = hr_ndcg(als[users[:, None], candidates])
    scores = bpr(u, i, num_users, num_items)
    return (pop_hr, pop_ndcg), (als_hr, als_ndcg), hr_ndcg(scores[users[:, None], candidates])
