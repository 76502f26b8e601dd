"""Datasets described by a feature spec: readers, transcoder, synthetic generator, NCF sampling.

Entry point for the engine::

    from recsys.data import make_dataset
    ds = make_dataset(spec, "train", batch_size=65536, rank=r, world_size=w, shuffle=True, seed=s)
    for inputs, labels in ds: ...

The reader is chosen by the mapping's chunk type (``split_binary`` ->
:mod:`recsys.data.split_binary`, ``parquet`` -> :mod:`recsys.data.parquet`, or
with ``reader="merlin"`` the Merlin dataloader, :mod:`recsys.data.merlin`);
the input structure per model is documented in :mod:`recsys.data.layout`.
Each rank reads only its shard, reads run in tf.data's thread pool and the
pipeline ends in ``prefetch`` so that input overlaps with the training step.

Channel names: DLRM ``label``, ``numerical``, ``categorical``; Wide & Deep
``label``, ``numerical``, ``onehot_categorical``, ``multihot_categorical``,
``map`` (display id, test only); NCF ``user_ch``, ``item_ch``, ``label_ch``
as in NVIDIA's NCF (``user``/``item`` are accepted aliases). NCF's train
mapping holds the positive (user, item) pairs, its test mapping one positive
per user; negatives come from :mod:`recsys.data.ncf`.
"""
from __future__ import annotations

from typing import Optional, Union

from recsys.features.spec import FeatureSpec, FeatureSpecError

__all__ = ["make_dataset", "make_reader", "numerical_scale", "off_scale_warning", "label_counts", "evaluation_problem",
           "FeatureSpec", "FeatureSpecError"]

# A numerical column whose root mean square exceeds this is far off unit scale: the models take
# numericals as they are (an MLP or a linear model on raw counts, ages or amounts trains badly:
# Wide & Deep on the raw Adult numbers reached AUC 0.57 against 0.91 scaled).
OFF_SCALE_RMS = 30.0
# Rows read from the head of the mapping to measure it.
SCALE_SAMPLE_ROWS = 65536


def _as_spec(spec: Union[FeatureSpec, str]) -> FeatureSpec:
    return spec if isinstance(spec, FeatureSpec) else FeatureSpec.from_yaml(spec)


READERS = ("tfdata", "merlin")


def make_reader(spec, mapping: str, batch_size: int, rank: int = 0, world_size: int = 1,
                drop_remainder: Optional[bool] = None, reader: str = "tfdata"):
    """The numpy-side reader of a mapping (``.numpy_batches()``, ``.num_batches``, ``.dataset()``).

    ``drop_remainder`` defaults to True for ``train`` (full batches, the same
    number on every rank) and False for other mappings (every row read once
    over all ranks, last batch short; reduce metric sums at the end).
    """
    spec = _as_spec(spec).for_mapping(mapping)
    kind = spec.chunk_type(mapping)
    if drop_remainder is None:
        drop_remainder = mapping == "train"
    if reader not in READERS:
        raise ValueError(f"reader {reader!r} is not one of {', '.join(READERS)}")
    if reader == "merlin":
        if kind != "parquet":
            raise FeatureSpecError(f"{spec.origin}: source_spec.{mapping}",
                                   f"--reader merlin reads parquet chunks, this mapping is {kind}")
        from recsys.data.merlin import MerlinReader
        return MerlinReader(spec, mapping, batch_size, rank, world_size, drop_remainder)
    if kind == "split_binary":
        from recsys.data.split_binary import SplitBinaryReader
        return SplitBinaryReader(spec, mapping, batch_size, rank, world_size, drop_remainder)
    if kind == "parquet":
        from recsys.data.parquet import ParquetReader
        return ParquetReader(spec, mapping, batch_size, rank, world_size, drop_remainder)
    raise FeatureSpecError(f"{spec.origin}: source_spec.{mapping}",
                           f"chunk type {kind} is not a training format: transcode it first "
                           f"(python -m recsys.data.transcode)")


def make_dataset(spec, mapping: str, batch_size: int, rank: int = 0, world_size: int = 1,
                 shuffle: bool = False, seed: int = 0, repeat: bool = False,
                 drop_remainder: Optional[bool] = None, parallel_files: int = 4, reader: str = "tfdata"):
    """tf.data.Dataset of ``(inputs, labels float32 [B, 1])`` for this rank's shard, prefetching.

    Without ``repeat`` the dataset has a known cardinality (``num_batches``
    of the reader; identical on all ranks for training mappings).
    ``parallel_files``: parquet files decoded at once per rank (ignored for split-binary).
    ``reader``: ``tfdata`` (default) or ``merlin`` (parquet only, :mod:`recsys.data.merlin`).
    """
    source = make_reader(spec, mapping, batch_size, rank, world_size, drop_remainder, reader=reader)
    if hasattr(source, "file_groups"):
        return source.dataset(shuffle=shuffle, seed=seed, repeat=repeat, parallel_files=parallel_files)
    return source.dataset(shuffle=shuffle, seed=seed, repeat=repeat)


def numerical_scale(spec, mapping: str = "train", rows: int = SCALE_SAMPLE_ROWS) -> dict:
    """{numerical feature: root mean square} over the first ``rows`` rows of a mapping ({} when the
    mapping has no numerical channel)."""
    import numpy as np
    spec = _as_spec(spec)
    features = [f for f in spec.features("numerical") if spec.chunk_of(mapping, f) is not None]
    if not features or not spec.num_rows(mapping):
        return {}
    reader = make_reader(spec, mapping, min(rows, spec.num_rows(mapping)), drop_remainder=False)
    inputs, _ = next(iter(reader.numpy_batches()))
    x = np.asarray(inputs["numerical"], np.float64)
    rms = np.sqrt(np.mean(np.square(x), axis=0))
    return dict(zip(features, (float(v) for v in rms)))


def off_scale_warning(spec, mapping: str = "train") -> Optional[str]:
    """One line naming the numerical columns far off unit scale (RMS > OFF_SCALE_RMS), or None."""
    scale = numerical_scale(spec, mapping)
    off = [f"{f} (rms {v:.3g})" for f, v in scale.items() if not v <= OFF_SCALE_RMS]
    if not off:
        return None
    return (f"warning: numerical column(s) far off unit scale in {mapping}: {', '.join(off)}; the models "
            f"take numericals as they are: standardise or log-transform them in the preprocessing")


def label_counts(spec, mapping: str = "test") -> dict:
    """{value: rows} of a mapping's label column, reading that column only (a memory-mapped
    split-binary file or one parquet column per file): cheap even for the Criteo test day. None
    when a parquet file cannot be decoded: the reader reports it, naming the file, when it reads
    it (after a checkpoint of the steps trained so far)."""
    import numpy as np
    from recsys.data.layout import label_features
    spec = _as_spec(spec)
    feature = next((f for f in sorted(label_features(spec)) if spec.chunk_of(mapping, f) is not None), None)
    if feature is None:
        return {}
    chunk = spec.chunk_of(mapping, feature)
    values, counts = [], {}
    if chunk["type"] == "split_binary":
        rows = spec.num_rows(mapping)
        width = len(chunk["features"])
        data = np.memmap(spec.path(chunk["files"][0]), dtype=np.dtype(spec.dtype(feature)), mode="r",
                         shape=(rows, width))
        values = [data[:, chunk["features"].index(feature)]]
    elif chunk["type"] == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq
        try:
            values = [pq.read_table(spec.path(f), columns=[feature]).column(feature).to_numpy()
                      for f in chunk["files"]]
        except (OSError, pa.ArrowException):
            return None     # a file that cannot be decoded is the reader's to report, naming it
    for v in values:
        for value, n in zip(*np.unique(np.asarray(v), return_counts=True)):
            key = value.item() if hasattr(value, "item") else value
            key = int(key) if isinstance(key, bool) else key
            counts[key] = counts.get(key, 0) + int(n)
    return counts


def evaluation_problem(spec, mapping: str = "test") -> Optional[str]:
    """Why the AUC of DLRM and Wide & Deep would be undefined on ``mapping`` (fewer than two rows,
    or one class), as one line; None when it is defined, for NCF (its test rows are positives
    ranked against sampled negatives) and when the mapping is absent. Checked before training:
    a NaN AUC in the summary of a run that exited 0 told the user nothing."""
    from recsys.data.layout import model_kind
    spec = _as_spec(spec)
    if mapping not in spec.mappings() or model_kind(spec) == "ncf":
        return None
    counts = label_counts(spec, mapping)
    if counts is None:
        return None
    rows = sum(counts.values())
    classes = {float(k) for k in counts}
    if rows >= 2 and classes == {0.0, 1.0}:
        return None
    seen = ", ".join(f"{k}: {n} rows" for k, n in sorted(counts.items(), key=lambda kv: str(kv[0]))[:5])
    if classes - {0.0, 1.0}:
        return (f"{spec.origin}: {mapping}: labels must be 0 or 1, the label column holds {seen}: map the "
                f"classes to 0/1 in the preprocessing")
    why = f"{rows} row(s)" if rows < 2 else f"one class ({seen})"
    return (f"{spec.origin}: {mapping}: AUC is undefined on {why}: the evaluation needs rows of both labels, "
            f"0 and 1 (split the data so that the test rows hold both)")
