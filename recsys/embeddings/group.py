"""The EmbeddingGroup layer: one group's tables, replicated or model parallel as the run's placement says.

Model parallel uses the placement's implementation (``--embedding-implementation``):
``horovod-alltoall`` (the default), :class:`recsys.embeddings.alltoall.ModelParallelEmbedding`,
which runs on CPU and GPU ranks and takes the group's plan from the placement; or, only when
asked for, NVIDIA ``distributed-embeddings`` (GPU nodes with its CUDA op; not on PyPI, shipped in
NVIDIA's Merlin TensorFlow containers), which plans by itself from the same thresholds and is
used through its documented contract (:mod:`recsys.embeddings.de_adapter`).
"""
from __future__ import annotations

import tensorflow as tf

from recsys.embeddings import de_adapter
from recsys.embeddings.alltoall import ModelParallelEmbedding
from recsys.embeddings.combine import combine
from recsys.embeddings.seeding import SeededEmbedding, new_table_seed


def uses_distributed_embeddings(model):
    """True when a layer of ``model`` is NVIDIA distributed-embeddings: the engine then takes the
    gradients through its tape (:func:`distributed_tape`) and broadcasts with :func:`broadcast`."""
    return any(isinstance(m, EmbeddingGroup) and m.implementation == de_adapter.IMPLEMENTATION
               for m in model.submodules)


distributed_tape = de_adapter.distributed_tape
broadcast = de_adapter.broadcast


def _pad_rows(ids, rows):
    """[n, ...] ids padded with -1 (no id) to ``rows`` rows, with that static shape."""
    n = tf.shape(ids)[0]
    pad = [[0, rows - n]] + [[0, 0]] * (ids.shape.rank - 1)
    return tf.ensure_shape(tf.pad(ids, pad, constant_values=-1), [rows] + ids.shape.as_list()[1:])


def ragged_feed(ids):
    """DE's ragged input for one table's [B] or [B, hot] ids (padding -1), and the rows to zero after
    the lookup (None: none can be empty).

    DE 1.0's ``embedding_lookup`` (``python/ops/embedding_lookup_ops.py`` at 4cb42d4) assumes "no
    empty sample": a ragged batch with as many ids as rows is looked up as one id per row, so
    ``[[5, 6], [], [7]]`` sums to ``[5, 6, 7]`` instead of ``[11, 0, 7]``. No row is ever empty
    here: a row without ids (a multi-hot feature with no value, an evaluation padding row) gets id
    0, and its output is zeroed afterwards, so row 0 takes an exactly zero gradient from it, as the
    replicated lookup's padding does (``combine``). With no empty row, the shortcut is taken only
    when every row has exactly one id, where it is right."""
    if ids.shape.rank == 1:
        return tf.RaggedTensor.from_tensor(tf.maximum(ids, 0)[:, None]), None
    valid = ids >= 0
    empty = tf.logical_not(tf.reduce_any(valid, axis=1))
    keep = tf.concat([valid[:, :1] | empty[:, None], valid[:, 1:]], axis=1)
    return tf.ragged.boolean_mask(tf.maximum(ids, 0), keep), empty


class EmbeddingGroup(tf.keras.layers.Layer):
    """The tables of one :class:`recsys.placement.tables.TableGroup`; call(list of [B] or [B, hot]
    id tensors, in table order) -> list of [B, width].

    ``placement``: the run's :class:`recsys.placement.decision.Placement`; None or a replicated
    one keeps every table on every rank. ``hvd``: the Horovod module (tests give a stand-in).
    """

    def __init__(self, group, placement=None, hvd=None, **kw):
        super().__init__(name=group.name, **kw)
        self.group = group
        self.cardinalities, self.dims, self.combiners = group.cardinalities, group.widths, group.combiners
        self.seed = new_table_seed()
        self.model_parallel = placement is not None and placement.model_parallel
        self._mp = None
        self._de_attr = None
        self.tables = []
        if self.model_parallel and placement.implementation == de_adapter.IMPLEMENTATION:
            # All inputs of a DE layer go in one kind: ragged with a combiner when any table is multi-hot
            # (DE 4cb42d4 returns a rank's exchanged dense inputs before its ragged ones, whatever the
            # table order: a mix feeds tables the wrong ids), else dense one-hot ids.
            self._ragged = any(c is not None for c in self.combiners)
            data_parallel_threshold = placement.data_parallel_threshold
            if placement.data_parallel_group(group.name):
                # DE cannot give every rank a piece of this group (the placement says why): every
                # table at or under DE's data-parallel threshold, so DE keeps them all data parallel.
                data_parallel_threshold = max(c * d for c, d in zip(self.cardinalities, self.dims))
            layer = de_adapter.make_layer(self.cardinalities, self.dims, [self._ragged] * len(self.dims),
                                          column_slice_threshold=placement.column_slice_threshold,
                                          data_parallel_threshold=data_parallel_threshold)
            # Tracked under a name of its layout: a checkpoint of another layout (world size, thresholds)
            # has other shard shapes, and its keys then do not match (the tables come back whole,
            # through set_weights: recsys.checkpoints.sharded); the same layout restores as saved.
            self._de_attr = de_adapter.layout_name(layer)
            setattr(self, self._de_attr, layer)
            self._batch_rows = (placement.local_batch, placement.local_eval_batch)
        elif self.model_parallel:
            self._mp = ModelParallelEmbedding(self.cardinalities, self.dims, self.combiners, self.seed,
                                              placement.plan(group.name), hvd=hvd, name="mp")
        else:
            self.tables = [SeededEmbedding(c, d, self.seed, i, name=f"table_{i}")
                           for i, (c, d) in enumerate(zip(self.cardinalities, self.dims))]

    @property
    def _dist(self):
        """The distributed-embeddings layer, or None."""
        return getattr(self, self._de_attr) if self._de_attr else None

    @property
    def layout(self):
        """What must match for this group's shards to restore as saved: the implementation, and for
        distributed-embeddings its layout (the name without the rank)."""
        return self._de_attr.replace(f"_rank{self._dist.rank}_", "_") if self._de_attr else self.implementation

    @property
    def implementation(self):
        return ("horovod-alltoall" if self._mp is not None else
                de_adapter.IMPLEMENTATION if self._de_attr else "replicated")

    def local_variables(self):
        """Variables that live on this rank only (neither broadcast nor allreduced)."""
        if self._mp is not None:
            return self._mp.local_variables()
        return [v for v in self._dist.weights if de_adapter.is_local(v)] if self._de_attr else []

    def seeded_variables(self):
        """Tables every rank initialises identically from this group's seed, so the engine need not
        broadcast them: replicated tables, and the small tables a model-parallel layer keeps
        replicated. distributed-embeddings' data-parallel tables go through its broadcast instead."""
        if self._mp is not None:
            return list(self._mp.dp_tables.values())
        return [] if self._de_attr else [t.embeddings for t in self.tables]

    def build(self, input_shape):
        layer = self._dist
        if layer is not None and not layer.built:
            layer.build(list(input_shape))      # DE refuses ranks with different batch sizes here
            # Whole seeded tables in through DE's set_weights: the replicated run's values (DE's own
            # initialisers would start every column slice at column 0 and give a concatenated
            # table its first table's initializer); each rank computes only its own slices.
            with tf.init_scope():
                de_adapter.set_global(layer, [de_adapter.seeded_table(self.seed, i, c, d) for i, (c, d)
                                              in enumerate(zip(self.cardinalities, self.dims))])
        super().build(input_shape)

    def call(self, ids, training=None):
        if self._mp is not None:
            return self._mp(ids)
        if self._de_attr:
            return self._call_distributed(ids, training)
        outs = [t(tf.maximum(i, 0)) for t, i in zip(self.tables, ids)]
        return [combine(o, i, c) for o, i, c in zip(outs, ids, self.combiners)]

    def _call_distributed(self, ids, training):
        """DE needs one batch size on every rank: every batch is padded to the per-rank batch of its
        kind (training: ``--batch-size``, evaluation: ``--eval-batch-size``, over the ranks; the last
        evaluation batch is short, lockstep's are empty), with that static shape, and its outputs are
        cut back (padded rows get no gradient). Multi-hot ids go in ragged (padding -1 dropped, never an empty
        row: :func:`ragged_feed`) to the ``sum`` combiner (then every input of the group does, see __init__);
        a mean divides by the row's id count (0 for an empty row, as ``combine``)."""
        train_rows, eval_rows = self._batch_rows
        rows = train_rows if training else eval_rows
        n = tf.shape(ids[0])[0]
        if rows:
            check = tf.debugging.assert_less_equal(
                n, rows, message=f"{self.name}: distributed-embeddings needs every batch of at most {rows} rows "
                                 f"per rank (the same on every rank)")
            with tf.control_dependencies([check]):
                ids = [_pad_rows(i, rows) for i in ids]
        empty = [None] * len(ids)
        if self._ragged:        # one-hot rows as ragged rows of one id ([B, 1], as DE's examples do)
            feeds, empty = zip(*[ragged_feed(i) for i in ids])
        else:
            feeds = [tf.maximum(i, 0) for i in ids]
        outs = self._dist(list(feeds))
        result = []
        for o, i, c, e in zip(outs, ids, self.combiners, empty):
            if e is not None:       # rows without ids: 0 (they were looked up as id 0, see ragged_feed)
                o = o * tf.cast(tf.logical_not(e), o.dtype)[:, None]
            if i.shape.rank > 1 and c == "mean":
                o = o / tf.maximum(tf.reduce_sum(tf.cast(i >= 0, o.dtype), axis=1, keepdims=True), 1.0)
            result.append(o[:n] if rows else o)
        return result
