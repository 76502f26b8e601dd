"""Plain SGD keeps no state and applies embedding gradients sparsely (docs/embeddings.md, "Memory").

Keras's SGD kept a momentum slot the size of every table even with momentum 0 and applied
the sparse embedding gradients densely: with the broadcast of every table at start, a
replicated rank peaked at about 5x its table bytes. Pinned here with equalities, not memory
readings; the other half (tables seeded, not broadcast, gradients kept IndexedSlices across
ranks) is asserted on the 2-rank runs of tests/recsys/test_model_parallel.py.
"""
import numpy as np


def test_plain_sgd_keeps_no_slot_and_updates_only_the_gradient_rows():
    import tensorflow as tf
    from recsys.models.optim import make_optimizer
    table = np.arange(40, dtype=np.float32).reshape(10, 4) / 7
    var = tf.Variable(table)
    opt = make_optimizer("sgd", 0.5)
    opt.build([var])
    assert [v.name for v in opt.variables] == [opt.iterations.name]          # no momentum slot
    ids = np.array([3, 7, 3], np.int32)                                       # a repeated row
    values = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    opt.apply_gradients([(tf.IndexedSlices(tf.constant(values), tf.constant(ids), tf.constant([10, 4])), var)])
    want = table.copy()
    np.add.at(want, ids, -0.5 * values)
    np.testing.assert_allclose(var.numpy(), want, rtol=0, atol=1e-6)
    untouched = [r for r in range(10) if r not in ids]
    assert (var.numpy()[untouched] == table[untouched]).all()                # bitwise: rows not in the gradient
    # dense gradients: var -= lr * g, as Keras does
    dense = tf.Variable(table)
    opt2 = make_optimizer("sgd", 0.5)
    opt2.apply_gradients([(tf.constant(values[:1].repeat(10, 0)), dense)])
    np.testing.assert_array_equal(dense.numpy(), table - values[:1].repeat(10, 0) * np.float32(0.5))
    # a momentum is Keras's own optimizer, with its slot
    opt3 = make_optimizer("sgd", 0.5, momentum=0.9)
    opt3.build([tf.Variable(table)])
    assert len(opt3.variables) == 2


def test_plain_sgd_applies_repeated_rows_without_keras_deduplication():
    """Keras deduplicates a sparse gradient (tf.unique + unsorted_segment_sum per table) before any
    update; plain SGD's scatter sums a repeated id's rows itself, so its step has neither op, and the
    result is Keras's deduplicated sum (docs/benchmarks.md: 3.7 ms of DLRM's 22 ms step)."""
    import tensorflow as tf
    from recsys.models.optim import make_optimizer
    table = np.arange(40, dtype=np.float32).reshape(10, 4) / 7
    ids = tf.constant(np.array([3, 7, 3, 3, 0], np.int32))
    values = tf.constant(np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4))

    def graph_ops(momentum):
        var = tf.Variable(table)
        opt = make_optimizer("sgd", 0.5, momentum=momentum)
        opt.build([var])
        step = tf.function(lambda: opt.apply_gradients([(tf.IndexedSlices(values, ids, tf.constant([10, 4])), var)]))
        ops = {op.type for op in step.get_concrete_function().graph.get_operations()}
        step()
        return ops, var.numpy()
    plain, got = graph_ops(0.0)
    keras, _ = graph_ops(0.9)
    assert {"Unique", "UnsortedSegmentSum"} <= keras                 # Keras's own path deduplicates
    assert not {"Unique", "UnsortedSegmentSum"} & plain and "ResourceScatterSub" in plain
    dedup = tf.math.unsorted_segment_sum(values, tf.unique(ids)[1], 3).numpy()   # rows 3, 7, 0
    want = table.copy()
    want[[3, 7, 0]] -= np.float32(0.5) * dedup
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_seeded_tables_are_the_same_whichever_slice_or_block_holds_a_column():
    """A table is filled in place a block of rows at a time; a column's values depend only on
    (seed, table, column, block), so a column slice, the whole table and the one-tensor
    table that distributed-embeddings gets (de_adapter.seeded_table) all agree bitwise."""
    import tensorflow as tf
    from recsys.embeddings.de_adapter import seeded_table
    from recsys.embeddings.seeding import SEED_BLOCK_ROWS, fill_seeded
    rows = SEED_BLOCK_ROWS + 123                                   # two blocks, the second short
    full = tf.Variable(tf.zeros([rows, 8]))
    fill_seeded(full, seed=11, table=3)
    part = tf.Variable(tf.zeros([rows, 3]))
    fill_seeded(part, seed=11, table=3, col_start=5)
    whole = full.numpy()
    np.testing.assert_array_equal(part.numpy(), whole[:, 5:8])
    np.testing.assert_array_equal(np.asarray(seeded_table(11, 3, rows, 8)), whole)
    lim = rows ** -0.5
    assert (np.abs(whole) < lim).all() and whole.std() > lim / 3    # U(-1/sqrt(rows), 1/sqrt(rows)), filled
    assert not np.array_equal(whole[:123], whole[SEED_BLOCK_ROWS:])  # blocks are not repeats
    other = tf.Variable(tf.zeros([rows, 8]))
    fill_seeded(other, seed=11, table=4)
    assert not np.array_equal(other.numpy(), whole)


GROWTH_PROBE = r"""
import sys
def rss():
    return int([l for l in open("/proc/self/status") if l.startswith("VmRSS")][0].split()[1]) * 1024
import tensorflow as tf
from recsys.embeddings.seeding import SeededEmbedding
tf.keras.layers.Embedding(10, 4)(tf.constant([1]))       # TF's own one-off costs, before measuring
before = rss()
layers = [SeededEmbedding(2**20, 32, seed=5, table=t) for t in range(2)]
for layer in layers:
    layer(tf.constant([1]))
print(rss() - before)
"""


def test_building_seeded_tables_grows_the_process_by_their_bytes():
    """Two 128 MiB tables: the process grows by their 256 MiB and little else. Before the tables
    were filled in place, the initializer's per-column temporaries stayed in the process (the first
    256 MiB table cost 0.55 GiB of RSS, docs/embeddings.md)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", GROWTH_PROBE], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    growth = int(out.stdout.split()[-1])
    tables = 2 * 2**20 * 32 * 4
    assert tables <= growth <= tables + 64 * 2**20, f"grew {growth / 2**20:.0f} MiB for {tables / 2**20:.0f} MiB of tables"
