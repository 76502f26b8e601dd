"""Model-parallel embedding tables exchanged with Horovod alltoall (CPU or GPU ranks).

Each rank holds only its share of a group's tables, as the run's placement
(:mod:`recsys.placement.decision`, decided before TensorFlow started) plans
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

:meth:`ModelParallelEmbedding.exchange_only` runs the three exchanges of a step alone, on the ids
of a traced call, for the engine's step breakdown (``--breakdown-steps``), and counts their bytes;
under :meth:`ModelParallelEmbedding.local_exchange` a call traces no exchange at all (local stand-ins
of the same shapes), so the breakdown times compute on its own.
"""
from __future__ import annotations

import contextlib

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


def sent_bytes(splits, rank, dtype):
    """Bytes an alltoall with send ``splits`` (elements per rank) moves from ``rank`` to the other
    ranks (its own chunk never leaves it): the one count of this module's exchange bytes."""
    splits = tf.cast(splits, tf.int64)
    return (tf.reduce_sum(splits) - splits[rank]) * tf.constant(tf.as_dtype(dtype).size, tf.int64)


class _Traced:
    """Plain holder (not tracked by Keras) of the ids of the layer's latest call."""
    ids = None


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
        self._traced = _Traced()
        self._local = False             # local_exchange(): trace local stand-ins instead of the alltoalls

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

    def _ids_to_owners(self, ids):
        """Step 1: every rank sends each owner the ids of the tables (slices) it holds.
        Returns (ids cast, hots, local batch, received ids, received splits, send splits)."""
        ids = [tf.cast(i, self.id_dtype) for i in ids]
        hots = [1 if i.shape.rank == 1 else int(i.shape[1]) for i in ids]
        batch = tf.shape(ids[0])[0]
        flat = [tf.reshape(i, [-1]) for i in ids]
        # chunk for rank r = the ids of each table it holds a slice of.
        send, splits = [], []
        for r in range(self.world):
            send += [flat[s.table] for s in self.by_rank[r]]
            splits.append(batch * sum(hots[s.table] for s in self.by_rank[r]))
        splits = tf.stack(splits)
        send = tf.concat(send, 0) if send else tf.zeros([0], self.id_dtype)
        if self._local:
            # stand-in: every rank sends this rank what it sends itself (equal local batches: same shapes)
            recv = tf.tile(tf.split(send, splits, num=self.world)[self.rank], [self.world])
            return ids, hots, batch, recv, tf.fill([self.world], splits[self.rank]), splits
        recv, recv_splits = self.hvd.alltoall(send, splits=splits, name=f"{self.name}_ids")
        return ids, hots, batch, recv, recv_splits, splits

    def _widths(self):
        """Columns every rank holds (the width of its block of the returned vectors)."""
        return [sum(s.col_end - s.col_start for s in self.by_rank[r]) for r in range(self.world)]

    def _back_splits(self, recv_splits, hots):
        """Elements of looked-up vectors this rank sends back to each source rank."""
        if not self.mine:
            return tf.zeros([self.world], tf.int32)
        my_hot = sum(hots[s.table] for s in self.mine)
        width = sum(s.col_end - s.col_start for s in self.mine)
        return tf.cast((recv_splits // my_hot) * width, tf.int32)

    def _vectors_to_askers(self, back, back_splits):
        """Step 3: the looked-up vectors back to the ranks that asked (its gradient: the same way back)."""
        return self.hvd.alltoall(back, splits=back_splits, name=f"{self.name}_vectors")

    def _local_vectors(self, back, back_splits, batch):
        """Stand-in of step 3 under :meth:`local_exchange`: for each rank's block, this rank's own
        looked-up vectors with their columns repeated to that block's width (zeros when it holds
        none); differentiable, so backward reaches the lookups as in the step."""
        width = sum(s.col_end - s.col_start for s in self.mine)
        own = tf.reshape(tf.split(back, back_splits, num=self.world)[self.rank], [batch, width]) if width else None
        blocks = [tf.gather(own, tf.constant([j % width for j in range(w)], tf.int32), axis=1) if width
                  else tf.zeros([batch, w], self.compute_dtype) for w in self._widths()]
        return tf.reshape(tf.concat(blocks, 1), [-1])

    @contextlib.contextmanager
    def local_exchange(self):
        """Calls traced inside trace no exchange: the ids and vectors stay on this rank (same shapes,
        same lookups), for the step breakdown's compute timed on its own. Python-side only: it acts
        on what a tf.function traces while it is open, not on functions traced before."""
        self._local = True
        try:
            yield
        finally:
            self._local = False

    def exchange_only(self, ids):
        """The exchanges of one step on these ids, without the lookups: the ids alltoall, the vectors
        alltoall (same-shaped zeros) and the alltoall Horovod's gradient makes of the vector
        gradients (same shape, same splits). Returns the bytes this rank sent to the other ranks
        (int64 scalar), once all three exchanges are done. The engine times it (step breakdown)."""
        ids, hots, _, recv, recv_splits, splits = self._ids_to_owners(ids)
        back_splits = self._back_splits(recv_splits, hots)
        dtype = self.compute_dtype if self.mine else self.dtype
        vectors, vector_splits = self._vectors_to_askers(tf.zeros([tf.reduce_sum(back_splits)], dtype), back_splits)
        grads, _ = self.hvd.alltoall(tf.zeros_like(vectors), splits=vector_splits, name=f"{self.name}_vector_grads")
        sent = (sent_bytes(splits, self.rank, self.id_dtype) + sent_bytes(back_splits, self.rank, dtype)
                + sent_bytes(vector_splits, self.rank, dtype))
        with tf.control_dependencies([recv, vectors, grads]):
            return tf.identity(sent)

    def traced_ids(self):
        """The ids of the latest call (graph tensors of the function that traced it)."""
        return self._traced.ids

    def call(self, ids):
        ids, hots, batch, recv, recv_splits, _ = self._ids_to_owners(ids)
        self._traced.ids = ids      # this call's ids (graph tensors while tracing), for exchange_only
        # 2. look up this rank's slices for the whole global batch (sources concatenated in rank order).
        my_hot = sum(hots[s.table] for s in self.mine)
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
        else:
            back = tf.zeros([0], self.dtype)            # the tables' dtype, as the other ranks send
        # 3. vectors back to the rank that asked; gradients return the same way, scaled to the average.
        widths = self._widths()
        back_splits = self._back_splits(recv_splits, hots)
        vectors = (self._local_vectors(back, back_splits, batch) if self._local
                   else self._vectors_to_askers(back, back_splits)[0])
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
