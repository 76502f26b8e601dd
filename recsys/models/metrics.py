"""Evaluation metrics of the reference recommenders (hpc-facts.md section 5), pure numpy.

Every metric has a *sums* form whose arrays add up across ranks (allreduce
with op=Sum, then call the ``*_from_sums`` function), so a data-parallel
evaluation gives the same number as a single process on the whole set:

* AUC (DLRM): :func:`auc` is exact (ties count one half, equal to
  ``sklearn.metrics.roc_auc_score``). :class:`AucHistogram` is the streaming
  form: positive and negative counts of predicted probabilities in
  ``num_thresholds`` (8000, as the reference) equal-width buckets on [0, 1];
  its AUC is the trapezoidal ROC area over those thresholds (scores within a
  bucket count as ties), within about 1/num_thresholds of the exact value.
* MAP@12 (Wide & Deep): :func:`map_at_k` groups rows by display id, ranks each
  group by score (descending), AP = 1/(rank+1) for the clicked ad if its
  0-based rank is < k, else 0; the mean runs over groups with at least one
  click (groups without a click are ignored). **Ties are pessimistic**: a
  clicked ad ranks after every unclicked ad of its group with an equal score,
  so a constant predictor is not rewarded. With several clicks in a group the
  standard AP@k is used (sum of precision at each clicked rank < k, divided by
  min(clicks, k)), which reduces to 1/(rank+1) for one click.
  A group must not be split across ranks (the readers keep a display id in
  one file).
* HR@10 / NDCG@10 (NCF): per user the positive is scored against its sampled
  negatives; rank = number of negatives scoring **>=** the positive
  (pessimistic ties); hit if rank < k, NDCG = log(2)/log(rank+2) on a hit.
* BCE: mean binary cross-entropy of probabilities (clipped to [eps, 1-eps]).

A non-finite score makes every metric NaN (never a perfect score: NaN compares
False, so it would otherwise rank ahead of everything); the engine stops the
run on non-finite predictions before it reports them.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

DEFAULT_THRESHOLDS = 8000


def _flat(x, dtype=np.float64) -> np.ndarray:
    return np.asarray(x, dtype=dtype).reshape(-1)


# ------------------------------------------------------------------ AUC
def auc(labels, scores) -> float:
    """Exact ROC AUC (Mann-Whitney with average ranks for ties). NaN when one class is missing."""
    y = _flat(labels) > 0.5
    s = _flat(scores)
    if y.shape != s.shape:
        raise ValueError(f"labels {y.shape} and scores {s.shape} differ in length")
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    # average 1-based rank of each tie block
    starts = np.r_[0, np.flatnonzero(sorted_s[1:] != sorted_s[:-1]) + 1]
    ends = np.r_[starts[1:], s.size]
    avg = (starts + ends + 1) / 2.0
    ranks = np.empty(s.size)
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


class AucHistogram:
    """Streaming AUC by score histograms; ``pos``/``neg`` arrays are summed across ranks."""

    def __init__(self, num_thresholds: int = DEFAULT_THRESHOLDS):
        self.num_thresholds = int(num_thresholds)
        # float64: exact counts up to 2**53, and a NaN (non-finite score seen) survives the allreduce
        self.pos = np.zeros(self.num_thresholds, dtype=np.float64)
        self.neg = np.zeros(self.num_thresholds, dtype=np.float64)

    def update(self, labels, probs) -> None:
        """Count scores by bucket; a non-finite score poisons the histogram (its AUC is NaN)."""
        y = _flat(labels) > 0.5
        p = _flat(probs)
        finite = np.isfinite(p)
        if not finite.all():
            self.pos[0] = np.nan
            y, p = y[finite], p[finite]
        b = np.clip((p * self.num_thresholds).astype(np.int64), 0, self.num_thresholds - 1)
        self.pos += np.bincount(b[y], minlength=self.num_thresholds)
        self.neg += np.bincount(b[~y], minlength=self.num_thresholds)

    def sums(self) -> np.ndarray:
        """[2, num_thresholds] float64 counts (pos, neg) for one allreduce (NaN stays NaN)."""
        return np.stack([self.pos, self.neg])

    def result(self) -> float:
        return auc_from_histograms(self.pos, self.neg)


def auc_from_histograms(pos, neg) -> float:
    """AUC of bucketed scores: pairs in a higher bucket count 1, in the same bucket 1/2."""
    pos = np.asarray(pos, dtype=np.float64).reshape(-1)
    neg = np.asarray(neg, dtype=np.float64).reshape(-1)
    n_pos, n_neg = pos.sum(), neg.sum()
    if not (np.isfinite(n_pos) and np.isfinite(n_neg)) or n_pos == 0 or n_neg == 0:
        return float("nan")
    neg_below = np.cumsum(neg) - neg
    return float((pos * (neg_below + 0.5 * neg)).sum() / (n_pos * n_neg))


# --------------------------------------------------------------- MAP@k
def map_at_k_sums(scores, labels, groups, k: int = 12) -> Tuple[float, int]:
    """(sum of AP@k over groups with a click, number of such groups) for cross-rank reduction."""
    s, y, g = _flat(scores), _flat(labels) > 0.5, np.asarray(groups).reshape(-1)
    if not (s.size == y.size == g.size):
        raise ValueError(f"scores {s.size}, labels {y.size} and groups {g.size} differ in length")
    if s.size == 0:
        return 0.0, 0
    # group, then score descending, then unclicked before clicked (pessimistic ties)
    order = np.lexsort((y, -s, g))
    g, y = g[order], y[order]
    new_group = np.r_[True, g[1:] != g[:-1]]
    group_idx = np.cumsum(new_group) - 1
    start = np.flatnonzero(new_group)
    rank = np.arange(g.size) - start[group_idx]
    clicks_so_far = np.cumsum(y) - np.repeat(np.cumsum(y)[start] - y[start], np.diff(np.r_[start, g.size]))
    clicks = np.bincount(group_idx, weights=y, minlength=start.size)
    hit = y & (rank < k)
    precision = np.where(hit, clicks_so_far / (rank + 1.0), 0.0)
    ap = np.bincount(group_idx, weights=precision, minlength=start.size)
    has_click = clicks > 0
    ap = ap[has_click] / np.minimum(clicks[has_click], k)
    if not np.isfinite(s).all():  # a NaN score must not rank anywhere: the metric is NaN
        return float("nan"), int(has_click.sum())
    return float(ap.sum()), int(has_click.sum())


def map_at_k(scores, labels, groups, k: int = 12) -> float:
    """MAP@k grouped by display id (see module docstring); NaN when no group has a click."""
    total, count = map_at_k_sums(scores, labels, groups, k)
    return total / count if count else float("nan")


# ------------------------------------------------------- HR@k, NDCG@k
def hit_rate_and_ndcg_sums(scores_pos, scores_neg, k: int = 10) -> Tuple[float, float, int]:
    """(hits, sum of NDCG, users) for scores_pos [U] against scores_neg [U, N]."""
    pos = _flat(scores_pos)
    neg = np.asarray(scores_neg, dtype=np.float64).reshape(pos.size, -1)
    if not (np.isfinite(pos).all() and np.isfinite(neg).all()):
        return float("nan"), float("nan"), int(pos.size)  # NaN compares False: it would rank first
    rank = (neg >= pos[:, None]).sum(axis=1)
    hit = rank < k
    ndcg = np.where(hit, np.log(2.0) / np.log(rank + 2.0), 0.0)
    return float(hit.sum()), float(ndcg.sum()), int(pos.size)


def hit_rate_and_ndcg(scores_pos, scores_neg, k: int = 10) -> Tuple[float, float]:
    """(HR@k, NDCG@k) of the positive against its negatives (ties pessimistic)."""
    hits, ndcg, users = hit_rate_and_ndcg_sums(scores_pos, scores_neg, k)
    if users == 0:
        return float("nan"), float("nan")
    return hits / users, ndcg / users


# ------------------------------------------------------------------ BCE
def binary_cross_entropy_sums(labels, probs, eps: float = 1e-7) -> Tuple[float, int]:
    y = _flat(labels)
    p = np.clip(_flat(probs), eps, 1.0 - eps)
    return float(-(y * np.log(p) + (1.0 - y) * np.log1p(-p)).sum()), int(y.size)


def binary_cross_entropy(labels, probs, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities."""
    total, n = binary_cross_entropy_sums(labels, probs, eps)
    return total / n if n else float("nan")
