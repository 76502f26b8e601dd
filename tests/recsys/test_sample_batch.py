"""The batch that builds a model is read by the reader's numpy side, not by a tf.data iterator.

An iterator of the repeating training dataset, dropped after one batch, is destroyed while its
reader threads still run Python (parquet generators, split-binary reads) and the destructor holds
the GIL they wait for: a Wide & Deep engine hung there once (recsys/models/tasks.py).
"""
import numpy as np
import pytest

from conftest import in_process_task


@pytest.mark.parametrize("model", ["dlrm", "wide_deep"])
def test_sample_batch_is_a_training_batch_read_without_tf_data(model, tiny_data, monkeypatch):
    import tensorflow as tf
    from recsys.data import make_dataset
    _, task, _, _ = in_process_task(["--model", model, "--data-path", tiny_data(model), "--batch-size", "256"])
    # read to its end (an iterator dropped mid-stream is what the sample batch avoids)
    first = list(make_dataset(task.spec, "train", task.local_batch))[0]

    def no_tf_data(*a, **k):
        raise AssertionError("sample_batch started a tf.data pipeline")
    monkeypatch.setattr(task, "benchmark_dataset", no_tf_data)
    monkeypatch.setattr(task, "train_dataset", no_tf_data)
    sample = task.sample_batch()
    tf.nest.assert_same_structure(sample, first)
    for got, want in zip(tf.nest.flatten(sample), tf.nest.flatten(first)):
        assert isinstance(got, tf.Tensor) and got.dtype == want.dtype and got.shape == want.shape
    if model == "dlrm":            # split-binary: the same first batch, value for value
        for got, want in zip(tf.nest.flatten(sample), tf.nest.flatten(first)):
            np.testing.assert_array_equal(got.numpy(), want.numpy())
