"""Metrics against scikit-learn, brute-force loops and hand-computed cases (ties, groups without a click)."""
import math

import numpy as np
import pytest
from sklearn.metrics import log_loss, roc_auc_score

from recsys.models import metrics as M

pytestmark = pytest.mark.fast


# ------------------------------------------------------------------ AUC
@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_sklearn_with_ties(seed):
    rng = np.random.default_rng(seed)
    y = rng.random(2000) < 0.3
    s = np.round(rng.random(2000), 1 + seed % 3)  # few distinct values: many ties
    assert M.auc(y, s) == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_auc_hand_cases():
    assert M.auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert M.auc([0, 1], [0.5, 0.5]) == 0.5  # a tie counts one half
    assert M.auc([1, 0, 1, 0], [3, 1, 2, 2]) == pytest.approx(0.875)  # pairs: 1, 1, 1, .5 -> 3.5/4
    assert math.isnan(M.auc([1, 1], [0.2, 0.3]))


def test_histogram_auc_close_to_exact_and_reduces_by_summing():
    rng = np.random.default_rng(1)
    y = rng.random(20000) < 0.25
    p = 1 / (1 + np.exp(-(rng.normal(size=y.size) + 1.2 * y)))
    whole = M.AucHistogram()
    whole.update(y, p)
    assert whole.result() == pytest.approx(M.auc(y, p), abs=1e-3)
    ranks = [M.AucHistogram(), M.AucHistogram()]
    ranks[0].update(y[:7000], p[:7000])
    ranks[1].update(y[7000:], p[7000:])
    summed = ranks[0].sums() + ranks[1].sums()  # what an allreduce(sum) gives
    assert np.array_equal(summed, whole.sums())
    assert M.auc_from_histograms(*summed) == whole.result()
    assert whole.num_thresholds == 8000


def test_histogram_auc_is_exact_for_scores_on_the_bucket_grid():
    rng = np.random.default_rng(2)
    p = rng.integers(0, 100, 5000) / 100 + 0.001  # 100 distinct values, each inside one bucket
    y = rng.random(p.size) < p
    h = M.AucHistogram(100)
    h.update(y, p)
    assert h.result() == pytest.approx(roc_auc_score(y, p), abs=1e-12)


# --------------------------------------------------------------- MAP@12
def brute_map(scores, labels, groups, k=12):
    """Independent loop implementation of the documented definition."""
    aps = []
    for g in dict.fromkeys(groups):
        idx = [i for i in range(len(groups)) if groups[i] == g]
        if not any(labels[i] for i in idx):
            continue
        ranked = sorted(idx, key=lambda i: (-scores[i], labels[i]))  # pessimistic ties
        hits, total = 0, 0.0
        for r, i in enumerate(ranked[:k]):
            if labels[i]:
                hits += 1
                total += hits / (r + 1)
        aps.append(total / min(sum(labels[i] for i in idx), k))
    return sum(aps) / len(aps)


def test_map_hand_cases():
    # group 1: clicked ad ranked 2nd -> 1/2; group 2: no click (ignored); group 3: ranked 1st -> 1
    scores = [0.9, 0.8, 0.1, 0.5, 0.4, 0.3, 0.7]
    labels = [0, 1, 0, 0, 0, 1, 0]
    groups = [1, 1, 1, 2, 2, 3, 3]
    # group 3: 0.3 (clicked) vs 0.7 -> rank 1 -> 1/2
    assert M.map_at_k(scores, labels, groups) == pytest.approx((0.5 + 0.5) / 2)
    assert M.map_at_k_sums(scores, labels, groups) == (pytest.approx(1.0), 2)
    # ties are pessimistic: the clicked ad goes after every equal-scored unclicked ad
    assert M.map_at_k([0.5, 0.5, 0.5], [1, 0, 0], [7, 7, 7]) == pytest.approx(1 / 3)
    # clicked ad beyond the cut-off scores 0
    assert M.map_at_k(np.arange(20)[::-1], [0] * 19 + [1], [0] * 20, k=12) == 0.0
    assert M.map_at_k(np.arange(20)[::-1], [0] * 11 + [1] + [0] * 8, [0] * 20, k=12) == pytest.approx(1 / 12)
    assert math.isnan(M.map_at_k([0.1, 0.2], [0, 0], [1, 1]))


@pytest.mark.parametrize("seed", range(4))
def test_map_matches_brute_force_with_unsorted_groups_and_ties(seed):
    rng = np.random.default_rng(seed)
    n = 600
    groups = rng.integers(0, 80, n)  # interleaved, not sorted
    scores = np.round(rng.random(n), 1)
    labels = (rng.random(n) < 0.25).astype(int)
    assert M.map_at_k(scores, labels, groups) == pytest.approx(brute_map(scores, labels, groups), abs=1e-12)


def test_map_sums_add_up_across_ranks_when_groups_are_not_split():
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(50), 5)
    scores, labels = rng.random(250), np.zeros(250)
    labels[np.arange(50) * 5 + rng.integers(0, 5, 50)] = 1
    a = M.map_at_k_sums(scores[:100], labels[:100], groups[:100])
    b = M.map_at_k_sums(scores[100:], labels[100:], groups[100:])
    assert (a[0] + b[0]) / (a[1] + b[1]) == pytest.approx(M.map_at_k(scores, labels, groups))


# --------------------------------------------------------- HR@10, NDCG@10
def test_hit_rate_and_ndcg_hand_cases():
    pos = [0.9, 0.5, 0.1]
    neg = [[0.1] * 100, [0.6] * 3 + [0.0] * 97, [0.5] * 100]
    hr, ndcg = M.hit_rate_and_ndcg(pos, neg, k=10)
    # user0 rank 0 (hit, 1); user1 rank 3 (hit, log2/log5); user2 rank 100 (miss)
    assert hr == pytest.approx(2 / 3)
    assert ndcg == pytest.approx((1 + math.log(2) / math.log(5)) / 3)
    # ties are pessimistic: 9 equal negatives -> rank 9 (still a hit at k=10), 10 -> miss
    assert M.hit_rate_and_ndcg([0.5], [[0.5] * 9 + [0.0] * 91])[0] == 1.0
    assert M.hit_rate_and_ndcg([0.5], [[0.5] * 10 + [0.0] * 90])[0] == 0.0


def test_hit_rate_and_ndcg_match_brute_force():
    rng = np.random.default_rng(4)
    pos, neg = rng.random(300), rng.random((300, 100))
    hits = ndcg = 0.0
    for p, ns in zip(pos, neg):
        rank = sum(1 for x in ns if x >= p)
        if rank < 10:
            hits += 1
            ndcg += math.log(2) / math.log(rank + 2)
    assert M.hit_rate_and_ndcg(pos, neg) == (pytest.approx(hits / 300), pytest.approx(ndcg / 300))
    assert M.hit_rate_and_ndcg_sums(pos, neg)[2] == 300


# ------------------------------------------------------------------ BCE
def test_bce_matches_sklearn_log_loss():
    rng = np.random.default_rng(5)
    y = rng.random(1000) < 0.3
    p = rng.random(1000)
    assert M.binary_cross_entropy(y, p) == pytest.approx(log_loss(y, p), rel=1e-9)
    total, n = M.binary_cross_entropy_sums(y.reshape(-1, 1), p.reshape(-1, 1))
    assert n == 1000 and total / n == pytest.approx(log_loss(y, p), rel=1e-9)
    assert np.isfinite(M.binary_cross_entropy([1, 0], [0.0, 1.0]))  # clipped, not inf


# ------------------------------------------------------- non-finite scores
def test_nan_scores_never_give_perfect_metrics():
    """NaN compares False: without a guard a NaN positive ranks first (HR = NDCG = 1)."""
    hits, ndcg, users = M.hit_rate_and_ndcg_sums(np.full(3, np.nan), np.zeros((3, 100)))
    assert math.isnan(hits) and math.isnan(ndcg) and users == 3
    assert all(math.isnan(v) for v in M.hit_rate_and_ndcg([np.nan], [[0.1, 0.2]]))
    assert math.isnan(M.map_at_k([np.nan, 0.1], [1, 0], [1, 1]))
    h = M.AucHistogram()
    h.update([1, 0, 1, 0], [0.9, 0.1, np.nan, 0.2])
    assert math.isnan(h.result())
    other = M.AucHistogram()
    other.update([1, 0], [0.9, 0.1])
    assert math.isnan(M.auc_from_histograms(*(h.sums() + other.sums())))   # survives the allreduce
    assert math.isnan(M.binary_cross_entropy([1, 0], [np.nan, 0.1]))
