"""Parquet reader (Wide & Deep layout, also usable for NCF and DLRM channels).

One column per feature; a multi-hot feature is a list column and comes out
as int32 [B, max_hotness] padded with -1 (a row with more values than
``max_hotness`` is an error naming the file). Null values are not allowed.

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

Shuffling permutes the file order and the rows inside each row group per epoch.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from recsys.data.layout import Layout, channel_features
from recsys.feature_spec import FeatureSpec, FeatureSpecError


def list_column_to_padded(column, hotness: int, where: str) -> np.ndarray:
    """pyarrow list column -> int32 [n, hotness] padded with -1."""
    import pyarrow as pa
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    offsets = column.offsets.to_numpy()
    values = column.values.to_numpy(zero_copy_only=False)
    lengths = np.diff(offsets)
    if lengths.size and lengths.max() > hotness:
        raise FeatureSpecError(where, f"a row has {lengths.max()} values, more than max_hotness {hotness}")
    out = np.full((len(lengths), hotness), -1, dtype=np.int32)
    mask = np.arange(hotness)[None, :] < lengths[:, None]
    out[mask] = values[(offsets[:-1, None] + np.arange(hotness)[None, :])[mask]]
    return out


class ParquetReader:
    """Numpy side: file shard of this rank -> flat dict batches {feature: array}."""

    def __init__(self, spec: FeatureSpec, mapping: str, batch_size: int, rank: int = 0, world_size: int = 1,
                 drop_remainder: bool = True):
        import pyarrow.parquet as pq
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world_size {world_size}")
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
        self.file_rows = [pq.ParquetFile(g[0][0]).metadata.num_rows for g in self.file_groups]
        for g, rows in zip(self.file_groups, self.file_rows):
            for path, _ in g[1:]:
                if pq.ParquetFile(path).metadata.num_rows != rows:
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
        self.layout = Layout(spec, mapping, {f: (f, None) for f in self.features})

    def _read_file(self, k: int, rng: Optional[np.random.Generator]):
        """Yield flat dicts, one per row group of file k (rows permuted when rng is given)."""
        import pyarrow.parquet as pq
        files = [(pq.ParquetFile(path), feats, path) for path, feats in self.file_groups[k]]
        for rg in range(files[0][0].num_row_groups):
            flat = {}
            for pf, feats, path in files:
                table = pf.read_row_group(rg, columns=feats)
                for f in feats:
                    col = table.column(f)
                    if col.null_count:
                        raise FeatureSpecError(path, f"column {f!r} has {col.null_count} null values")
                    if f in self.hotness:
                        flat[f] = list_column_to_padded(col, self.hotness[f], f"{path}: column {f!r}")
                    else:
                        flat[f] = col.to_numpy().astype(self.dtypes[f], copy=False)
            if rng is not None:
                perm = rng.permutation(len(next(iter(flat.values()))))
                flat = {f: a[perm] for f, a in flat.items()}
            yield flat

    def flat_batches(self, shuffle: bool = False, seed: int = 0, epoch: int = 0):
        """Flat dict batches of this rank, exactly ``num_batches`` of them."""
        rng = np.random.default_rng([seed, epoch, self.rank]) if shuffle else None
        order = list(self.my_files) if rng is None else list(rng.permutation(self.my_files))
        pending: List[Dict[str, np.ndarray]] = []
        pending_rows = 0
        emitted = 0
        for k in order:
            for flat in self._read_file(k, rng):
                pending.append(flat)
                pending_rows += len(next(iter(flat.values())))
                while pending_rows >= self.batch_size and emitted < self.num_batches:
                    merged = {f: np.concatenate([p[f] for p in pending]) if len(pending) > 1 else pending[0][f]
                              for f in self.features}
                    yield {f: a[:self.batch_size] for f, a in merged.items()}
                    emitted += 1
                    rest = {f: a[self.batch_size:] for f, a in merged.items()}
                    pending_rows -= self.batch_size
                    pending = [rest] if pending_rows else []
                if emitted == self.num_batches:
                    return
        if pending_rows and not self.drop_remainder:
            yield {f: np.concatenate([p[f] for p in pending]) for f in self.features}

    def numpy_batches(self, shuffle: bool = False, seed: int = 0, epoch: int = 0):
        for flat in self.flat_batches(shuffle, seed, epoch):
            yield self.layout.pack(flat)

    def dataset(self, shuffle: bool = False, seed: int = 0, repeat: bool = False, prefetch: int = -1):
        """tf.data pipeline: a generator over this rank's files, packed in TF, prefetched."""
        import tensorflow as tf
        from recsys.data.layout import TFOps
        ops = TFOps()
        b = self.batch_size if self.drop_remainder else None
        signature = {f: tf.TensorSpec((b, self.hotness[f]) if f in self.hotness else (b,), tf.as_dtype(
            np.int32 if f in self.hotness else self.dtypes[f])) for f in self.features}

        def gen(epoch):
            yield from self.flat_batches(shuffle, seed, int(epoch))

        epochs = tf.data.Dataset.range(1 << 62 if repeat else 1)
        ds = epochs.flat_map(lambda e: tf.data.Dataset.from_generator(gen, output_signature=signature, args=(e,)))
        ds = ds.map(lambda flat: self.layout.pack(flat, ops), num_parallel_calls=tf.data.AUTOTUNE)
        if not repeat:
            ds = ds.apply(tf.data.experimental.assert_cardinality(self.num_batches))
        return ds.prefetch(tf.data.AUTOTUNE if prefetch < 0 else prefetch)
