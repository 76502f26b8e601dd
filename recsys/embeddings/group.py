"""The EmbeddingGroup layer: one group's tables, replicated or model parallel as the run's placement says.

Model parallel uses NVIDIA distributed-embeddings when it is importable (GPU
nodes with its CUDA op; not on PyPI, shipped in NVIDIA's Merlin TensorFlow
containers), else :class:`recsys.embeddings.alltoall.ModelParallelEmbedding`
on Horovod alltoall, which runs on CPU and GPU ranks. The alltoall layer takes
the group's plan from the placement; distributed-embeddings plans by itself
from the same thresholds.
"""
from __future__ import annotations

import tensorflow as tf

from recsys.embeddings.alltoall import ModelParallelEmbedding
from recsys.embeddings.combine import combine
from recsys.embeddings.seeding import ColumnSeededUniform, SeededEmbedding, new_table_seed


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
    """The tables of one :class:`recsys.embeddings.tables.TableGroup`; call(list of [B] or [B, hot]
    id tensors, in table order) -> list of [B, width].

    ``placement``: the run's :class:`recsys.embeddings.placement.Placement`; None or a replicated
    one keeps every table on every rank. ``hvd``: the Horovod module (tests give a stand-in).
    """

    def __init__(self, group, placement=None, hvd=None, **kw):
        super().__init__(name=group.name, **kw)
        self.group = group
        self.cardinalities, self.dims, self.combiners = group.cardinalities, group.widths, group.combiners
        self.seed = new_table_seed()
        self.model_parallel = placement is not None and placement.model_parallel
        self._dist = self._mp = None
        self.tables = []
        if self.model_parallel and distributed_embeddings_module() is None:
            self._mp = ModelParallelEmbedding(self.cardinalities, self.dims, self.combiners, self.seed,
                                              placement.plan(group.name), hvd=hvd, name="mp")
            return
        if self.model_parallel:     # distributed-embeddings builds the tables itself, from their initializer
            self.tables = [tf.keras.layers.Embedding(c, d, embeddings_initializer=ColumnSeededUniform(self.seed, i),
                                                     name=f"table_{i}")
                           for i, (c, d) in enumerate(zip(self.cardinalities, self.dims))]
            dmp = distributed_embeddings_module()
            kw = ({} if placement.data_parallel_threshold is None
                  else {"data_parallel_threshold": placement.data_parallel_threshold})
            self._dist = dmp.DistributedEmbedding(self.tables, strategy="memory_balanced",
                                                  column_slice_threshold=placement.column_slice_threshold, **kw)
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
        return [combine(o, i, c) for o, i, c in zip(outs, ids, self.combiners)]
