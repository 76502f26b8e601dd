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
    from recsys.optim import make_optimizer
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
