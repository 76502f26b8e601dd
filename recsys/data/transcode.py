"""Transcoder: headerless CSV + feature spec -> split_binary (DLRM layout) or parquet (Wide & Deep layout).

    python -m recsys.data.transcode --input CSV_DIR --spec FILE --output DIR \\
        --format split_binary|parquet [--delimiter ,] [--num-files N] [--overwrite]

Which CSV files: for each mapping of the spec, its ``csv`` chunk (one per
mapping, features = the columns in order, files relative to ``--input``);
if the mapping has no csv chunk, ``CSV_DIR/<mapping>.csv`` or every
``CSV_DIR/<mapping>/*.csv`` (sorted), with the columns in the order the
mapping's chunks list its features.

Values are copied, not transformed: the preprocessing already wrote
model-ready numbers (e.g. Criteo's log transform, see preproc/criteo), so
the transcoder applies **no** numerical transform unless a feature declares
``transform: "log(x+C)"`` in the input spec; then it computes
``log(max(x, 0) + C)`` and drops the key from the output spec (so the
transform is never applied twice) and records it under
``metadata.transcoded_transforms``. Empty numerical or categorical fields
read as 0; multi-hot fields hold ``;``-separated ids (empty = no id).
Categorical ids must lie in [0, cardinality), labels must be 0 or 1 (not
empty, not NaN) and numericals finite and within their stored dtype (float16:
|x| <= 65504, else it would be written as inf): anything else is an error
naming the file, the column and, for labels and numericals, the row.

Output: split_binary writes ``<mapping>/label.bin``, ``numerical.bin`` (all
numerical features interleaved), ``cat_<i>.bin`` per categorical (dtype by
cardinality) and ``<feature>.bin`` for other features; parquet writes
``<mapping>/part_<k>.parquet`` (``--num-files``, default 1; use at least
the number of training ranks), cutting files only where the display id
(``map`` channel) changes so a display group never spans two files. The
output directory is built under a temporary name and renamed when complete.
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import shutil
import sys
from typing import Dict, List, Optional

import numpy as np

from recsys.data.writer import ChunkWriter
from recsys.features.spec import (CATEGORICAL_CHANNELS, TRANSFORM, FeatureSpec, FeatureSpecError,
                                  categorical_dtype, parse_transform)

FORMATS = ("split_binary", "parquet")
MULTIHOT_SEP = ";"


def csv_files(spec: FeatureSpec, mapping: str, input_dir: str):
    """(files, columns) of a mapping's CSV input."""
    chunks = spec.chunks(mapping)
    csv = [c for c in chunks if c["type"] == "csv"]
    if len(csv) > 1:
        raise FeatureSpecError(f"{spec.origin}: source_spec.{mapping}", "more than one csv chunk; put all columns in one chunk")
    if csv:
        files = [os.path.join(input_dir, f) for f in csv[0]["files"]]
        columns = list(csv[0]["features"])
    else:
        single = os.path.join(input_dir, f"{mapping}.csv")
        files = [single] if os.path.isfile(single) else sorted(glob.glob(os.path.join(input_dir, mapping, "*.csv")))
        if not files:
            raise FeatureSpecError(single, f"no CSV input for mapping {mapping} (also looked for {mapping}/*.csv)")
        columns = [f for c in chunks for f in c["features"]]
    for f in files:
        if not os.path.isfile(f):
            raise FeatureSpecError(f, f"CSV file of mapping {mapping} missing")
    return files, columns


def output_spec(spec: FeatureSpec, fmt: str, out_dir: str, num_files: int, columns: Dict[str, List[str]]) -> FeatureSpec:
    """The spec of the transcoded dataset: same features and channels, chunks of ``fmt``."""
    out = spec.copy(base_directory=out_dir)
    out.origin = os.path.join(out_dir, "feature_spec.yaml")
    transforms = {}
    for name, attrs in out.feature_spec.items():
        if TRANSFORM in attrs:
            transforms[name] = attrs.pop(TRANSFORM)
    if transforms:
        out.metadata["transcoded_transforms"] = transforms
    role = {}
    for channel, feats in spec.channel_spec.items():
        for f in feats:
            role.setdefault(f, channel)
    for mapping, feats in columns.items():
        if fmt == "parquet":
            for f in feats:  # parquet has no half floats
                if out.feature_spec[f]["dtype"] == "float16":
                    out.feature_spec[f]["dtype"] = "float32"
            out.source_spec[mapping] = [{"type": "parquet", "features": list(feats),
                                         "files": [f"{mapping}/part_{k:03d}.parquet" for k in range(num_files)]}]
            continue
        chunks = []
        label = [f for f in feats if role.get(f) in ("label", "label_ch")]
        numerical = [f for f in feats if role.get(f) == "numerical"]
        if label:
            chunks.append({"type": "split_binary", "features": label, "files": [f"{mapping}/label.bin"]})
        if numerical:
            chunks.append({"type": "split_binary", "features": numerical, "files": [f"{mapping}/numerical.bin"]})
        for f in feats:
            if f in label or f in numerical:
                continue
            if role.get(f) == "categorical":
                i = spec.features("categorical").index(f)
                out.feature_spec[f]["dtype"] = categorical_dtype(spec.cardinality(f))
                chunks.append({"type": "split_binary", "features": [f], "files": [f"{mapping}/cat_{i}.bin"]})
            else:
                chunks.append({"type": "split_binary", "features": [f], "files": [f"{mapping}/{f}.bin"]})
        out.source_spec[mapping] = chunks
    out.check_structure()
    return out


def _parse_multihot(column, where: str):
    """String column 'a;b;c' -> pyarrow list<int64> (empty field -> empty list)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    column = pc.fill_null(column.cast(pa.string()), "")
    lists = pc.split_pattern(column, MULTIHOT_SEP)
    values = lists.flatten()
    keep = pc.not_equal(values, "").to_numpy(zero_copy_only=False)
    row = np.repeat(np.arange(len(lists)), pc.list_value_length(lists).to_numpy(zero_copy_only=False))
    lengths = np.bincount(row[keep], minlength=len(lists))
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    try:
        ints = pc.cast(values.filter(pa.array(keep)), pa.int64())
    except pa.ArrowInvalid as e:
        raise FeatureSpecError(where, f"multi-hot values must be integers separated by '{MULTIHOT_SEP}' ({e})") from None
    return pa.ListArray.from_arrays(pa.array(offsets), ints)


def _check_labels(col, where: str, first_row: int) -> None:
    """A label is 0 or 1: an empty field, NaN or any other value is an error naming its row."""
    x = col.to_numpy(zero_copy_only=False).astype(np.float64)
    bad = np.asarray(col.is_null()) | ~np.isin(x, (0.0, 1.0))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        value = "empty or NaN" if col.is_null()[row].as_py() or np.isnan(x[row]) else f"{x[row]:g}"
        raise FeatureSpecError(f"{where}: row {first_row + row + 1}", f"label {value} is not 0 or 1")


def _convert_block(spec: FeatureSpec, batch, columns: List[str], path: str, first_row: int = 0,
                   out_dtypes: Optional[Dict[str, str]] = None) -> dict:
    """One CSV record batch -> feature arrays, checked and (when declared) transformed.

    ``first_row``: rows of the file before this batch (error messages give 1-based file lines);
    ``out_dtypes``: the stored dtype of each feature (numericals must fit it: float16 overflows
    to inf), default the input spec's."""
    out = {}
    categorical = {f for ch in CATEGORICAL_CHANNELS for f in spec.features(ch)}
    labels = set(spec.features("label")) | set(spec.features("label_ch"))
    for f in columns:
        col = batch.column(f)
        where = f"{path}: column {columns.index(f)} ({f})"
        if f in labels:
            _check_labels(col, where, first_row)
        if spec.is_multihot(f):
            lists = _parse_multihot(col, where)
            vals = lists.values.to_numpy()
            if f in categorical and vals.size and (vals.min() < 0 or vals.max() >= spec.cardinality(f)):
                raise FeatureSpecError(where, f"id outside [0, {spec.cardinality(f)})")
            h = np.diff(lists.offsets.to_numpy())
            if h.size and h.max() > spec.hotness(f):
                raise FeatureSpecError(where, f"a row has {h.max()} ids, more than max_hotness {spec.hotness(f)}")
            out[f] = lists
            continue
        x = col.to_numpy(zero_copy_only=False)
        if col.null_count:     # empty fields read as 0 (a NaN or inf written out stays one: refused below)
            x = np.where(np.asarray(col.is_null()), 0, x.astype(np.float64))
        dtype = spec.dtype(f)
        if dtype == "bool":
            out[f] = x != 0
        elif dtype.startswith("int"):
            if f in categorical and x.size and (x.min() < 0 or x.max() >= spec.cardinality(f)):
                bad = x[(x < 0) | (x >= spec.cardinality(f))][0]
                raise FeatureSpecError(where, f"id {bad} outside [0, {spec.cardinality(f)})")
            out[f] = x.astype(np.int64)
        else:
            shift = parse_transform(spec.feature_spec[f].get(TRANSFORM))
            x = x.astype(np.float64)
            out[f] = np.log(np.maximum(x, 0) + shift) if shift is not None else x
            check_numerical(out[f], (out_dtypes or {}).get(f, dtype), where, first_row)
    return out


def check_numerical(x: np.ndarray, dtype: str, where: str, first_row: int = 0) -> None:
    """Numerical values are finite and fit the stored ``dtype`` (float16: |x| <= 65504): else a
    FeatureSpecError naming the first bad row (1-based file line) and its value."""
    if not x.size:
        return
    limit = float(np.finfo(np.dtype(dtype)).max) if np.dtype(dtype).kind == "f" else math.inf
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(x) | (np.abs(x) > limit)
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        value = float(x[row])
        why = (f"{value:g} is not a finite number" if not math.isfinite(value) else
               f"{value:g} overflows {dtype} (largest {limit:g}): scale the column (e.g. transform: \"log(x+C)\") "
               f"or write --format parquet (float32)")
        raise FeatureSpecError(f"{where}: row {first_row + row + 1}", f"numerical value {why}")


def _read_csv(path: str, spec: FeatureSpec, columns: List[str], delimiter: str, block_bytes: int):
    """Stream a headerless CSV as record batches with the spec's column types. Only an empty field
    is missing (pyarrow's other null spellings, "nan" and "NA" among them, are not: a written NaN
    is refused as a non-finite numerical, not read as 0)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    types = {}
    for f in columns:
        d = spec.dtype(f)
        types[f] = pa.string() if spec.is_multihot(f) else (pa.float64() if d.startswith("float") else pa.int64())
    try:
        reader = pcsv.open_csv(path, read_options=pcsv.ReadOptions(column_names=columns, block_size=block_bytes),
                               parse_options=pcsv.ParseOptions(delimiter=delimiter),
                               convert_options=pcsv.ConvertOptions(column_types=types, strings_can_be_null=True,
                                                                                  null_values=[""]))
        for batch in reader:
            yield batch
    except pa.ArrowInvalid as e:
        raise FeatureSpecError(path, f"cannot parse as headerless CSV with {len(columns)} columns "
                                     f"({str(e).splitlines()[0]})") from None


def _group_cut(map_values: Optional[np.ndarray], start: int, previous) -> Optional[int]:
    """First index >= start where a new display group begins (start itself without a map column)."""
    if map_values is None:
        return start
    for i in range(start, len(map_values)):
        prev = map_values[i - 1] if i > 0 else previous
        if prev is None or map_values[i] != prev:
            return i
    return None


def transcode(spec: FeatureSpec, input_dir: str, output_dir: str, fmt: str, num_files: int = 1,
              delimiter: str = ",", overwrite: bool = False, block_bytes: int = 16 << 20,
              log=print) -> FeatureSpec:
    """Transcode every mapping of ``spec``; returns the validated output spec."""
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if num_files < 1:
        raise ValueError(f"--num-files must be >= 1, got {num_files}")
    if not os.path.isdir(input_dir):
        raise FeatureSpecError(input_dir, "input directory not found")
    output_dir = os.path.abspath(output_dir)
    if os.path.exists(output_dir) and os.listdir(output_dir) and not overwrite:
        raise FeatureSpecError(output_dir, "output exists and is not empty (pass --overwrite)")
    inputs = {m: csv_files(spec, m, input_dir) for m in spec.mappings()}
    tmp_dir = f"{output_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp_dir, ignore_errors=True)
    out = output_spec(spec, fmt, tmp_dir, num_files, {m: cols for m, (_, cols) in inputs.items()})
    out_dtypes = {f: out.dtype(f) for f in out.feature_spec}
    try:
        for mapping, (files, columns) in inputs.items():
            total = sum(_count_rows(p) for p in files) if fmt == "parquet" else 0
            bounds = [math.ceil(total * (k + 1) / num_files) for k in range(num_files)]
            map_feats = [f for f in spec.features("map") if f in columns]
            writer = ChunkWriter(out, mapping)
            rows, part, previous = 0, 0, None
            for path in files:
                file_rows = 0
                for batch in _read_csv(path, spec, columns, delimiter, block_bytes):
                    data = _convert_block(spec, batch, columns, path, file_rows, out_dtypes)
                    file_rows += batch.num_rows
                    n = batch.num_rows
                    mv = data[map_feats[0]] if map_feats else None
                    lo = 0
                    while fmt == "parquet" and part < num_files - 1 and bounds[part] < rows + n:
                        cut = _group_cut(mv, max(lo, bounds[part] - rows), previous)
                        if cut is None:
                            break
                        if cut > lo:
                            writer.write({f: v[lo:cut] for f, v in data.items()}, part)
                        lo = cut
                        part += 1
                    if lo < n:
                        writer.write({f: v[lo:] for f, v in data.items()}, part)
                    previous = mv[-1] if mv is not None and n else previous
                    rows += n
            writer.close()
            log(f"transcode: {mapping}: {rows} rows from {len(files)} file(s)")
        out.to_yaml(os.path.join(tmp_dir, "feature_spec.yaml"))
        FeatureSpec.from_yaml(os.path.join(tmp_dir, "feature_spec.yaml")).validate()
        if os.path.exists(output_dir):
            shutil.rmtree(output_dir)
        os.replace(tmp_dir, output_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    return FeatureSpec.from_yaml(os.path.join(output_dir, "feature_spec.yaml"))


def _count_rows(path: str) -> int:
    from recsys.features.spec import _count_lines
    return _count_lines(path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m recsys.data.transcode",
                                description="Headerless CSV + feature spec -> split_binary or parquet dataset.")
    p.add_argument("--input", required=True, help="directory holding the CSV files")
    p.add_argument("--spec", required=True, help="feature spec YAML describing the CSV columns")
    p.add_argument("--output", required=True, help="output directory (gets feature_spec.yaml)")
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--num-files", type=int, default=1, help="parquet files per mapping (>= training ranks)")
    p.add_argument("--delimiter", default=",", help="field separator (Criteo raw files: a tab)")
    p.add_argument("--overwrite", action="store_true")
    a = p.parse_args(argv)
    delimiter = "\t" if a.delimiter in ("\\t", "tab") else a.delimiter
    try:
        spec = FeatureSpec.from_yaml(a.spec)
        transcode(spec, a.input, a.output, a.format, a.num_files, delimiter, a.overwrite)
    except (FeatureSpecError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {os.path.join(a.output, 'feature_spec.yaml')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
