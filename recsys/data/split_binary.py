"""Split-binary reader (DLRM layout): fixed-length batch records read straight from raw files.

Layout (as the reference DLRM writes it): per mapping ``label.bin`` (bool),
``numerical.bin`` (float16, all numerical features of a row interleaved, i.e.
one [rows, n_num] C-order array), one ``cat_<i>.bin`` per categorical
(int8/int16/int32 by cardinality, see ``feature_spec.categorical_dtype``).
Values are stored as they are fed to the model: the reader applies no
transform (the Criteo preprocessing already applied its log transform).

Reading: the mapping is cut into fixed-length batch records; rank ``r`` of
``w`` reads batches ``r, r + w, r + 2w, ...``. A batch is one contiguous
slice of each memory-mapped file, so a rank only touches its own bytes.

* ``drop_remainder=True`` (training): as the reference, the tail smaller than
  a batch is dropped, and every rank gets the same number of batches
  (``rows // batch_size // w``; up to ``w - 1`` surplus batches are dropped)
  so that data-parallel steps stay in lock step.
* ``drop_remainder=False`` (evaluation): every row is read exactly once over
  all ranks; the last batch may be short and ranks may differ by one batch,
  so reduce metric sums once at the end (the metric then does not depend on
  the number of ranks).

Shuffling permutes the order of the rank's batches each epoch (rows inside a
batch keep their stored order: the preprocessing shuffles rows).

Categorical ids outside [0, cardinality) are a :class:`recsys.errors.DataError`
naming the file, row and feature: :meth:`SplitBinaryReader.check_ids` scans
whole files (the engine calls it before training when the files are small,
``CHECK_IDS_MAX_BYTES``), and every batch read is checked too (one comparison per
id), so an embedding lookup never sees a bad id (on GPU it would silently
read zeros). Likewise a NaN or infinite numerical (fused MatMul+BiasAdd+Relu kernels
would hide it from the loss) and a label other than 0/1 are a DataError naming the
file, row and feature. The checks are recsys.data.layout's, shared by every reader.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from recsys.data.layout import (Layout, channel_features, check_finite, check_ids, check_labels, check_shard,
                                label_features)
from recsys.features.spec import CATEGORICAL_CHANNELS, FeatureSpec, FeatureSpecError
from recsys.runtime.tracing import as_written

# Up to this many bytes of categorical ids per mapping, the engine checks every id before training.
CHECK_IDS_MAX_BYTES = 1 << 30


class SplitBinaryReader:
    """Numpy side: memory maps + batch slicing. ``read_batch(i)`` -> flat dict of [B, n] arrays."""

    def __init__(self, spec: FeatureSpec, mapping: str, batch_size: int, rank: int = 0, world_size: int = 1,
                 drop_remainder: bool = True):
        check_shard(batch_size, rank, world_size)
        self.spec, self.mapping, self.batch_size = spec, mapping, batch_size
        self.rank, self.world_size, self.drop_remainder = rank, world_size, drop_remainder
        needed = set(channel_features(spec, mapping))
        self.rows = spec.num_rows(mapping)
        if drop_remainder:
            self.total_batches = self.rows // batch_size
            self.num_batches = self.total_batches // world_size
        else:
            self.total_batches = -(-self.rows // batch_size)
            self.num_batches = len(range(rank, self.total_batches, world_size))
        if self.num_batches == 0 and (drop_remainder or self.rows == 0):
            raise FeatureSpecError(f"{spec.origin}: source_spec.{mapping}",
                                   f"{self.rows} rows give no full batch of {batch_size} per rank for {world_size} rank(s)")
        self.keys: List[str] = []
        self.dtypes: List[np.dtype] = []
        self.widths: List[int] = []
        self._maps: List[np.ndarray] = []
        source_of = {}
        categorical = {f for ch in CATEGORICAL_CHANNELS for f in spec.features(ch)}
        labels = label_features(spec)
        # (map index, [(column, feature)], file) of the label files: 0 or 1 only
        self._label_checks = []
        # (map index, [(column, feature, cardinality)], file) of the categorical id files
        self._id_checks = []
        # (map index, features, file) of the float files: every value must be finite
        self._float_checks = []
        for i, chunk in enumerate(spec.chunks(mapping)):
            if chunk["type"] != "split_binary":
                raise FeatureSpecError(f"{spec.origin}: source_spec.{mapping}[{i}]",
                                       f"chunk type {chunk['type']} in a split_binary mapping")
            if not needed & set(chunk["features"]):
                continue  # stored but used by no channel
            key = f"chunk{i}"
            dtype = np.dtype(spec.dtype(chunk["features"][0]))
            width = len(chunk["features"])
            if self.rows == 0:
                raise FeatureSpecError(spec.path(chunk["files"][0]), "file is empty")
            mm = np.memmap(spec.path(chunk["files"][0]), dtype=dtype, mode="r", shape=(self.rows, width))
            self.keys.append(key)
            self.dtypes.append(dtype)
            self.widths.append(width)
            self._maps.append(mm)
            for col, f in enumerate(chunk["features"]):
                source_of[f] = (key, col)
            cols = [(col, f, spec.cardinality(f)) for col, f in enumerate(chunk["features"]) if f in categorical]
            if cols:
                self._id_checks.append((len(self._maps) - 1, cols, spec.path(chunk["files"][0])))
            label_cols = [(col, f) for col, f in enumerate(chunk["features"]) if f in labels]
            if label_cols and dtype != bool:
                self._label_checks.append((len(self._maps) - 1, label_cols, spec.path(chunk["files"][0])))
            if dtype.kind == "f":
                self._float_checks.append((len(self._maps) - 1, list(chunk["features"]), spec.path(chunk["files"][0])))
        self.layout = Layout(spec, mapping, source_of)

    @property
    def id_bytes(self) -> int:
        """Bytes of categorical id files (what :meth:`check_ids` reads)."""
        return sum(self._maps[k].nbytes for k, _, _ in self._id_checks)

    def check_ids(self, rows_per_read: int = 1 << 20) -> None:
        """Scan every categorical id of the mapping; DataError at the first one out of range."""
        for lo in range(0, self.rows, rows_per_read):
            self._check_rows([np.asarray(m[lo:lo + rows_per_read]) for m in self._maps], lo)

    def _check_rows(self, arrays: List[np.ndarray], first_row: int) -> None:
        for k, cols, path in self._label_checks:
            for col, feature in cols:
                check_labels(arrays[k][:, col], feature, path, first_row)
        for k, features, path in self._float_checks:
            check_finite(arrays[k], features, path, first_row)
        for k, cols, path in self._id_checks:
            for col, feature, card in cols:
                check_ids(arrays[k][:, col], feature, card, path, first_row)

    def batch_ids(self) -> np.ndarray:
        """Global batch indices of this rank, in file order."""
        if not self.drop_remainder:
            return np.arange(self.rank, self.total_batches, self.world_size, dtype=np.int64)
        return np.arange(self.rank, self.num_batches * self.world_size, self.world_size, dtype=np.int64)

    def read_flat(self, batch_id: int) -> List[np.ndarray]:
        lo = int(batch_id) * self.batch_size
        arrays = [np.array(m[lo:lo + self.batch_size]) for m in self._maps]
        self._check_rows(arrays, lo)
        return arrays

    def read_batch(self, batch_id: int) -> Dict[str, np.ndarray]:
        return dict(zip(self.keys, self.read_flat(batch_id)))

    def numpy_batches(self, shuffle: bool = False, seed: int = 0, epoch: int = 0):
        """(inputs, labels) numpy batches of this rank (no TensorFlow needed)."""
        ids = self.batch_ids()
        if shuffle:
            ids = np.random.default_rng([seed, epoch]).permutation(ids)
        for b in ids:
            yield self.layout.pack(self.read_batch(b))

    def dataset(self, shuffle: bool = False, seed: int = 0, repeat: bool = False, prefetch: int = -1):
        """tf.data pipeline: batch ids -> parallel reads (numpy in a TF thread pool) -> packing -> prefetch."""
        import tensorflow as tf
        from recsys.data.layout import TFOps
        ops = TFOps()
        ds = tf.data.Dataset.from_tensor_slices(self.batch_ids())
        if shuffle:
            ds = ds.shuffle(max(1, self.num_batches), seed=seed, reshuffle_each_iteration=True)
        if repeat:
            ds = ds.repeat()
        tout = [tf.as_dtype(d) for d in self.dtypes]
        shapes = [(self.batch_size if self.drop_remainder else None, w) for w in self.widths]

        def read(batch_id):
            arrays = tf.numpy_function(self.read_flat, [batch_id], tout, stateful=False)
            flat = {}
            for key, arr, shape in zip(self.keys, arrays, shapes):
                arr.set_shape(shape)
                flat[key] = arr
            return self.layout.pack(flat, ops)

        ds = ds.map(as_written(read), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if not repeat:
            ds = ds.apply(tf.data.experimental.assert_cardinality(self.num_batches))
        return ds.prefetch(tf.data.AUTOTUNE if prefetch < 0 else prefetch)
