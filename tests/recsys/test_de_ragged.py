"""distributed-embeddings is never handed a ragged batch it mishandles (recsys.embeddings.group.ragged_feed).

DE 1.0's ``embedding_lookup`` (python/ops/embedding_lookup_ops.py at 4cb42d4) assumes "no empty
sample": a ragged batch with as many ids as rows is looked up as one id per row. The engine's
multi-hot features can have rows without ids (no value; evaluation padding rows), so the group
gives such a row id 0 and zeroes its output.

The DE test runs DE's own Python code (its ``Embedding`` layer, ``embedding_lookup`` and
``DistributedEmbedding`` on one Horovod rank) with only its CUDA op library stood in for by
TensorFlow ops that combine a ragged batch correctly, empty rows included: what goes wrong is DE's
Python shortcut, not the stand-in. DE is not on PyPI and the repository does not carry its code:
give a checkout of NVIDIA-Merlin/distributed-embeddings (4cb42d4) as ``RECSYS_DE_SOURCE``; without it
that test is skipped. Measured: about 10 s (a subprocess that imports TensorFlow and Horovod).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, base_env

DE_SOURCE = os.environ.get("RECSYS_DE_SOURCE")

_SCRIPT = textwrap.dedent("""\
    import json, sys, types
    import numpy as np
    import tensorflow as tf

    # DE's package __init__ imports a version.py written by its build: reach its modules without it.
    pkg = types.ModuleType("distributed_embeddings")
    pkg.__path__ = [sys.argv[1] + "/distributed_embeddings"]
    sys.modules["distributed_embeddings"] = pkg

    class StandIn:
        # _embedding_lookup_ops.so: a correct CSR combine (empty rows give 0) and a plain read.
        @staticmethod
        def embedding_lookup_variable_hotness(param, values, row_splits, combiner):
            segments = tf.ragged.row_splits_to_segment_ids(row_splits)
            rows = tf.shape(row_splits)[0] - 1
            out = tf.math.unsorted_segment_sum(tf.gather(param, values), segments, rows)
            if combiner == "mean":
                count = tf.math.unsorted_segment_sum(tf.ones_like(values, param.dtype), segments, rows)
                out = out / tf.maximum(count, 1)[:, None]
            return out

        @staticmethod
        def read_variable_no_copy(handle, dtype):
            from tensorflow.python.ops import gen_resource_variable_ops
            return gen_resource_variable_ops.read_variable_op(handle, dtype)

    real_load = tf.load_op_library
    tf.load_op_library = lambda path: StandIn if path.endswith("_embedding_lookup_ops.so") else real_load(path)
    from distributed_embeddings.python.ops import embedding_lookup_ops

    out = {}
    # 1. DE's lookup itself: 3 rows, 3 ids, one row empty.
    table = tf.Variable(np.arange(20, dtype=np.float32).reshape(10, 2))
    premise = embedding_lookup_ops.embedding_lookup(table, tf.ragged.constant([[5, 6], [], [7]], tf.int64), "sum")
    out["premise"] = premise.numpy()[:, 0].tolist()

    # 2. An EmbeddingGroup on DE's DistributedEmbedding (1 rank), fed ids with an empty row.
    from recsys.embeddings.group import EmbeddingGroup
    from recsys.embeddings.placement import place
    from recsys.embeddings.tables import Table, TableGroup
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
    print("RESULT " + json.dumps(out))
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


@pytest.mark.skipif(not DE_SOURCE, reason="RECSYS_DE_SOURCE (a distributed-embeddings 4cb42d4 checkout) not set")
def test_distributed_embeddings_sums_rows_with_empty_ones_as_the_replicated_lookup():
    env = base_env()
    env["PYTHONPATH"] = f"{REPO}:{env['PYTHONPATH']}"
    res = subprocess.run([sys.executable, "-c", _SCRIPT, str(Path(DE_SOURCE).resolve())], env=env, cwd=REPO,
                         text=True, capture_output=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(next(line for line in res.stdout.splitlines() if line.startswith("RESULT "))[7:])
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
