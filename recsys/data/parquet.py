"""Parquet reader (Wide & Deep layout, also usable for NCF and DLRM channels).

One column per feature; a multi-hot feature is a list column and comes out
as int32 [B, max_hotness] padded with -1 (a row with more values than
``max_hotness`` is an error naming the file). Null values are not allowed, nor NaN or
infinite floats, labels other than 0/1 or ids outside ``[0, cardinality)`` (a DataError
naming the file, row and column: recsys.data.layout's checks); a column whose parquet type
cannot hold the feature (text, a struct, a list for a scalar feature) is refused when the
reader opens the file footers, before anything is read.

Sharding is by file: rank ``r`` of ``w`` reads files ``r, r + w, ...`` of
the mapping (sorted as listed in the spec), so a mapping needs at least as
many files as ranks (a clear error otherwise). Rows flow across file
boundaries into full batches.

* ``drop_remainder=True`` (training default): only full batches, and every
  rank yields the same number of batches (the minimum over ranks, computed
  from the parquet footers) so that data-parallel steps stay in lock step.
* ``drop_remainder=False`` (evaluation default): every row of the rank's
  files is read, the last batch may be smaller, and ranks may yield different
  numbers of batches: reduce metric *sums* once at the end, not per step.
  For MAP@12 every display id must live in one file (the preprocessing writes
  test files partitioned by display id) so that a group is never split.

Shuffling permutes the file order and the rows inside each row group per
epoch. The tf.data pipeline decodes row groups of several files in parallel
and cuts batches across file boundaries (``Dataset.rebatch``).
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from recsys.data.layout import (Layout, channel_features, check_finite, check_ids, check_labels, check_shard,
                                label_features)
from recsys.errors import DataError
from recsys.features.spec import CATEGORICAL_CHANNELS, FeatureSpec, FeatureSpecError
from recsys.runtime.tracing import as_written


def list_column_to_padded(column, hotness: int, where: str, cardinality: Optional[int] = None,
                          feature: str = "", path: str = "", first_row: int = 0) -> np.ndarray:
    """pyarrow list column -> int32 [n, hotness] padded with -1 (ids checked against
    ``cardinality`` when given, before padding: a stored -1 is an error, not padding)."""
    import pyarrow as pa
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    offsets = column.offsets.to_numpy()
    values = column.values.to_numpy(zero_copy_only=False)
    lengths = np.diff(offsets)
    if lengths.size and lengths.max() > hotness:
        raise FeatureSpecError(where, f"a row has {lengths.max()} values, more than max_hotness {hotness}")
    row = np.repeat(np.arange(len(lengths)), lengths)
    if cardinality is not None:
        check_ids(values[offsets[0]:offsets[-1]], feature, cardinality, path, first_row, rows=row)
    out = np.full((len(lengths), hotness), -1, dtype=np.int32)
    pos = np.arange(row.size) - np.repeat(offsets[:-1] - offsets[0], lengths)
    out[row, pos] = values[offsets[0]:offsets[-1]]
    return out


def _check_types(spec: FeatureSpec, schema, features: List[str], path) -> None:
    """Each feature's parquet column can hold it: a list of integers for a multi-hot feature, a
    number (integer, float or bool) for every other one; else one line naming the file, column and
    type (text or a struct in a numerical column would fail deep in the reader)."""
    import pyarrow as pa
    t = pa.types
    for f in features:
        if f not in schema.names:
            continue            # a missing column is the footer reader's error, reported as it was
        typ = schema.field(f).type
        if spec.is_multihot(f):
            ok = (t.is_list(typ) or t.is_large_list(typ)) and t.is_integer(typ.value_type)
            need = "a list of integer ids"
        else:
            ok = t.is_integer(typ) or t.is_floating(typ) or t.is_boolean(typ)
            need = "numbers (integer, float or bool)"
        if not ok:
            raise DataError(f"{path}: column {f!r} is {typ}: the feature spec's {spec.dtype(f)} {f} needs {need}")


class ParquetReader:
    """Numpy side: file shard of this rank -> flat dict batches {feature: array}."""

    def __init__(self, spec: FeatureSpec, mapping: str, batch_size: int, rank: int = 0, world_size: int = 1,
                 drop_remainder: bool = True):
        import pyarrow.parquet as pq
        check_shard(batch_size, rank, world_size)
        self.spec, self.mapping, self.batch_size = spec, mapping, batch_size
        self.rank, self.world_size, self.drop_remainder = rank, world_size, drop_remainder
        self.features = channel_features(spec, mapping)
        chunks = [c for c in spec.chunks(mapping) if set(c["features"]) & set(self.features)]
        for c in chunks:
            if c["type"] != "parquet":
                raise FeatureSpecError(f"{spec.origin}: source_spec.{mapping}", f"chunk type {c['type']} in a parquet mapping")
        n_files = {len(c["files"]) for c in chunks}
        if len(n_files) != 1:
            raise FeatureSpecError(f"{spec.origin}: source_spec.{mapping}",
                                   "parquet chunks of one mapping must list the same number of row-aligned files")
        n_files = n_files.pop()
        if n_files < world_size:
            raise FeatureSpecError(f"{spec.origin}: source_spec.{mapping}",
                                   f"{n_files} parquet file(s) for {world_size} ranks: need at least one file per rank")
        # file_groups[k] = [(path, [features])...] : the k-th file of every chunk (row-aligned)
        self.file_groups = [[(spec.path(c["files"][k]), [f for f in c["features"] if f in self.features])
                             for c in chunks] for k in range(n_files)]
        categorical = {f for ch in CATEGORICAL_CHANNELS for f in spec.features(ch)}
        self.labels = label_features(spec) & set(self.features)
        self.cardinality = {f: spec.cardinality(f) for f in self.features if f in categorical}
        self.file_rows = []
        for g in self.file_groups:
            for path, feats in g:
                footer = pq.ParquetFile(path)
                _check_types(spec, footer.schema_arrow, feats, path)
                if path == g[0][0]:
                    self.file_rows.append(footer.metadata.num_rows)
                elif footer.metadata.num_rows != self.file_rows[-1]:
                    raise FeatureSpecError(path, f"row count differs from the row-aligned file {g[0][0]}")
        self.my_files = list(range(rank, n_files, world_size))
        self.rows = sum(self.file_rows[k] for k in self.my_files)
        if drop_remainder:
            per_rank = [sum(self.file_rows[k::world_size]) // batch_size for k in range(world_size)]
            self.num_batches = min(per_rank)
            if self.num_batches == 0:
                raise FeatureSpecError(f"{spec.origin}: source_spec.{mapping}",
                                       f"a rank's files hold fewer than one batch of {batch_size} rows "
                                       f"(rows per rank {[sum(self.file_rows[k::world_size]) for k in range(world_size)]})")
        else:
            self.num_batches = -(-self.rows // batch_size)
        self.hotness = {f: spec.hotness(f) for f in self.features if spec.is_multihot(f)}
        self.dtypes = {f: np.dtype(spec.dtype(f)) for f in self.features}
        # Scalar columns of one dtype are packed into one [n, k] block: row shuffles and batch
        # slicing then move whole rows instead of gathering k separate columns.
        self.blocks: Dict[str, List[str]] = {}
        source_of = {}
        for f in self.features:
            if f in self.hotness:
                source_of[f] = (f, None)
            else:
                key = f"block_{self.dtypes[f].name}"
                self.blocks.setdefault(key, []).append(f)
                source_of[f] = (key, len(self.blocks[key]) - 1)
        self.keys = list(self.blocks) + list(self.hotness)
        self.layout = Layout(spec, mapping, source_of)

    def _read_file(self, k: int, rng: Optional[np.random.Generator]):
        """Yield flat dicts, one per row group of file k (rows permuted when rng is given).

        A file that cannot be decoded (corrupt page, truncated) is a DataError naming it."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        def read(path, what, fn):
            try:
                return fn()
            except (OSError, pa.ArrowException) as e:
                raise DataError(f"{path}: {what}: cannot decode the parquet data "
                                f"({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        files = [(read(path, "footer", lambda: pq.ParquetFile(path)), feats, path) for path, feats in self.file_groups[k]]
        offset = 0                      # rows of the file before this row group
        for rg in range(files[0][0].num_row_groups):
            cols = {}
            for pf, feats, path in files:
                table = read(path, f"row group {rg}", lambda: pf.read_row_group(rg, columns=feats))
                for f in feats:
                    col = table.column(f)
                    if col.null_count:
                        raise FeatureSpecError(path, f"column {f!r} has {col.null_count} null values")
                    cols[f] = (col, path)
            n = len(next(iter(cols.values()))[0])
            offset, first_row = offset + n, offset
            perm = rng.permutation(n) if rng is not None else None
            flat = {}
            for key, feats in self.blocks.items():
                block = np.empty((n, len(feats)), dtype=self.dtypes[feats[0]])
                for j, f in enumerate(feats):  # the shuffle is folded into the copy into the block
                    column = cols[f][0].to_numpy()
                    if f in self.labels:
                        check_labels(column, f, cols[f][1], first_row)
                    elif f in self.cardinality:
                        check_ids(column, f, self.cardinality[f], cols[f][1], first_row)
                    else:
                        check_finite(column, [f], cols[f][1], first_row)
                    block[:, j] = column if perm is None else column[perm]
                flat[key] = block
            for f, h in self.hotness.items():
                col, path = cols[f]
                padded = list_column_to_padded(col, h, f"{path}: column {f!r}", self.cardinality.get(f), f, path,
                                               first_row)
                flat[f] = padded if perm is None else padded[perm]
            yield flat

    def _file_rng(self, shuffle, seed, epoch, k):
        return np.random.default_rng([seed, epoch, self.rank, k]) if shuffle else None

    def flat_batches(self, shuffle: bool = False, seed: int = 0, epoch: int = 0):
        """Flat dict batches of this rank, exactly ``num_batches`` of them."""
        order = self.my_files if not shuffle else \
            list(np.random.default_rng([seed, epoch, self.rank]).permutation(self.my_files))
        head: Optional[Dict[str, np.ndarray]] = None  # carried rows, fewer than a batch
        emitted = 0
        B = self.batch_size
        for k in order:
            for flat in self._read_file(k, self._file_rng(shuffle, seed, epoch, k)):
                n, lo = len(flat[self.keys[0]]), 0
                if head is not None:
                    need = B - len(head[self.keys[0]])
                    if n < need:
                        head = {key: np.concatenate([head[key], flat[key]]) for key in self.keys}
                        continue
                    yield {key: np.concatenate([head[key], flat[key][:need]]) for key in self.keys}
                    emitted, lo, head = emitted + 1, need, None
                while n - lo >= B and emitted < self.num_batches:
                    yield {key: flat[key][lo:lo + B] for key in self.keys}
                    emitted, lo = emitted + 1, lo + B
                if emitted >= self.num_batches:
                    return
                if lo < n:
                    head = {key: flat[key][lo:] for key in self.keys}
        if head is not None and not self.drop_remainder:
            yield head

    def numpy_batches(self, shuffle: bool = False, seed: int = 0, epoch: int = 0):
        for flat in self.flat_batches(shuffle, seed, epoch):
            yield self.layout.pack(flat)

    def dataset(self, shuffle: bool = False, seed: int = 0, repeat: bool = False, prefetch: int = -1,
                parallel_files: int = 4):
        """tf.data pipeline: row groups of up to ``parallel_files`` files decoded in parallel
        (interleave), cut into batches across file boundaries (rebatch), packed, prefetched.

        Same rows per epoch as :meth:`numpy_batches`; the order differs (files interleave).
        """
        import tensorflow as tf
        from recsys.data.layout import TFOps
        ops = TFOps()
        signature = {key: tf.TensorSpec((None, len(feats)), tf.as_dtype(self.dtypes[feats[0]]))
                     for key, feats in self.blocks.items()}
        signature.update({f: tf.TensorSpec((None, h), tf.int32) for f, h in self.hotness.items()})
        files = tf.constant(self.my_files, dtype=tf.int64)

        def row_groups(k, epoch):
            yield from self._read_file(int(k), self._file_rng(shuffle, seed, int(epoch), int(k)))

        def one_epoch(epoch):
            order = files
            if shuffle:
                keys = tf.random.stateless_uniform([len(self.my_files)], seed=tf.stack([tf.cast(seed, tf.int64), epoch]))
                order = tf.gather(files, tf.argsort(keys))
            chunks = tf.data.Dataset.from_tensor_slices(order).interleave(
                lambda k: tf.data.Dataset.from_generator(row_groups, output_signature=signature, args=(k, epoch)),
                cycle_length=max(1, min(parallel_files, len(self.my_files))),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            batches = chunks.rebatch(self.batch_size, drop_remainder=self.drop_remainder)
            return batches.take(self.num_batches)  # equal step counts on all ranks

        ds = tf.data.Dataset.range(1 << 62 if repeat else 1).flat_map(as_written(one_epoch))  # (no tensor control flow)
        ds = ds.map(self.layout.tf_packer(ops), num_parallel_calls=tf.data.AUTOTUNE)
        if not repeat:
            ds = ds.apply(tf.data.experimental.assert_cardinality(self.num_batches))
        return ds.prefetch(tf.data.AUTOTUNE if prefetch < 0 else prefetch)
