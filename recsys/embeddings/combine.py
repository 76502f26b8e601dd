"""Multi-hot rows: the looked-up vectors of a row's ids combined into one (sum or mean).

Shared by the replicated lookup and the owners of model-parallel slices, so both paths
combine the same way.
"""
from __future__ import annotations

import tensorflow as tf


def combine(vectors, ids, combiner):
    """[B, hot, w] vectors of [B, hot] ids (padding -1) -> [B, w]; one-hot [B, w] unchanged."""
    if ids.shape.rank == 1:
        return vectors
    mask = tf.cast(ids >= 0, vectors.dtype)[..., None]
    total = tf.reduce_sum(vectors * mask, axis=1)
    if combiner == "mean":
        total = total / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)
    return total

