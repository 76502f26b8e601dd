"""distributed-embeddings is never handed a ragged batch it mishandles (recsys.embeddings.group.ragged_feed).

DE 1.0's ``embedding_lookup`` (python/ops/embedding_lookup_ops.py at 4cb42d4) assumes "no empty
sample": a ragged batch with as many ids as rows is looked up as one id per row. The engine's
multi-hot features can have rows without ids (no value; evaluation padding rows), so the group
gives such a row id 0 and zeroes its output.

The DE test runs DE's own Python code (its ``Embedding`` layer, ``embedding_lookup`` and
``DistributedEmbedding`` on one Horovod rank) with only its CUDA op library stood in for by
TensorFlow ops that combine a ragged batch correctly, empty rows included: what goes wrong is DE's
Python shortcut, not the stand-in (de_source.py). It needs DE's source, ``RECSYS_DE_SOURCE`` (a
checkout of NVIDIA-Merlin/distributed-embeddings at 4cb42d4); without it that test is skipped.
Measured: about 10 s (a subprocess that imports TensorFlow and Horovod).
"""
from __future__ import annotations

import textwrap

import numpy as np

from de_source import needs_de_source, run_with_de

# Runs behind de_source.PRELUDE (DE importable, its op library stood in for, write_result).
_SCRIPT = textwrap.dedent("""\
    import numpy as np
    import tensorflow as tf
    from distributed_embeddings.python.ops import embedding_lookup_ops

    out = {}
    # 1. DE's lookup itself: 3 rows, 3 ids, one row empty.
    table = tf.Variable(np.arange(20, dtype=np.float32).reshape(10, 2))
    premise = embedding_lookup_ops.embedding_lookup(table, tf.ragged.constant([[5, 6], [], [7]], tf.int64), "sum")
    out["premise"] = premise.numpy()[:, 0].tolist()

    # 2. An EmbeddingGroup on DE's DistributedEmbedding (1 rank), fed ids with an empty row.
    from recsys.embeddings.group import EmbeddingGroup
    from recsys.placement.decision import place
    from recsys.placement.tables import Table, TableGroup
    group = TableGroup("deep", (Table("a", "a", "multihot", 10, 3, "sum"), Table("b", "b", "multihot", 12, 2, "mean"),
                                Table("c", "c", "cat", 9, 4)))
    placement = place("model_parallel", "test", 1, [group], implementation="distributed-embeddings",
                      local_batch=4, local_eval_batch=4)
    layer = EmbeddingGroup(group, placement)
    ids = [tf.constant([[5, 6], [-1, -1], [7, -1], [8, -1]], tf.int64),      # 4 ids in 4 rows, one empty
           tf.constant([[-1, -1], [3, 4], [1, -1], [-1, -1]], tf.int64),     # 3 ids in 4 rows, two empty
           tf.constant([2, 0, 5, 8], tf.int64)]
    with tf.GradientTape() as tape:
        outs = layer(ids, training=True)
        loss = tf.add_n([tf.reduce_sum(o) for o in outs])
    weights = layer.weights
    grads = tape.gradient(loss, weights)
    out["outputs"] = [o.numpy().tolist() for o in outs]
    out["tables"] = [np.asarray(w).tolist() for w in layer._dist.get_weights()]
    out["grads"] = [tf.convert_to_tensor(g).numpy().tolist() for g in grads]
    out["weight_shapes"] = [list(w.shape) for w in weights]
    write_result(out)
""")


def test_ragged_feed_has_no_empty_row_and_marks_the_rows_to_zero():
    """What DE gets: every row holds at least one id (an empty row id 0, marked to be zeroed)."""
    import tensorflow as tf

    from recsys.embeddings.group import ragged_feed
    feed, empty = ragged_feed(tf.constant([[5, 6, -1], [-1, -1, -1], [7, -1, -1]], tf.int64))
    assert feed.to_list() == [[5, 6], [0], [7]]
    assert empty.numpy().tolist() == [False, True, False]
    one_hot, none = ragged_feed(tf.constant([3, -1], tf.int64))
    assert one_hot.to_list() == [[3], [0]] and none is None


@needs_de_source
def test_distributed_embeddings_sums_rows_with_empty_ones_as_the_replicated_lookup(tmp_path):
    out = run_with_de(_SCRIPT, tmp_path)[0]
    # DE's own shortcut: [[5, 6], [], [7]] over a table whose row k starts with 2k gives rows 5, 6, 7
    # (10, 12, 14) instead of the sums 10+12, 0, 14. If this changes, DE no longer has the bug.
    assert out["premise"] == [10.0, 12.0, 14.0]

    a, b, c = (np.asarray(t) for t in out["tables"])
    want_a = np.stack([a[5] + a[6], np.zeros(3), a[7], a[8]])
    want_b = np.stack([np.zeros(2), (b[3] + b[4]) / 2, b[1], np.zeros(2)])
    want_c = c[[2, 0, 5, 8]]
    for got, want in zip(out["outputs"], (want_a, want_b, want_c)):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    # Gradients of the sum of outputs: each looked-up row once (a mean's ids 1/2), row 0 of a and b
    # nothing from the empty rows that were looked up as id 0.
    grad_a = np.zeros_like(a)
    grad_a[[5, 6, 7, 8]] = 1
    grad_b = np.zeros_like(b)
    grad_b[[3, 4]] = 0.5
    grad_b[1] = 1
    grad_c = np.zeros_like(c)
    np.add.at(grad_c, [2, 0, 5, 8], 1)
    grads = {tuple(s): np.asarray(g) for s, g in zip(out["weight_shapes"], out["grads"])}
    for want in (grad_a, grad_b, grad_c):
        np.testing.assert_array_equal(grads[want.shape], want)
