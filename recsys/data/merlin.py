"""The Merlin dataloader as a reader of parquet mappings (``recsys-train --reader merlin``).

An alternative to the tf.data parquet reader (recsys.data.parquet) for NVTabular
output: ``merlin.dataloader.tensorflow.Loader`` over ``merlin.io.Dataset``
(pandas partitions on CPU, cudf on a GPU node), sharded with
``global_size``/``global_rank``. Imported only when that reader is chosen.

Same batches as the tf.data reader without shuffling (checked in
tests/recsys/test_merlin_reader.py). The order rule: both readers give rank ``r``
of ``w`` the files ``r, r + w, ...`` of the mapping (in spec order), read in that
order, with rows flowing across file boundaries into full batches. Merlin gives
each rank a contiguous block of ``ceil(n / w)`` partitions, so the file list is
handed to it ordered by ``(k mod w, k)`` with one partition per file, which makes
the blocks the round-robin sets; a file count where the two splits cannot agree
(e.g. 7 files on 3 ranks) is refused with one line. Training mappings yield
the same number of batches on every rank (the minimum, as the tf.data reader).
With shuffling, Merlin shuffles partitions and the rows of each chunk with
its own generator (seeded per epoch): the same rows per epoch, another order.

Only one parquet chunk per mapping (every feature in the same files), which is
what NVTabular writes. Multi-hot list columns come out of Merlin as
(values, offsets) and are padded to ``[B, max_hotness]`` with -1 as the tf.data reader does.
"""
from __future__ import annotations

import warnings

from recsys.data.layout import Layout, check_finite, check_ids, check_labels
from recsys.data.parquet import ParquetReader
from recsys.features.spec import FeatureSpec, FeatureSpecError


def merlin_file_order(n_files: int, world_size: int) -> list[int]:
    """File indices in the order handed to Merlin; raises ValueError when its split cannot match round robin."""
    order = sorted(range(n_files), key=lambda k: (k % world_size, k))
    per_rank = -(-n_files // world_size)
    for rank in range(world_size):
        if order[rank * per_rank:(rank + 1) * per_rank] != list(range(rank, n_files, world_size)):
            raise ValueError(f"{n_files} files cannot be split over {world_size} ranks as the tf.data reader does "
                             f"(Merlin gives each rank a block of {per_rank}); write a multiple of {world_size} files")
    return order


class MerlinReader:
    """Batches of one rank from the Merlin dataloader, packed like every other reader's."""

    def __init__(self, spec: FeatureSpec, mapping: str, batch_size: int, rank: int = 0, world_size: int = 1,
                 drop_remainder: bool = True):
        self.base = ParquetReader(spec, mapping, batch_size, rank, world_size, drop_remainder)
        if len(self.base.file_groups[0]) != 1:
            raise FeatureSpecError(f"{spec.origin}: source_spec.{mapping}",
                                   "--reader merlin reads one parquet chunk per mapping (all features in the same "
                                   "files, as NVTabular writes them)")
        try:
            self.order = merlin_file_order(len(self.base.file_groups), world_size)
        except ValueError as e:
            raise FeatureSpecError(f"{spec.origin}: source_spec.{mapping}", f"--reader merlin: {e}") from None
        self.spec, self.mapping, self.batch_size = spec, mapping, batch_size
        self.rank, self.world_size, self.drop_remainder = rank, world_size, drop_remainder
        self.num_batches = self.base.num_batches
        self.features = list(self.base.features)
        self.hotness = dict(self.base.hotness)
        self.dtypes = dict(self.base.dtypes)
        self.layout = Layout(spec, mapping, {f: (f, None) for f in self.features})

    def _loader(self, shuffle: bool, seed: int):
        warnings.filterwarnings("ignore", message=".*experimental feature.*")
        from merlin.dataloader.tensorflow import Loader
        from merlin.io import Dataset

        import dask
        import dask.dataframe as dd
        import pandas as pd

        files = [self.base.file_groups[k][0][0] for k in self.order]
        # One partition per file, in this order (merlin.io.Dataset and dask's read_parquet sort the paths).
        read = dask.delayed(pd.read_parquet, pure=True)
        meta = pd.read_parquet(files[0], columns=self.features).iloc[:0]
        frame = dd.from_delayed([read(f, columns=self.features) for f in files], meta=meta, verify_meta=False)
        dataset = Dataset(frame, cpu=True)
        if dataset.npartitions != len(files):
            raise FeatureSpecError(f"{self.spec.origin}: source_spec.{self.mapping}",
                                   f"--reader merlin: {len(files)} files became {dataset.npartitions} partitions")
        return Loader(dataset, batch_size=self.batch_size, shuffle=shuffle, seed_fn=(lambda: seed) if shuffle else None,
                      global_size=self.world_size, global_rank=self.rank, drop_last=self.drop_remainder)

    def _flat(self, batch, index=0):
        """One loader batch as {feature: tensor}, its values checked by recsys.data.layout's checks
        (labels 0/1, ids in range, finite numericals); an error names the column and the row of this
        rank's rows (the loader does not say which file it came from)."""
        import tensorflow as tf

        columns = batch[0] if isinstance(batch, tuple) else batch
        where = f"{self.spec.origin}: {self.mapping} (--reader merlin, rank {self.rank})"
        first, of = index * self.batch_size, " of this rank's rows"
        flat = {}
        for f in self.features:
            if f in self.hotness:
                values, offsets = _list_parts(columns, f)
                ragged = tf.RaggedTensor.from_row_splits(tf.cast(values, tf.int32), tf.cast(offsets, tf.int64))
                if f in self.base.cardinality:
                    check_ids(ragged.flat_values.numpy(), f, self.base.cardinality[f], where, first,
                              rows=ragged.value_rowids().numpy(), row_of=of)
                flat[f] = ragged.to_tensor(default_value=-1, shape=[None, self.hotness[f]])
                continue
            flat[f] = tf.reshape(columns[f], [-1])
            if f in self.base.labels:
                check_labels(flat[f].numpy(), f, where, first, row_of=of)
            elif f in self.base.cardinality:
                check_ids(flat[f].numpy(), f, self.base.cardinality[f], where, first, row_of=of)
            else:
                check_finite(flat[f].numpy(), [f], where, first, row_of=of)
        return flat

    def flat_batches(self, shuffle: bool = False, seed: int = 0, epoch: int = 0):
        """Flat dicts {feature: tensor} of this rank, exactly ``num_batches`` of them (training mappings)."""
        import numpy as np

        loader = self._loader(shuffle, int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0]))
        try:
            for i, batch in enumerate(loader):
                if i >= self.num_batches:
                    break
                yield self._flat(batch, i)
        finally:
            loader.stop()

    def numpy_batches(self, shuffle: bool = False, seed: int = 0, epoch: int = 0):
        from recsys.data.layout import NumpyOps

        for flat in self.flat_batches(shuffle, seed, epoch):
            yield self.layout.pack({k: v.numpy() for k, v in flat.items()}, NumpyOps)

    def dataset(self, shuffle: bool = False, seed: int = 0, repeat: bool = False, prefetch: int = -1, **_):
        """tf.data pipeline over the Merlin loader (a generator), packed and prefetched."""
        import tensorflow as tf
        from recsys.data.layout import TFOps

        signature = {f: tf.TensorSpec((None, self.hotness[f]) if f in self.hotness else (None,),
                                      tf.int32 if f in self.hotness else tf.as_dtype(self.dtypes[f]))
                     for f in self.features}

        def batches():
            epoch = 0
            while True:
                yield from self.flat_batches(shuffle, seed, epoch)
                epoch += 1
                if not repeat:
                    return

        ds = tf.data.Dataset.from_generator(batches, output_signature=signature)
        ops = TFOps()
        ds = ds.map(self.layout.tf_packer(ops), num_parallel_calls=tf.data.AUTOTUNE)
        if not repeat:
            ds = ds.apply(tf.data.experimental.assert_cardinality(self.num_batches))
        return ds.prefetch(tf.data.AUTOTUNE if prefetch < 0 else prefetch)


def _list_parts(columns: dict, name: str):
    """(values, row offsets) of a list column as Merlin 23.08 hands it over."""
    if f"{name}__values" in columns:
        return columns[f"{name}__values"], columns[f"{name}__offsets"]
    value = columns[name]
    if isinstance(value, tuple):
        return value
    return value.values, value.row_splits
