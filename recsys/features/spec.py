"""Feature specification: the YAML file that describes a dataset on disk.

The format is the one of the reference recommenders (hpc-facts.md section 4)::

    feature_spec:            # feature name -> attributes (order matters)
      label:  {dtype: bool}
      num_0:  {dtype: float16}
      cat_0:  {dtype: int32, cardinality: 7912889}
      topics: {dtype: int32, cardinality: 300, max_hotness: 3}   # multi-hot
    source_spec:             # mapping (train/test/...) -> list of chunks
      train:
        - {type: split_binary, features: [label], files: [train/label.bin]}
        - {type: split_binary, features: [num_0, ...], files: [train/numerical.bin]}
    channel_spec:            # model input channel -> feature names (order matters)
      label: [label]
      numerical: [num_0, ...]
      categorical: [cat_0, ...]
    metadata: {}             # free-form; mapping_specs: {validation: other.yaml} names specs of
                             # further mappings (NVIDIA's DLRM loaders accept only train/test)

File paths are relative to the directory holding the YAML. Chunk types:
``split_binary`` (one raw little-endian file per chunk, rows of the chunk's
features interleaved, all features of a chunk share one dtype), ``parquet``
(one or more files, one column per feature, multi-hot features are list
columns) and ``csv`` (headerless text, the input of ``recsys.data.transcode``;
multi-hot values inside one field separated by ``;``).

Optional per-feature keys: ``cardinality`` (required for categorical
channels), ``max_hotness`` (multi-hot, default 1) and ``transform`` (only
honoured by the transcoder; ``"log(x+C)"``, see recsys.data.transcode).

This module is pure Python + PyYAML + numpy (no TensorFlow at import) so that
the Spark preprocessing can write specs with it.
"""
from __future__ import annotations

import copy
import difflib
import os
import re
import tempfile
from typing import Dict, Iterable, List, Optional

import numpy as np
import yaml

from slurm.common.checker import Problems, unknown_key
from slurm.common.errors import ToolkitError
from slurm.common.yamlfile import YamlFileError, keyname, load_yaml_file, shown

#: Channels whose features are categorical ids and therefore need a cardinality.
CATEGORICAL_CHANNELS = ("categorical", "onehot_categorical", "multihot_categorical",
                        "user_ch", "item_ch")
#: Channels allowed to be absent from a mapping (W&D's display id exists only in test).
OPTIONAL_CHANNELS = ("map",)
CHUNK_TYPES = ("split_binary", "parquet", "csv")
#: dtypes every reader can read (numpy names).
READABLE_DTYPES = ("bool", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
PARQUET_UNREADABLE = ("float16",)
_TOP_KEYS = ("feature_spec", "source_spec", "channel_spec", "metadata")
_CHUNK_KEYS = ("type", "features", "files")
_TRANSFORM_RE = re.compile(r"^log\(x\+([0-9]+(?:\.[0-9]*)?)\)$")

CARDINALITY = "cardinality"
DTYPE = "dtype"
MAX_HOTNESS = "max_hotness"
TRANSFORM = "transform"


class _NoAliasDumper(yaml.SafeDumper):
    """Writes shared lists in full (no &id anchors): specs are read by people and other tools."""

    def ignore_aliases(self, data):
        return True


class FeatureSpecError(ToolkitError, ValueError):
    """A problem with a feature specification; the message is one line naming the culprit."""

    def __init__(self, where: str, problem: str):
        super().__init__(f"{where}: {problem}".replace("\n", " "))


def _problems(origin: str) -> Problems:
    """The checker of one spec file: every mistake ``<file>: <key.path>: <problem>``."""
    return Problems(origin, FeatureSpecError, lambda source, key, problem: FeatureSpecError(f"{source}: {key}", problem))


def _did_you_mean(name, known) -> str:
    """`` (did you mean 'x'?)`` for a name close to one of ``known``, else nothing."""
    close = difflib.get_close_matches(name, sorted(known), n=1) if isinstance(name, str) else []
    return f" (did you mean {close[0]!r}?)" if close else ""


def categorical_dtype(cardinality: int) -> str:
    """Smallest signed integer dtype holding ids 0..cardinality-1 (int8/int16/int32), as the DLRM files use."""
    for name in ("int8", "int16", "int32"):
        if cardinality - 1 <= np.iinfo(name).max:
            return name
    raise FeatureSpecError(f"cardinality {cardinality}", "too large for int32 ids")


def parse_transform(expr: Optional[str]) -> Optional[float]:
    """Return the shift C of a ``"log(x+C)"`` transform, None for no transform."""
    if expr is None or expr == "none":
        return None
    m = _TRANSFORM_RE.match(str(expr).replace(" ", ""))
    if not m:
        raise FeatureSpecError(f"transform {expr!r}", "only 'log(x+C)' or 'none' is supported")
    return float(m.group(1))


class FeatureSpec:
    """In-memory feature specification; see the module docstring for the format."""

    def __init__(self, feature_spec: Optional[dict] = None, source_spec: Optional[dict] = None,
                 channel_spec: Optional[dict] = None, metadata: Optional[dict] = None,
                 base_directory: Optional[str] = None, origin: str = "<feature spec>"):
        self.feature_spec: Dict[str, dict] = dict(feature_spec or {})
        self.source_spec: Dict[str, List[dict]] = dict(source_spec or {})
        self.channel_spec: Dict[str, List[str]] = dict(channel_spec or {})
        self.metadata: dict = dict(metadata or {})
        self.base_directory = os.path.abspath(base_directory or os.getcwd())
        self.origin = origin
        self.check_structure()

    # ------------------------------------------------------------------ I/O
    @classmethod
    def from_yaml(cls, path: str) -> "FeatureSpec":
        """Load and structurally validate a spec (file existence is checked by :meth:`validate`)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "feature_spec.yaml")
        if not os.path.isfile(path):
            raise FeatureSpecError(path, "feature spec file not found")
        try:
            raw = load_yaml_file(path)      # the toolkit's YAML limits (no alias bombs, no FIFOs)
        except YamlFileError as e:
            raise FeatureSpecError(f"{path}: {e.where}", e.problem) from None
        if not isinstance(raw, dict):
            raise FeatureSpecError(path, "top level must be a mapping with feature_spec, source_spec, channel_spec")
        ck = _problems(path)
        for key in raw:
            if key not in _TOP_KEYS:
                ck.record(keyname(key), unknown_key(key, _TOP_KEYS))
        for key in _TOP_KEYS[:3]:
            if not isinstance(raw.get(key), dict) or not raw.get(key):
                ck.record(key, "missing or not a non-empty mapping")
        if ck.lines:        # the structure is checked too where its three parts are there
            if all(isinstance(raw.get(key), dict) for key in _TOP_KEYS[:3]):
                cls.__new__(cls)._with(raw, path)._structure(ck)
            ck.raise_problems()
        return cls(raw["feature_spec"], raw["source_spec"], raw["channel_spec"], raw.get("metadata") or {},
                   base_directory=os.path.dirname(os.path.abspath(path)), origin=path)

    def _with(self, raw: dict, origin: str) -> "FeatureSpec":
        """This (unchecked) spec holding ``raw``'s parts: for checking a file that has other mistakes."""
        self.feature_spec, self.source_spec = raw["feature_spec"], raw["source_spec"]
        self.channel_spec, self.metadata, self.origin = raw["channel_spec"], {}, origin
        return self

    def to_dict(self) -> dict:
        return {"feature_spec": copy.deepcopy(self.feature_spec),
                "source_spec": copy.deepcopy(self.source_spec),
                "channel_spec": copy.deepcopy(self.channel_spec),
                "metadata": copy.deepcopy(self.metadata)}

    def to_yaml(self, path: Optional[str] = None) -> str:
        """Write atomically (temporary name + rename); default path base_directory/feature_spec.yaml."""
        path = os.path.abspath(path or os.path.join(self.base_directory, "feature_spec.yaml"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".feature_spec.", suffix=".tmp", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "w") as f:
                yaml.dump(self.to_dict(), f, Dumper=_NoAliasDumper, sort_keys=False, default_flow_style=None)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        return path

    def copy(self, base_directory: Optional[str] = None) -> "FeatureSpec":
        d = self.to_dict()
        return FeatureSpec(d["feature_spec"], d["source_spec"], d["channel_spec"], d["metadata"],
                           base_directory=base_directory or self.base_directory, origin=self.origin)

    # ------------------------------------------------------------ queries
    def path(self, file: str) -> str:
        """Absolute path of a file named in source_spec."""
        return os.path.join(self.base_directory, file)

    def mappings(self) -> List[str]:
        return list(self.source_spec)

    def for_mapping(self, mapping: str) -> "FeatureSpec":
        """This spec, or the one ``metadata.mapping_specs`` names for ``mapping`` (same features required)."""
        other = (self.metadata.get("mapping_specs") or {}).get(mapping)
        if mapping in self.source_spec or not other:
            return self
        spec = FeatureSpec.from_yaml(os.path.join(self.base_directory, str(other)))
        if spec.feature_spec != self.feature_spec or spec.channel_spec != self.channel_spec:
            raise FeatureSpecError(f"{spec.origin}", f"features or channels differ from {self.origin}")
        if mapping not in spec.source_spec:
            raise FeatureSpecError(f"{spec.origin}: source_spec.{mapping}", "mapping not in the spec that "
                                   f"{self.origin} names for it")
        return spec

    def chunks(self, mapping: str) -> List[dict]:
        if mapping not in self.source_spec:
            raise FeatureSpecError(f"{self.origin}: source_spec.{mapping}",
                                   f"mapping not in spec (has {', '.join(self.source_spec)})")
        return self.source_spec[mapping]

    def features(self, channel: str) -> List[str]:
        """Feature names of a channel, [] when the channel is absent."""
        return list(self.channel_spec.get(channel) or [])

    def dtype(self, feature: str) -> str:
        return str(self.feature_spec[feature][DTYPE])

    def cardinality(self, feature: str) -> int:
        return int(self.feature_spec[feature][CARDINALITY])

    def cardinalities(self, channel: str) -> List[int]:
        """Cardinalities of a categorical channel's features, in channel order."""
        return [self.cardinality(f) for f in self.features(channel)]

    def hotness(self, feature: str) -> int:
        return int(self.feature_spec[feature].get(MAX_HOTNESS, 1))

    def is_multihot(self, feature: str) -> bool:
        """Stored as a list per row (parquet list column, ``;``-separated in csv)."""
        return MAX_HOTNESS in self.feature_spec[feature] or feature in self.features("multihot_categorical")

    def chunk_of(self, mapping: str, feature: str) -> Optional[dict]:
        for chunk in self.chunks(mapping):
            if feature in chunk["features"]:
                return chunk
        return None

    def chunk_type(self, mapping: str) -> str:
        """The single chunk type of a mapping (readers do not mix types within one mapping)."""
        types = {c["type"] for c in self.chunks(mapping)}
        if len(types) != 1:
            raise FeatureSpecError(f"{self.origin}: source_spec.{mapping}", f"mixes chunk types {sorted(types)}")
        return types.pop()

    def num_rows(self, mapping: str) -> int:
        """Rows of a mapping, from file sizes (split_binary) or parquet footers; validates consistency."""
        return self._check_files(mapping)

    # --------------------------------------------------------- validation
    def check_structure(self) -> None:
        """Checks that need no files: declarations, dtypes, cardinalities, chunk shapes; every
        mistake at once (slurm.common.checker), the error raised is the first."""
        ck = _problems(self.origin)
        self._structure(ck)
        ck.raise_problems()

    def _structure(self, ck: Problems) -> None:
        """Record every structural mistake in ``ck``; a check that depends on a bad feature is skipped."""
        good = set()        # features whose attributes are a mapping with a readable dtype
        for name, attrs in self.feature_spec.items():
            key = f"feature_spec.{name}"
            with ck:
                if not isinstance(attrs, dict):
                    ck.fail(key, "attributes must be a mapping (at least dtype)")
                if DTYPE not in attrs:
                    ck.fail(key, "missing dtype")
                if str(attrs[DTYPE]) not in READABLE_DTYPES:
                    ck.fail(key, f"dtype {attrs[DTYPE]!r} cannot be read (readable: {', '.join(READABLE_DTYPES)})")
                good.add(name)
                if CARDINALITY in attrs and (not isinstance(attrs[CARDINALITY], int) or attrs[CARDINALITY] < 1):
                    ck.fail(key, f"cardinality must be a positive integer, got {attrs[CARDINALITY]!r}")
                if MAX_HOTNESS in attrs and (not isinstance(attrs[MAX_HOTNESS], int) or attrs[MAX_HOTNESS] < 1):
                    ck.fail(key, f"max_hotness must be a positive integer, got {attrs[MAX_HOTNESS]!r}")
                if TRANSFORM in attrs:
                    try:
                        parse_transform(attrs[TRANSFORM])
                    except FeatureSpecError as e:
                        ck.fail(key, str(e))
        for channel, feats in self.channel_spec.items():
            with ck:
                if not isinstance(feats, list):
                    ck.fail(f"channel_spec.{channel}", "must be a list of feature names")
                for f in feats:
                    with ck:
                        if f not in self.feature_spec:
                            ck.fail(f"channel_spec.{channel}", f"feature {f!r} is used but not declared in feature_spec"
                                    + _did_you_mean(f, self.feature_spec))
                        if channel in CATEGORICAL_CHANNELS and f in good:
                            if CARDINALITY not in self.feature_spec[f]:
                                ck.fail(f"feature_spec.{f}", f"categorical feature (channel {channel}) has no cardinality")
                            if not str(self.dtype(f)).startswith("int"):
                                ck.fail(f"feature_spec.{f}", f"categorical feature needs an integer dtype, got {self.dtype(f)}")
        for mapping, chunks in self.source_spec.items():
            with ck:
                if not isinstance(chunks, list) or not chunks:
                    ck.fail(f"source_spec.{mapping}", "must be a non-empty list of chunks")
                seen = set()
                for i, chunk in enumerate(chunks):
                    with ck:
                        self._chunk(ck, f"source_spec.{mapping}[{i}]", chunk, seen, good)

    def _chunk(self, ck: Problems, where: str, chunk, seen: set, good: set) -> None:
        """One chunk of a mapping: its first mistake (``seen``: the mapping's features so far)."""
        if not isinstance(chunk, dict):
            ck.fail(where, "a chunk is a mapping with exactly type, features, files")
        for key in chunk:
            if key not in _CHUNK_KEYS:
                ck.record(f"{where}.{keyname(key)}", unknown_key(key, _CHUNK_KEYS))
        missing = [key for key in _CHUNK_KEYS if key not in chunk]
        if missing:
            ck.fail(where, f"a chunk is a mapping with exactly type, features, files (missing: {', '.join(missing)})")
        if chunk["type"] not in CHUNK_TYPES:
            ck.fail(where, f"chunk type {shown(chunk['type'])} cannot be read (known: {', '.join(CHUNK_TYPES)})"
                    + _did_you_mean(chunk["type"], CHUNK_TYPES))
        if not isinstance(chunk["files"], list) or not chunk["files"]:
            ck.fail(where, "files must be a non-empty list")
        if not isinstance(chunk["features"], list) or not chunk["features"]:
            ck.fail(where, "features must be a non-empty list")
        for f in chunk["features"]:
            if f not in self.feature_spec:
                ck.fail(where, f"feature {f!r} is not declared in feature_spec" + _did_you_mean(f, self.feature_spec))
            if f in seen:
                ck.fail(where, f"feature {f!r} appears in two chunks")
            seen.add(f)
        if not set(chunk["features"]) <= good:
            return          # a feature with bad attributes: its own mistake is recorded
        if chunk["type"] == "parquet":
            for f in chunk["features"]:
                if self.dtype(f) in PARQUET_UNREADABLE:
                    ck.fail(f"feature_spec.{f}", f"dtype {self.dtype(f)} cannot be stored in parquet chunks (use float32)")
        if chunk["type"] == "split_binary":
            if len(chunk["files"]) != 1:
                ck.fail(where, "a split_binary chunk has exactly one file")
            dtypes = {self.dtype(f) for f in chunk["features"]}
            if len(dtypes) > 1:
                ck.fail(where, f"features of a split_binary chunk must share one dtype, got {sorted(dtypes)}")
            multihot = self.channel_spec.get("multihot_categorical")     # checked on its own: a list or a mistake
            if any(MAX_HOTNESS in self.feature_spec[f] or (isinstance(multihot, list) and f in multihot)
                   for f in chunk["features"]):
                ck.fail(where, "multi-hot features need parquet or csv chunks")

    def validate(self, mappings: Optional[Iterable[str]] = None) -> Dict[str, int]:
        """Full validation including files; returns rows per mapping. Raises FeatureSpecError."""
        self.check_structure()
        mappings = list(self.source_spec) if mappings is None else list(mappings)
        return {m: self._check_files(m) for m in mappings}

    def check_channels(self, mapping: str) -> None:
        """Every channel feature (except optional channels) must be stored in the mapping."""
        for channel, feats in self.channel_spec.items():
            present = [f for f in feats if self.chunk_of(mapping, f) is not None]
            if channel in OPTIONAL_CHANNELS and not present:
                continue
            for f in feats:
                if f not in present:
                    raise FeatureSpecError(f"{self.origin}: source_spec.{mapping}",
                                           f"feature {f!r} of channel {channel} is in no chunk of this mapping")

    def _check_files(self, mapping: str) -> int:
        rows_seen = None  # (rows, what)
        for i, chunk in enumerate(self.chunks(mapping)):
            where = f"source_spec.{mapping}[{i}]"
            rows = 0
            for file in chunk["files"]:
                p = self.path(file)
                if not os.path.isfile(p):
                    raise FeatureSpecError(p, f"file missing ({where}, features {chunk['features'][0]}...)")
                rows += self._file_rows(p, chunk, where)
            if rows_seen is None:
                rows_seen = (rows, chunk["files"][0])
            elif rows != rows_seen[0]:
                raise FeatureSpecError(self.path(chunk["files"][0]),
                                       f"{rows} rows but {rows_seen[1]} has {rows_seen[0]} ({where})")
        return rows_seen[0]

    def _file_rows(self, path: str, chunk: dict, where: str) -> int:
        if chunk["type"] == "split_binary":
            record = np.dtype(self.dtype(chunk["features"][0])).itemsize * len(chunk["features"])
            size = os.path.getsize(path)
            if size % record:
                raise FeatureSpecError(path, f"size {size} B is not a multiple of the row size {record} B "
                                             f"({len(chunk['features'])} x {self.dtype(chunk['features'][0])}, {where})")
            return size // record
        if chunk["type"] == "parquet":
            import pyarrow.parquet as pq
            try:
                meta = pq.ParquetFile(path)
            except Exception as e:  # pyarrow raises several types for corrupt files
                raise FeatureSpecError(path, f"not a readable parquet file ({type(e).__name__})") from None
            names = set(meta.schema_arrow.names)
            for f in chunk["features"]:
                if f not in names:
                    raise FeatureSpecError(path, f"column {f!r} missing ({where})")
            return meta.metadata.num_rows
        # csv: counting rows means reading the file; the transcoder counts while reading.
        return 0 if not os.path.getsize(path) else _count_lines(path)


def _count_lines(path: str) -> int:
    n = 0
    last = b"\n"
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            n += block.count(b"\n")
            last = block[-1:]
    return n + (last != b"\n")


def main(argv=None) -> int:
    """``python -m recsys.features.spec FILE``: validate a spec and its files, print rows per mapping."""
    import argparse
    import sys
    p = argparse.ArgumentParser(prog="python -m recsys.features.spec", description=main.__doc__)
    p.add_argument("spec", help="feature_spec.yaml (or the directory holding it)")
    a = p.parse_args(argv)
    try:
        rows = FeatureSpec.from_yaml(a.spec).validate()
    except FeatureSpecError as e:
        for problem in getattr(e, "problems", None) or [e]:     # a spec's every mistake, a line each
            print(f"error: {problem}", file=sys.stderr)
        return 2
    for mapping, n in rows.items():
        print(f"{mapping}: {n} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
