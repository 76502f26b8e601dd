"""Ranks stepping through a dataset together, for model-parallel evaluation.

Every batch of a model-parallel model is an alltoall that needs every rank; ranks can hold
different numbers of evaluation batches.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf


def lockstep(dataset, dist):
    """Iterate ``dataset`` in step with the other ranks: a rank out of batches yields empty ones
    (zero rows) until every rank is done, so the alltoall of each batch has all ranks in it."""
    it = iter(dataset)
    empty = tf.nest.map_structure(lambda spec: tf.zeros([0] + [d or 1 for d in spec.shape[1:]], spec.dtype),
                                  dataset.element_spec)
    while True:
        try:
            item = next(it)
            more = 1
        except StopIteration:
            item, more = None, 0
        if int(dist.allreduce_sum(np.array([more], np.int64))[0]) == 0:
            return
        yield empty if item is None else item

