"""Model-parallel embedding tables exchanged with Horovod alltoall (CPU or GPU ranks).

Each rank holds only its share of a group's tables, as the run's placement
(:mod:`recsys.embeddings.placement`, decided before TensorFlow started) plans
them: whole tables or column slices, tables under the data-parallel threshold
replicated. The layer takes that plan as it is. A forward pass:

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

import tensorflow as tf

from recsys.embeddings.combine import combine
from recsys.embeddings.seeding import fill_seeded


@tf.custom_gradient
def _scale_gradient(x, scale):
    def grad(dy):
        return dy * tf.cast(scale, dy.dtype), None
    return tf.identity(x), grad


def slice_key(s):
    return f"t{s.table}_c{s.col_start}_{s.col_end}"


class ModelParallelEmbedding(tf.keras.layers.Layer):
    """call(list of [B] / [B, hot] id tensors) -> list of [B, dim] vectors, tables spread over ranks."""

    def __init__(self, cardinalities, dims, combiners, seed, plan, hvd=None, name="model_parallel", **kw):
        super().__init__(name=name, **kw)
        if hvd is None:
            import horovod.tensorflow as hvd
        self.hvd = hvd
        self.world, self.rank = hvd.size(), hvd.rank()
        self.cardinalities, self.dims, self.combiners = list(cardinalities), list(dims), list(combiners)
        self.seed = int(seed)
        planned = sorted({(s.table, s.rows) for s in plan.slices})
        if plan.world_size != self.world or planned != list(enumerate(self.cardinalities)):
            raise ValueError(f"{name}: a plan of {len(planned)} tables on {plan.world_size} ranks given to "
                             f"{len(self.cardinalities)} tables on {self.world} ranks")
        self.plan = plan
        self.by_rank = [sorted((s for s in plan.slices if s.rank == r and not s.replicated),
                               key=lambda s: (s.table, s.col_start)) for r in range(self.world)]
        self.mine = self.by_rank[self.rank]
        self.replicated_tables = sorted({s.table for s in plan.slices if s.replicated})
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
