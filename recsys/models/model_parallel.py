"""Model-parallel embedding tables exchanged with Horovod alltoall (CPU or GPU ranks).

Each rank holds only its share of a group's tables as planned by
:func:`recsys.placement.plan_for_group` (whole tables or column slices; tables
under the data-parallel threshold replicated). A forward pass:

1. every rank sends, to each owning rank, the ids of its local batch for the
   tables (slices) that rank holds: one ``hvd.alltoall`` with splits;
2. owners look the ids up in their slices (multi-hot rows combined there,
   sum or mean, so only ``[B, width]`` vectors travel back);
3. the vectors come back with a second ``hvd.alltoall`` and the column slices
   of a table are concatenated in column order.

Horovod's alltoall gradient sends the vector gradients back the same way, so
the slice gradients land on their owner only and are never allreduced (the
engine leaves :meth:`local_variables` out of its allreduce). Each rank's loss is
the mean over its local batch and the replicated path averages gradients over
ranks, so the returned vectors scale their gradient by 1/world: both paths
apply the same update.
"""
from __future__ import annotations

import random

import tensorflow as tf

from recsys.placement import plan_for_group


SEED_BLOCK_ROWS = 65536


def _column_block(seed, key, block, rows, lim):
    """[rows] of U(-lim, lim) drawn from (seed, column key, block) alone (block < 2^16 keeps the
    seeds distinct: tables up to 2^16 blocks x SEED_BLOCK_ROWS = 2^32 rows)."""
    return tf.random.stateless_uniform([rows], seed=tf.constant([seed, key * 65536 + block], tf.int64),
                                       minval=-lim, maxval=lim, dtype=tf.float32)


def seeded_blocks(seed, table, col_start, rows, width):
    """Yield (first row, [n, width] block) of the seeded values of columns col_start.. of a table
    with ``rows`` rows, U(-1/sqrt(rows), 1/sqrt(rows)).

    A value depends only on (seed, table, column, block of SEED_BLOCK_ROWS rows), so a column is
    the same whichever rank or slice holds it: a model-parallel run starts from exactly the
    weights of a replicated one."""
    lim = rows ** -0.5
    for r0 in range(0, rows, SEED_BLOCK_ROWS):
        n, block = min(SEED_BLOCK_ROWS, rows - r0), r0 // SEED_BLOCK_ROWS
        # eager ops, one per column: no tf.function to trace in every process (0.5 s each)
        yield r0, tf.stack([_column_block(seed, table * 100003 + col_start + c, block, n, lim)
                            for c in range(width)], axis=1)


def fill_seeded(variable, seed, table, col_start=0):
    """Write the seeded values into a table variable in place, a block of rows at a time.

    A table is created as zeros and filled here rather than from an initializer, because an
    initializer returns the whole table as one tensor: its per-column temporaries stayed in the
    process (measured: the first 256 MiB table cost 0.55 GiB of RSS); block by block the process
    grows by the table's bytes and ~30 MB once."""
    rows, width = (int(d) for d in variable.shape)
    for r0, block in seeded_blocks(seed, table, col_start, rows, width):
        variable.scatter_update(tf.IndexedSlices(tf.cast(block, variable.dtype),
                                                 tf.range(r0, r0 + int(block.shape[0]))))


class ColumnSeededUniform(tf.keras.initializers.Initializer):
    """The values of :func:`seeded_blocks` as a Keras initializer (one whole tensor), for layers
    built by others (distributed-embeddings); our layers use :func:`fill_seeded`."""

    def __init__(self, seed, table, col_start=0):
        self.seed, self.table, self.col_start = int(seed), int(table), int(col_start)

    def __call__(self, shape, dtype=None, **kwargs):
        rows, width = int(shape[0]), int(shape[1])
        blocks = [b for _, b in seeded_blocks(self.seed, self.table, self.col_start, rows, width)]
        return tf.cast(tf.concat(blocks, 0), tf.as_dtype(dtype or tf.float32))

    def get_config(self):
        return {"seed": self.seed, "table": self.table, "col_start": self.col_start}


class SeededEmbedding(tf.keras.layers.Embedding):
    """A Keras Embedding whose table is filled in place from (seed, table, column), see :func:`fill_seeded`."""

    def __init__(self, input_dim, output_dim, seed, table, **kw):
        super().__init__(input_dim, output_dim, embeddings_initializer="zeros", **kw)
        self.seed, self.table = int(seed), int(table)

    def build(self, input_shape=None):
        super().build(input_shape)
        fill_seeded(self.embeddings, self.seed, self.table)

    def get_config(self):
        config = dict(super().get_config(), seed=self.seed, table=self.table)
        config.pop("embeddings_initializer", None)
        return config


def new_table_seed():
    """Base seed of a group's tables: drawn from Python's RNG, which ``set_random_seed`` seeds
    identically on every rank and in both placements."""
    return random.randint(0, 2**30)


def combine(vectors, ids, combiner):
    """[B, hot, w] vectors of [B, hot] ids (padding -1) -> [B, w]; one-hot [B, w] unchanged."""
    if ids.shape.rank == 1:
        return vectors
    mask = tf.cast(ids >= 0, vectors.dtype)[..., None]
    total = tf.reduce_sum(vectors * mask, axis=1)
    if combiner == "mean":
        total = total / tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)
    return total


@tf.custom_gradient
def _scale_gradient(x, scale):
    def grad(dy):
        return dy * tf.cast(scale, dy.dtype), None
    return tf.identity(x), grad


def slice_key(s):
    return f"t{s.table}_c{s.col_start}_{s.col_end}"


class ModelParallelEmbedding(tf.keras.layers.Layer):
    """call(list of [B] / [B, hot] id tensors) -> list of [B, dim] vectors, tables spread over ranks."""

    def __init__(self, cardinalities, dims, combiners, seed, column_slice_threshold=None,
                 data_parallel_threshold=None, hvd=None, name="model_parallel", **kw):
        super().__init__(name=name, **kw)
        if hvd is None:
            import horovod.tensorflow as hvd
        self.hvd = hvd
        self.world, self.rank = hvd.size(), hvd.rank()
        self.cardinalities, self.dims, self.combiners = list(cardinalities), list(dims), list(combiners)
        self.seed = int(seed)
        self.plan = plan_for_group(self.cardinalities, self.dims, self.world, column_slice_threshold,
                                   data_parallel_threshold)
        self.by_rank = [sorted((s for s in self.plan.slices if s.rank == r and not s.replicated),
                               key=lambda s: (s.table, s.col_start)) for r in range(self.world)]
        self.mine = self.by_rank[self.rank]
        self.replicated_tables = sorted({s.table for s in self.plan.slices if s.replicated})
        self.id_dtype = tf.int32 if max(self.cardinalities) < 2**31 else tf.int64
        self.shards, self.dp_tables = {}, {}

    def build(self, input_shape):
        for s in self.mine:
            self.shards[slice_key(s)] = self.add_weight(
                name=slice_key(s), shape=[s.rows, s.col_end - s.col_start], trainable=True, initializer="zeros")
            fill_seeded(self.shards[slice_key(s)], self.seed, s.table, s.col_start)
        for t in self.replicated_tables:
            self.dp_tables[f"t{t}"] = self.add_weight(
                name=f"t{t}", shape=[self.cardinalities[t], self.dims[t]], trainable=True, initializer="zeros")
            fill_seeded(self.dp_tables[f"t{t}"], self.seed, t)
        super().build(input_shape)

    def local_variables(self):
        """The slices only this rank holds (no broadcast, no allreduce)."""
        return [self.shards[slice_key(s)] for s in self.mine]

    def shard_map(self):
        """{(table, col_start, col_end): variable} of this rank's slices."""
        return {(s.table, s.col_start, s.col_end): self.shards[slice_key(s)] for s in self.mine}

    def replicated_map(self):
        """{(table, 0, dim): variable} of the small tables every rank holds."""
        return {(t, 0, self.dims[t]): self.dp_tables[f"t{t}"] for t in self.replicated_tables}

    def call(self, ids):
        ids = [tf.cast(i, self.id_dtype) for i in ids]
        hots = [1 if i.shape.rank == 1 else int(i.shape[1]) for i in ids]
        batch = tf.shape(ids[0])[0]
        flat = [tf.reshape(i, [-1]) for i in ids]
        # 1. ids to the owners: chunk for rank r = the ids of each table it holds a slice of.
        send, splits = [], []
        for r in range(self.world):
            send += [flat[s.table] for s in self.by_rank[r]]
            splits.append(batch * sum(hots[s.table] for s in self.by_rank[r]))
        recv, recv_splits = self.hvd.alltoall(tf.concat(send, 0) if send else tf.zeros([0], self.id_dtype),
                                              splits=tf.stack(splits), name=f"{self.name}_ids")
        # 2. look up this rank's slices for the whole global batch (sources concatenated in rank order).
        my_hot = sum(hots[s.table] for s in self.mine)
        width = sum(s.col_end - s.col_start for s in self.mine)
        if self.mine:
            per_source = recv_splits // my_hot                                   # B_q of every source q
            chunks = tf.split(recv, recv_splits, num=self.world)
            parts = [tf.split(c, [b * hots[s.table] for s in self.mine], num=len(self.mine))
                     for c, b in zip(chunks, tf.unstack(per_source, num=self.world))]
            out = []
            for k, s in enumerate(self.mine):
                hot = hots[s.table]
                table_ids = tf.concat([p[k] for p in parts], 0)
                table_ids = table_ids if ids[s.table].shape.rank == 1 else tf.reshape(table_ids, [-1, hot])
                vec = tf.gather(self.shards[slice_key(s)], tf.maximum(table_ids, 0))
                out.append(combine(vec, table_ids, self.combiners[s.table]))
            back = tf.reshape(tf.concat(out, 1), [-1])
            back_splits = per_source * width
        else:
            back = tf.zeros([0], self.dtype)            # the tables' dtype, as the other ranks send
            back_splits = tf.zeros([self.world], tf.int32)
        # 3. vectors back to the rank that asked; gradients return the same way, scaled to the average.
        widths = [sum(s.col_end - s.col_start for s in self.by_rank[r]) for r in range(self.world)]
        vectors, _ = self.hvd.alltoall(back, splits=tf.cast(back_splits, tf.int32), name=f"{self.name}_vectors")
        vectors = _scale_gradient(vectors, 1.0 / self.world)
        blocks = tf.split(vectors, [batch * w for w in widths], num=self.world)
        columns = {}
        for r, block in enumerate(blocks):
            if not widths[r]:
                continue
            block = tf.reshape(block, [batch, widths[r]])
            for s, piece in zip(self.by_rank[r], tf.split(block, [s.col_end - s.col_start for s in self.by_rank[r]],
                                                          axis=1)):
                columns.setdefault(s.table, []).append((s.col_start, piece))
        result = []
        for t, i in enumerate(ids):
            if f"t{t}" in self.dp_tables:
                # Named explicitly: Horovod matches the (allreduced) gradients of these replicated tables
                # across ranks by name, and the op counters differ per rank (different shard counts).
                vec = tf.gather(self.dp_tables[f"t{t}"], tf.maximum(i, 0), name=f"replicated_table_{t}")
                result.append(combine(vec, i, self.combiners[t]))
            else:
                pieces = [p for _, p in sorted(columns[t], key=lambda x: x[0])]
                result.append(pieces[0] if len(pieces) == 1 else tf.concat(pieces, 1))
        return result


def lockstep(dataset, dist):
    """Iterate ``dataset`` in step with the other ranks: a rank out of batches yields empty ones
    (zero rows) until every rank is done, so the alltoall of each batch has all ranks in it."""
    import numpy as np
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


def placement_for_task(args, dist, log, model):
    """The Task's placement: False (replicated) or the PlacementChoice, logged once with the implementation."""
    from recsys.models.embeddings import model_parallel_implementation
    from recsys.placement import PlacementChoice
    mode = getattr(args, "placement_mode", None) or ("replicated" if args.embedding_placement != "model_parallel"
                                                     else "model_parallel")
    if mode != "model_parallel" or dist.size == 1 or model == "ncf":
        if dist.size > 1:
            reason = getattr(args, "placement_reason", "")
            log.info(f"embedding tables replicated on every rank ({reason or 'requested'}; gradients allreduced)")
        return False
    choice = PlacementChoice("model_parallel", getattr(args, "placement_reason", "requested"),
                             column_slice_threshold=args.column_slice_threshold,
                             data_parallel_threshold=getattr(args, "data_parallel_threshold", None))
    log.info(f"embedding tables model parallel on {dist.size} ranks ({choice.reason}); "
             f"implementation: {model_parallel_implementation()}")
    return choice
