"""Writes blocks of feature arrays into a mapping's chunk files (split_binary or parquet), atomically.

Used by the synthetic generator and the transcoder. Every file is written
under ``<name>.tmp`` and renamed by :meth:`ChunkWriter.close`, so a crash
never leaves a file that looks complete.
"""
from __future__ import annotations

import os
from typing import Dict

import numpy as np

from recsys.features.spec import FeatureSpec, FeatureSpecError


def arrow_type(spec: FeatureSpec, feature: str):
    """Parquet column type of a feature: its dtype, or a list of it for multi-hot features."""
    import pyarrow as pa
    t = pa.from_numpy_dtype(np.dtype(spec.dtype(feature)))
    return pa.list_(t) if spec.is_multihot(feature) else t


class ChunkWriter:
    """Appends blocks to every chunk file of one mapping; ``file_index`` picks the parquet part."""

    def __init__(self, spec: FeatureSpec, mapping: str):
        self.spec, self.mapping = spec, mapping
        self.chunks = spec.chunks(mapping)
        self.tmp: Dict[str, str] = {}
        self.handles = {}

    def _tmp(self, file):
        path = self.spec.path(file)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.tmp[path] = path + ".tmp"
        return self.tmp[path]

    def write(self, data: dict, file_index: int = 0) -> None:
        """``data``: feature -> numpy array [n] (multi-hot: list of arrays or a pyarrow list array)."""
        for chunk in self.chunks:
            feats = chunk["features"]
            missing = [f for f in feats if f not in data]
            if missing:
                raise FeatureSpecError(f"source_spec.{self.mapping}", f"no data for feature {missing[0]!r}")
            if chunk["type"] == "split_binary":
                file = chunk["files"][0]
                if file not in self.handles:
                    self.handles[file] = open(self._tmp(file), "wb")
                dtype = np.dtype(self.spec.dtype(feats[0]))
                block = np.empty((len(data[feats[0]]), len(feats)), dtype=dtype)
                for j, f in enumerate(feats):
                    block[:, j] = data[f]
                block.tofile(self.handles[file])
            elif chunk["type"] == "parquet":
                import pyarrow as pa
                import pyarrow.parquet as pq
                file = chunk["files"][file_index]
                cols = {}
                for f in feats:
                    t = arrow_type(self.spec, f)
                    v = data[f]
                    if isinstance(v, (pa.Array, pa.ChunkedArray)):
                        cols[f] = v.cast(t)
                    elif self.spec.is_multihot(f):
                        cols[f] = pa.array(v, type=t)
                    else:
                        cols[f] = pa.array(np.asarray(v).astype(self.spec.dtype(f), copy=False))
                table = pa.table(cols)
                if file not in self.handles:
                    self.handles[file] = pq.ParquetWriter(self._tmp(file), table.schema)
                self.handles[file].write_table(table)
            else:
                raise FeatureSpecError(f"source_spec.{self.mapping}", f"cannot write chunk type {chunk['type']}")

    def close(self) -> None:
        """Finish all files (parquet parts that got no rows are written empty, with the schema) and rename them."""
        import pyarrow as pa
        import pyarrow.parquet as pq
        for chunk in self.chunks:
            if chunk["type"] == "parquet":
                for file in chunk["files"]:
                    if file not in self.handles:
                        schema = pa.schema([pa.field(f, arrow_type(self.spec, f)) for f in chunk["features"]])
                        self.handles[file] = pq.ParquetWriter(self._tmp(file), schema)
            elif chunk["files"][0] not in self.handles:
                self.handles[chunk["files"][0]] = open(self._tmp(chunk["files"][0]), "wb")
        for h in self.handles.values():
            h.close()
        for final, tmp in self.tmp.items():
            os.replace(tmp, final)
