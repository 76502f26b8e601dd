"""NCF data helpers: positives from a feature spec, per-epoch training negatives, the 100-negative eval set.

The NCF dataset stores only positives: ``train`` holds every (user, item)
interaction but each user's last, ``test`` holds that last one (one row per
user). As in the reference:

* training: every positive is followed by ``num_negatives`` (4) items drawn
  uniformly at random, resampled each epoch (:class:`TrainSampler`);
  negatives that happen to be a known positive of the user are redrawn;
* evaluation: each test positive is ranked against ``num_negatives`` (100)
  distinct items the user never interacted with, drawn once with a fixed seed
  (:func:`eval_set`), or against the negatives the preprocessing stored
  (``metadata.test_samples_per_series`` = 1 + N, :func:`stored_eval_set`);
  the metric is HR@10/NDCG@10 from recsys.models.metrics.

:func:`load_pairs` returns positives only (label > 0.5), so stored test
negatives never count as interactions.

Everything is numpy and vectorised; ranks shard users/rows themselves
(``shard``) so that evaluation sums can be allreduced.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from recsys.features.spec import FeatureSpec, FeatureSpecError


def load_pairs(spec: FeatureSpec, mapping: str, positives_only: bool = True) -> Tuple[np.ndarray, np.ndarray]:
    """(users, items) int64 arrays of a mapping, read in one batch; rows with label 0 (stored
    test negatives) are left out unless ``positives_only`` is False."""
    users, items, labels = _load(spec, mapping)
    if positives_only:
        keep = labels > 0.5
        users, items = users[keep], items[keep]
    return users, items


def _load(spec: FeatureSpec, mapping: str):
    from recsys.data import make_reader
    rows = spec.num_rows(mapping)
    reader = make_reader(spec, mapping, batch_size=rows, drop_remainder=False)
    inputs, labels = next(iter(reader.numpy_batches()))
    return inputs["user"].astype(np.int64), inputs["item"].astype(np.int64), labels[:, 0]


def stored_eval_set(spec: FeatureSpec, mapping: str = "test"):
    """The evaluation set written by the preprocessing, or None when it stored positives only.

    With ``metadata.test_samples_per_series = 1 + N`` > 1 each user owns 1 + N
    consecutive rows, the positive (label 1) first. Returns the same
    (users, items [U, 1 + N], labels) as :func:`eval_set`.
    """
    per_user = int(spec.metadata.get("test_samples_per_series", 1))
    if per_user <= 1:
        return None
    users, items, labels = _load(spec, mapping)
    if users.size % per_user:
        raise FeatureSpecError(f"{spec.origin}: source_spec.{mapping}",
                               f"{users.size} rows are not blocks of test_samples_per_series={per_user}")
    users, items, labels = (a.reshape(-1, per_user) for a in (users, items, labels))
    if not ((users == users[:, :1]).all() and (labels[:, 0] > 0.5).all() and (labels[:, 1:] < 0.5).all()):
        raise FeatureSpecError(f"{spec.origin}: source_spec.{mapping}",
                               f"rows are not per-user blocks of {per_user} with the positive first")
    return users[:, 0].astype(np.int32), items.astype(np.int32), labels.astype(np.float32)


def _known(users, items, num_items):
    return np.unique(users.astype(np.int64) * num_items + items.astype(np.int64))


def _draw_negatives(rng, users, num_items, known, count):
    """Items uniform in [0, num_items) that are not a known positive of the user, per user in ``users``."""
    users = np.repeat(users, count)
    items = rng.integers(0, num_items, size=users.size)
    for _ in range(100):
        bad = np.flatnonzero(np.isin(users * num_items + items, known, assume_unique=False))
        if not bad.size:
            return users, items
        items[bad] = rng.integers(0, num_items, size=bad.size)
    raise ValueError("could not draw negatives: some users interacted with (almost) every item")


class TrainSampler:
    """Positives + ``num_negatives`` fresh negatives per positive for each epoch, shuffled, deterministic by (seed, epoch)."""

    def __init__(self, users, items, num_items: int, num_negatives: int = 4, seed: int = 0):
        self.users = np.asarray(users, dtype=np.int64)
        self.items = np.asarray(items, dtype=np.int64)
        self.num_items, self.num_negatives, self.seed = int(num_items), int(num_negatives), seed
        self.known = _known(self.users, self.items, self.num_items)

    def __len__(self):
        return self.users.size * (1 + self.num_negatives)

    def epoch(self, epoch: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(users int32, items int32, labels float32) of one epoch, shuffled."""
        rng = np.random.default_rng([self.seed, epoch])
        nu, ni = _draw_negatives(rng, self.users, self.num_items, self.known, self.num_negatives)
        users = np.concatenate([self.users, nu])
        items = np.concatenate([self.items, ni])
        labels = np.concatenate([np.ones(self.users.size, np.float32), np.zeros(nu.size, np.float32)])
        perm = rng.permutation(users.size)
        return users[perm].astype(np.int32), items[perm].astype(np.int32), labels[perm]


def _draw_distinct_negatives(rng, users, num_items, known, count):
    """[U, count] items per user: distinct within the row, none a known positive of the user: a
    uniformly random ``count``-subset of the items the user never interacted with, drawn exactly
    without replacement whatever their number (as the reference), in random order.

    Vectorised over users: Floyd's algorithm draws ``count`` distinct indices in [0, m_u) (m_u: the
    user's unseen items), then index k becomes the user's k-th unseen item by a binary search
    through the user's sorted positives (``known``: sorted ``user * num_items + item`` keys)."""
    users = np.asarray(users, dtype=np.int64)
    known = np.unique(np.asarray(known, dtype=np.int64))
    known_user = known // num_items
    positives = np.bincount(known_user, minlength=int(users.max()) + 1 if users.size else 0)
    unseen = num_items - positives[users] if users.size else np.zeros(0, np.int64)
    short = np.flatnonzero(unseen < count)
    if short.size:
        u = int(users[short[0]])
        raise ValueError(f"user {u} has only {num_items - positives[u]} items it never interacted with, "
                         f"fewer than the {count} evaluation negatives (--valid-negative)")
    # Floyd: for j = m-count .. m-1 take t uniform in [0, j]; t if not yet taken, else j.
    picked = np.empty((users.size, count), np.int64)
    for step in range(count):
        j = unseen - count + step
        t = np.floor(rng.random(users.size) * (j + 1)).astype(np.int64)
        t = np.minimum(t, j)
        taken = (picked[:, :step] == t[:, None]).any(axis=1)
        picked[:, step] = np.where(taken, j, t)
    picked = rng.permuted(picked, axis=1)
    # k-th unseen item of user u: k + (number of the user's positives p_i with p_i - i <= k), where
    # p_0 < p_1 < ... are its positives; keys u * num_items + (p_i - i) are sorted over all users.
    first = np.searchsorted(known, known_user * num_items)            # start of each key's user block
    shifted = known_user * num_items + (known % num_items) - (np.arange(known.size) - first)
    block_start = np.searchsorted(known, users * num_items)
    below = np.searchsorted(shifted, users[:, None] * num_items + picked, side="right") - block_start[:, None]
    return picked + below


def eval_set(test_users, test_items, train_users, train_items, num_items: int, num_negatives: int = 100,
             seed: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(users [U], items [U, 1 + num_negatives], labels) with the positive in column 0.

    A user's negatives are distinct and exclude the user's train and test
    positives. Score the items matrix row-wise and pass ``scores[:, 0]`` and
    ``scores[:, 1:]`` to ``recsys.models.metrics.hit_rate_and_ndcg``.
    """
    tu = np.asarray(test_users, dtype=np.int64)
    ti = np.asarray(test_items, dtype=np.int64)
    known = _known(np.concatenate([np.asarray(train_users), tu]), np.concatenate([np.asarray(train_items), ti]), num_items)
    rng = np.random.default_rng([seed, 101])
    neg = _draw_distinct_negatives(rng, tu, num_items, known, num_negatives)
    items = np.concatenate([ti[:, None], neg], axis=1)
    labels = np.zeros(items.shape, np.float32)
    labels[:, 0] = 1.0
    return tu.astype(np.int32), items.astype(np.int32), labels


def shard(arrays, rank: int, world_size: int, equal: bool = True):
    """Contiguous slice of each array for this rank; ``equal`` truncates to the same length on every rank."""
    n = len(arrays[0])
    if equal:
        per = n // world_size
        lo, hi = rank * per, (rank + 1) * per
    else:
        bounds = np.linspace(0, n, world_size + 1).astype(np.int64)
        lo, hi = bounds[rank], bounds[rank + 1]
    return tuple(a[lo:hi] for a in arrays)
