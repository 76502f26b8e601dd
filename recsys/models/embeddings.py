"""Embedding tables: replicated Keras layers, or model-parallel via NVIDIA distributed-embeddings.

distributed-embeddings (not on PyPI; shipped in NVIDIA's Merlin TensorFlow
containers) loads a CUDA op at import, so it is only importable on GPU nodes.
When it is missing the engine keeps every table on every rank (replicated,
gradients allreduced as IndexedSlices) and says so once in the log.
"""
from __future__ import annotations

import tensorflow as tf


def distributed_embeddings_module():
    """The model-parallel module of distributed-embeddings, or None when not importable."""
    try:
        from distributed_embeddings.python.layers import dist_model_parallel as dmp
    except Exception:  # ImportError, or its CUDA op failing to load on a CPU node
        return None
    return dmp


class EmbeddingGroup(tf.keras.layers.Layer):
    """All embedding tables of a model; call(list of [B] or [B, hot] id tensors) -> list of [B, d].

    ``model_parallel=True`` (needs distributed-embeddings and Horovod) places whole
    tables / column slices on ranks with its ``DistributedEmbedding`` wrapper,
    which does the alltoall exchange of lookups itself.
    """

    def __init__(self, cardinalities, dims, combiners=None, model_parallel=False,
                 column_slice_threshold=None, name="embeddings", **kw):
        super().__init__(name=name, **kw)
        self.cardinalities = [int(c) for c in cardinalities]
        self.dims = [int(d) for d in (dims if isinstance(dims, (list, tuple)) else [dims] * len(cardinalities))]
        self.combiners = combiners or [None] * len(self.cardinalities)
        self.tables = [
            tf.keras.layers.Embedding(
                c, d, embeddings_initializer=tf.keras.initializers.RandomUniform(-(c ** -0.5), c ** -0.5),
                name=f"table_{i}")
            for i, (c, d) in enumerate(zip(self.cardinalities, self.dims))]
        self.model_parallel = bool(model_parallel)
        self._dist = None
        if self.model_parallel:
            dmp = distributed_embeddings_module()
            self._dist = dmp.DistributedEmbedding(
                self.tables, strategy="memory_balanced", column_slice_threshold=column_slice_threshold)

    def call(self, ids):
        if self._dist is not None:
            outs = self._dist([tf.maximum(i, 0) for i in ids])
        else:
            outs = [t(tf.maximum(i, 0)) for t, i in zip(self.tables, ids)]
        return [self._combine(o, i, c) for o, i, c in zip(outs, ids, self.combiners)]

    @staticmethod
    def _combine(vectors, ids, combiner):
        """Multi-hot: sum or mean over the valid (>= 0) ids of each row; padding is -1."""
        if ids.shape.rank == 1:
            return vectors
        mask = tf.cast(ids >= 0, vectors.dtype)[..., None]
        total = tf.reduce_sum(vectors * mask, axis=1)
        if combiner == "mean":
            total = total / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)
        return total
