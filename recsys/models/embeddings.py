"""Embedding tables: replicated Keras layers, or model parallel (tables spread over ranks).

Model parallel uses NVIDIA distributed-embeddings when it is importable (GPU
nodes with its CUDA op; not on PyPI, shipped in NVIDIA's Merlin TensorFlow
containers), else :class:`recsys.models.model_parallel.ModelParallelEmbedding`
on Horovod alltoall, which runs on CPU and GPU ranks. Both take the placement
thresholds of ``recsys.placement``.
"""
from __future__ import annotations

import tensorflow as tf

from recsys.models.model_parallel import (ColumnSeededUniform, ModelParallelEmbedding, SeededEmbedding, combine,
                                          new_table_seed)


def distributed_embeddings_module():
    """The model-parallel module of distributed-embeddings, or None when not importable."""
    try:
        from distributed_embeddings.python.layers import dist_model_parallel as dmp
    except Exception:  # ImportError, or its CUDA op failing to load on a CPU node
        return None
    return dmp


def model_parallel_implementation():
    """Which model-parallel implementation this process would run."""
    return "distributed-embeddings" if distributed_embeddings_module() is not None else "horovod-alltoall"


class EmbeddingGroup(tf.keras.layers.Layer):
    """All embedding tables of a model; call(list of [B] or [B, hot] id tensors) -> list of [B, d].

    ``model_parallel``: False (every rank holds every table), or a
    :class:`recsys.placement.PlacementChoice` / True to spread the tables over
    the Horovod ranks (distributed-embeddings' ``DistributedEmbedding`` when
    importable, else our alltoall layer).
    """

    def __init__(self, cardinalities, dims, combiners=None, model_parallel=False,
                 column_slice_threshold=None, name="embeddings", **kw):
        super().__init__(name=name, **kw)
        self.cardinalities = [int(c) for c in cardinalities]
        self.dims = [int(d) for d in (dims if isinstance(dims, (list, tuple)) else [dims] * len(cardinalities))]
        self.combiners = combiners or [None] * len(self.cardinalities)
        self.seed = new_table_seed()
        self.model_parallel = bool(model_parallel)
        data_parallel_threshold = getattr(model_parallel, "data_parallel_threshold", None)
        column_slice_threshold = getattr(model_parallel, "column_slice_threshold", None) or column_slice_threshold
        self._dist = self._mp = None
        self.tables = []
        if self.model_parallel and distributed_embeddings_module() is None:
            self._mp = ModelParallelEmbedding(self.cardinalities, self.dims, self.combiners, self.seed,
                                              column_slice_threshold=column_slice_threshold,
                                              data_parallel_threshold=data_parallel_threshold, name="mp")
            return
        if self.model_parallel:     # distributed-embeddings builds the tables itself, from their initializer
            self.tables = [tf.keras.layers.Embedding(c, d, embeddings_initializer=ColumnSeededUniform(self.seed, i),
                                                     name=f"table_{i}")
                           for i, (c, d) in enumerate(zip(self.cardinalities, self.dims))]
            dmp = distributed_embeddings_module()
            kw = {} if data_parallel_threshold is None else {"data_parallel_threshold": data_parallel_threshold}
            self._dist = dmp.DistributedEmbedding(
                self.tables, strategy="memory_balanced", column_slice_threshold=column_slice_threshold, **kw)
        else:
            self.tables = [SeededEmbedding(c, d, self.seed, i, name=f"table_{i}")
                           for i, (c, d) in enumerate(zip(self.cardinalities, self.dims))]

    @property
    def implementation(self):
        return ("horovod-alltoall" if self._mp is not None else
                "distributed-embeddings" if self._dist is not None else "replicated")

    def local_variables(self):
        """Variables that live on this rank only (neither broadcast nor allreduced)."""
        if self._mp is not None:
            return self._mp.local_variables()
        return list(self.trainable_variables) if self._dist is not None else []

    def seeded_variables(self):
        """Tables every rank initialises identically from this group's seed (``ColumnSeededUniform``),
        so the engine need not broadcast them: replicated tables, and the small tables a
        model-parallel layer keeps replicated. distributed-embeddings' tables are local."""
        if self._mp is not None:
            return list(self._mp.dp_tables.values())
        return [] if self._dist is not None else [t.embeddings for t in self.tables]

    def call(self, ids):
        if self._mp is not None:
            return self._mp(ids)
        if self._dist is not None:
            outs = self._dist([tf.maximum(i, 0) for i in ids])
        else:
            outs = [t(tf.maximum(i, 0)) for t, i in zip(self.tables, ids)]
        return [self._combine(o, i, c) for o, i, c in zip(outs, ids, self.combiners)]

    @staticmethod
    def _combine(vectors, ids, combiner):
        """Multi-hot: sum or mean over the valid (>= 0) ids of each row; padding is -1."""
        return combine(vectors, ids, combiner)
