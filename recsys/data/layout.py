"""How stored features become model inputs: the channel -> tensor packing shared by all readers.

Readers yield a flat dict of arrays keyed by *source*: a split-binary chunk
(``chunk<i>``, shape [B, n_features_of_chunk]) or a parquet column (the
feature name, shape [B] or [B, max_hotness]). :class:`Layout` knows where
every channel feature lives and packs a flat batch into the model's inputs:

=====================  ===========================================================
model (channels)       inputs
=====================  ===========================================================
DLRM                   ``numerical`` f32 [B, n_num]; ``categorical`` int32 [B, n_cat]
(label, numerical,
categorical)
Wide & Deep            ``numerical`` f32 [B, n_num]; ``onehot_categorical``
(label, numerical,     {name: int32 [B]}; ``multihot_categorical`` {name: int32
onehot_categorical,    [B, max_hotness], padded with -1}; ``map`` int64 [B] (only when
multihot_categorical,  the mapping stores it, i.e. test)
map)
NCF (user_ch, item_ch,  ``user`` int32 [B]; ``item`` int32 [B]
label_ch)
=====================  ===========================================================

Labels are always float32 [B, 1] (channel ``label``, or ``label_ch`` for NCF).
The same packing runs on numpy arrays (tests, metrics) and TF tensors
(``tf.data`` map), selected by the ``ops`` argument.

The checks of the values every reader reads are here, once, vectorised numpy
(:func:`check_labels`, :func:`check_ids`, :func:`check_finite`): a label that is
not 0 or 1, a categorical id outside ``[0, cardinality)`` and a non-finite
numerical are each a :class:`recsys.errors.DataError` naming the file (or
mapping), the row and the feature, so bad data never reaches the model (an
embedding lookup past the table fails deep in TensorFlow, a negative id is
clamped to row 0 on some kernels, a label 2 trains and evaluates to NaN).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from recsys.errors import DataError
from recsys.features.spec import FeatureSpec, FeatureSpecError
from recsys.runtime.tracing import as_written

LABEL_CHANNELS = ("label", "label_ch")
MATRIX_CHANNELS = {"numerical": "float32", "categorical": "int32"}
DICT_CHANNELS = {"onehot_categorical": "int32", "multihot_categorical": "int32"}
VECTOR_CHANNELS = {"map": ("map", "int64"), "user_ch": ("user", "int32"), "item_ch": ("item", "int32")}
KNOWN_CHANNELS = set(LABEL_CHANNELS) | set(MATRIX_CHANNELS) | set(DICT_CHANNELS) | set(VECTOR_CHANNELS)
#: NCF also accepts the short channel names.
CHANNEL_ALIASES = {"user": "user_ch", "item": "item_ch"}


def model_kind(spec: FeatureSpec) -> str:
    """'dlrm', 'wide_deep' or 'ncf', from the channel names."""
    ch = set(spec.channel_spec)
    if "categorical" in ch:
        return "dlrm"
    if ch & {"onehot_categorical", "multihot_categorical"}:
        return "wide_deep"
    if ch & {"user_ch", "item_ch", "user", "item"}:
        return "ncf"
    raise FeatureSpecError(f"{spec.origin}: channel_spec", "no categorical, onehot_categorical/multihot_categorical "
                                                          "or user_ch/item_ch channel: unknown model layout")


class NumpyOps:
    cast = staticmethod(lambda x, dtype: np.asarray(x).astype(dtype, copy=False))
    concat = staticmethod(lambda xs: np.concatenate(xs, axis=1))
    reshape = staticmethod(lambda x, shape: np.reshape(x, shape))


class TFOps:
    def __init__(self):
        import tensorflow as tf
        self.cast = lambda x, dtype: tf.cast(x, dtype)
        self.concat = lambda xs: tf.concat(xs, axis=1)
        self.reshape = lambda x, shape: tf.reshape(x, shape)


class Layout:
    """Where each channel feature lives in a reader's flat batch, and how to pack it."""

    def __init__(self, spec: FeatureSpec, mapping: str, source_of: Dict[str, Tuple[str, Optional[int]]]):
        self.spec = spec
        self.mapping = mapping
        self.source_of = source_of  # feature -> (flat key, column index or None)
        unknown = [c for c in spec.channel_spec if CHANNEL_ALIASES.get(c, c) not in KNOWN_CHANNELS]
        if unknown:
            raise FeatureSpecError(f"{spec.origin}: channel_spec.{unknown[0]}",
                                   f"unknown channel (known: {', '.join(sorted(KNOWN_CHANNELS))})")
        self.channels = {CHANNEL_ALIASES.get(c, c): [f for f in feats if f in source_of]
                         for c, feats in spec.channel_spec.items()}
        labels = [c for c in LABEL_CHANNELS if self.channels.get(c)]
        if not labels:
            raise FeatureSpecError(f"{spec.origin}: channel_spec", "no label channel (label or label_ch)")
        self.label_channel = labels[0]

    def _columns(self, flat, feats, dtype, ops):
        """[B, len(feats)] from columns, slicing whole runs of one chunk instead of gathering."""
        pieces, i = [], 0
        while i < len(feats):
            key, col = self.source_of[feats[i]]
            if col is None:
                pieces.append(ops.reshape(ops.cast(flat[key], dtype), [-1, 1]))
                i += 1
                continue
            j = i + 1
            while j < len(feats) and self.source_of[feats[j]] == (key, col + (j - i)):
                j += 1
            pieces.append(ops.cast(flat[key][:, col:col + (j - i)], dtype))
            i = j
        return pieces[0] if len(pieces) == 1 else ops.concat(pieces)

    def _vector(self, flat, feat, dtype, ops):
        key, col = self.source_of[feat]
        x = flat[key] if col is None else flat[key][:, col]
        return ops.cast(x, dtype)

    def tf_packer(self, ops):
        """:meth:`pack` for tf.data's ``map``, traced as written (recsys.runtime.tracing): its loops
        run over the layout, never over tensors."""
        return as_written(lambda flat: self.pack(flat, ops))

    def pack(self, flat: dict, ops=NumpyOps):
        """(inputs, labels) in the structure of the module docstring."""
        inputs = {}
        for channel, feats in self.channels.items():
            if channel in LABEL_CHANNELS:
                continue
            if channel in MATRIX_CHANNELS:
                if feats:
                    inputs[channel] = self._columns(flat, feats, MATRIX_CHANNELS[channel], ops)
            elif channel in DICT_CHANNELS:
                out = {}
                for f in feats:
                    key, col = self.source_of[f]
                    x = flat[key] if col is None else flat[key][:, col]
                    out[f] = ops.cast(x, DICT_CHANNELS[channel])
                inputs[channel] = out
            elif feats:
                name, dtype = VECTOR_CHANNELS[channel]
                inputs[name] = self._vector(flat, feats[0], dtype, ops)
        label_feats = self.channels[self.label_channel]
        labels = ops.reshape(self._vector(flat, label_feats[0], "float32", ops), [-1, 1])
        return inputs, labels


def check_shard(batch_size: int, rank: int, world_size: int) -> None:
    """Reject a batch size or rank that no reader can shard by (shared by all readers)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world_size {world_size}")


def channel_features(spec: FeatureSpec, mapping: str) -> List[str]:
    """Channel features present in the mapping (validated), in channel order."""
    spec.check_channels(mapping)
    out = []
    for feats in spec.channel_spec.values():
        out += [f for f in feats if spec.chunk_of(mapping, f) is not None and f not in out]
    return out


def label_features(spec: FeatureSpec) -> set:
    """The features of the label channels (``label``, ``label_ch``)."""
    return {f for ch in LABEL_CHANNELS for f in spec.channel_spec.get(ch, [])}


def check_labels(values, feature: str, where: str, first_row: int = 0, row_of: str = "") -> None:
    """Every label is 0 or 1 (bool columns always are); else a DataError naming the row."""
    v = np.asarray(values)
    if v.dtype == bool or not v.size:
        return
    bad = (v != 0) & (v != 1)                    # NaN is neither
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise DataError(f"{where}: row {first_row + row}{row_of}: label {feature} is {v.reshape(-1)[row]}: labels must "
                        f"be 0 or 1 (map the classes to 0/1 in the preprocessing)")


def check_ids(values, feature: str, cardinality: int, where: str, first_row: int = 0,
              rows: "np.ndarray | None" = None, row_of: str = "") -> None:
    """Every id in ``[0, cardinality)``; else a DataError naming the row. One comparison per id:
    seen as unsigned, a negative id is huge, so ``>= cardinality`` catches both ends
    (bench/bench_id_check.py). ``rows``: the row of each value (flattened multi-hot lists);
    ``row_of``: what the row number counts, when not the file's rows."""
    v = np.asarray(values)
    if not v.size:
        return
    if v.dtype.kind == "i":
        out = v.view(v.dtype.str.replace("i", "u")) >= cardinality
    elif v.dtype.kind == "u":
        out = v >= cardinality
    else:                                      # float or other ids: whole numbers in range only
        out = ~((v >= 0) & (v < cardinality) & (np.floor(v) == v))
    if out.any():
        at = int(np.flatnonzero(out.reshape(-1))[0])
        row = int(rows[at]) if rows is not None else at
        raise DataError(f"{where}: row {first_row + row}{row_of}: id {v.reshape(-1)[at]} of {feature} outside "
                        f"[0, {cardinality}) (the feature spec's cardinality)")


def check_finite(values, features: List[str], where: str, first_row: int = 0, row_of: str = "") -> None:
    """Every numerical finite; ``values`` [n] (one feature) or [n, len(features)]."""
    v = np.asarray(values)
    if not v.size or v.dtype.kind not in "fc":
        return
    finite = np.isfinite(v)
    if not finite.all():
        at = np.argwhere(~finite)[0]
        row, col = int(at[0]), (int(at[1]) if v.ndim > 1 else 0)
        raise DataError(f"{where}: row {first_row + row}{row_of}: {features[col]} is {v[tuple(at)]}: "
                        f"numerical values must be finite")
