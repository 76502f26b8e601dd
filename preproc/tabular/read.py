"""A user's CSV or parquet files -> typed dask partitions (pandas), with bad rows flagged.

``input_frame(files, config)`` gives a dask DataFrame whose partitions follow the
input (file by file, block by block) with:

* ``_row`` (global row number in file order: the random split's key), ``_file``
  (index of the input file), ``_bad`` (the row is dropped and counted per file);
* ``label`` float32 0/1: the label column's values (``positive`` values -> 1, other
  values -> 0; without ``positive`` the column must hold 0/1, anything else is bad);
* categorical columns as text (None when missing), multi-hot columns as arrays of
  text (a parquet list, or a string cut at the column's separator), numerical
  columns as float64 (NaN when missing or a written NaN; unparsable or infinite -> bad row);
* ``map`` int64 (the group's id, preproc.tabular.split.group_ids) and ``_time``
  float64 when the config names those columns (a missing time is a bad row).

Values listed in ``missing_values`` and empty CSV fields count as missing. Nothing
is read before :func:`check_columns` has found every configured column in every file.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from preproc.errors import PreprocError
from preproc.tabular.config import LABEL, TabularConfig
from preproc.tabular.split import group_ids, time_values

BLOCK_BYTES = 64 << 20
MAP = "map"


def input_format(files: list[Path], config: TabularConfig) -> str:
    """csv or parquet: the config's ``format``, else from the file names (one-line error on a mix)."""
    if config.format:
        return config.format
    kinds = {"parquet" if any(s in (".parquet", ".pq") for s in f.suffixes) else "csv" for f in files}
    if len(kinds) > 1:
        raise PreprocError(f"--input: mixes parquet and CSV files (set `format` in {config.source})")
    return kinds.pop()


def file_columns(path: Path, fmt: str, separator: str) -> list[str]:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(path).names)
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise PreprocError(f"{path}: not a readable parquet file: {str(exc).splitlines()[0]}") from None
    try:
        header = pd.read_csv(path, sep=separator, nrows=0, compression="infer")
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise PreprocError(f"{path}: no readable CSV header line: {str(exc).splitlines()[0]}") from None
    return [str(c) for c in header.columns]


def check_columns(files: list[Path], fmt: str, config: TabularConfig) -> None:
    """Every configured column in every file, else one line naming the file and the column."""
    for path in files:
        have = set(file_columns(path, fmt, config.csv_separator))
        missing = [c for c in config.input_columns if c not in have]
        if missing:
            raise PreprocError(f"{path}: has no column {missing[0]!r} (named in {config.source}; "
                               f"columns: {', '.join(sorted(have)[:20])})")


def raw_pieces(files: list[Path], fmt: str, config: TabularConfig):
    """[(file index, delayed pandas frame of the configured columns)] in file order."""
    import dask.dataframe as dd

    pieces = []
    for index, path in enumerate(files):
        if fmt == "parquet":
            ddf = dd.read_parquet(str(path), columns=config.input_columns, index=False)
        else:
            ddf = dd.read_csv(str(path), sep=config.csv_separator, usecols=config.input_columns, dtype=str,
                              keep_default_na=False, na_filter=False, blocksize=BLOCK_BYTES,
                              compression="infer" if not str(path).endswith((".gz", ".bz2", ".xz", ".zip"))
                              else _compression(path))
        pieces += [(index, part) for part in ddf.to_delayed()]
    return pieces


def _compression(path) -> str:
    return {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zip": "zip"}[os.path.splitext(str(path))[1]]


def _missing(values: pd.Series, tokens: tuple) -> pd.Series:
    """True where a value is missing: null, an empty string, or one of ``tokens`` (as text)."""
    out = values.isna()
    if values.dtype == object or pd.api.types.is_string_dtype(values.dtype):
        text = values.astype(object).where(~out, "").astype(str).str.strip()
        out |= (text == "") | text.isin(tokens)
    elif tokens:
        out |= values.astype(str).isin(tokens)
    return out


def _text(values: pd.Series, missing: pd.Series) -> pd.Series:
    """Values as text (whole floats without ".0", so 3 and 3.0 are one value), None where missing."""
    def one(v):
        if isinstance(v, float) and v.is_integer():
            return str(int(v))
        return str(v).strip()

    return values.astype(object).where(~missing, None).map(lambda v: None if v is None else one(v))


def _lists(values: pd.Series, missing: pd.Series, separator: str) -> pd.Series:
    def one(v):
        if v is None:
            return np.array([], dtype=object)
        if isinstance(v, str):
            items = [s.strip() for s in v.split(separator)]
        else:
            items = [str(s).strip() for s in v if s is not None]
        return np.array([s for s in items if s], dtype=object)

    return pd.Series([one(v) for v in values.astype(object).where(~missing, None)], index=values.index,
                     dtype=object)


def parse_piece(frame: pd.DataFrame, file_index: int, first_row: int, config: TabularConfig) -> pd.DataFrame:
    """One raw partition -> the typed frame of the module docstring (bad rows flagged, not dropped)."""
    n = len(frame)
    frame = frame.reset_index(drop=True)
    tokens = config.missing_values
    out = pd.DataFrame({"_row": np.arange(first_row, first_row + n, dtype=np.int64),
                        "_file": np.full(n, file_index, dtype=np.int32)})
    bad = np.zeros(n, dtype=bool)
    raw = frame[config.label]
    gone = _missing(raw, tokens)
    if config.positive:
        label = _text(raw, gone).isin(config.positive).astype("float32")
    else:
        number = pd.to_numeric(raw.where(~gone), errors="coerce")
        bad |= (~number.isin([0, 1])).to_numpy()
        label = number.where(number.isin([0, 1]), 0).astype("float32")
    bad |= gone.to_numpy()
    out[LABEL] = label.to_numpy(dtype=np.float32)
    for c in config.categorical:
        out[c.column] = _text(frame[c.column], _missing(frame[c.column], tokens)).to_numpy(dtype=object)
    for m in config.multihot:
        out[m.column] = _lists(frame[m.column], _missing(frame[m.column], tokens), m.separator).to_numpy()
    for c in config.numerical:
        values = frame[c.column]
        gone = _missing(values, tokens)
        number = pd.to_numeric(values.where(~gone), errors="coerce").astype("float64")
        gone |= values.astype(str).str.strip().str.lower().eq("nan")          # a written NaN is missing
        finite = np.isfinite(number.to_numpy())
        bad |= ~gone.to_numpy() & ~finite                                     # unparsable or infinite
        out[c.column] = number.where(~gone & finite).to_numpy()
    if config.map:
        groups = frame[config.map]
        gone = _missing(groups, tokens)
        bad |= gone.to_numpy()
        out[MAP] = group_ids(groups.where(~gone, 0 if pd.api.types.is_numeric_dtype(groups.dtype) else ""))
    if config.time:
        times = time_values(frame[config.time].where(~_missing(frame[config.time], tokens)))
        bad |= times.isna().to_numpy()
        out["_time"] = times.to_numpy(dtype=np.float64)
    out["_bad"] = bad
    return out


def meta(config: TabularConfig) -> pd.DataFrame:
    """An empty frame with the dtypes of :func:`parse_piece`'s output."""
    cols = {"_row": "int64", "_file": "int32", LABEL: "float32"}
    cols.update({c.column: "object" for c in config.categorical})
    cols.update({m.column: "object" for m in config.multihot})
    cols.update({c.column: "float64" for c in config.numerical})
    if config.map:
        cols[MAP] = "int64"
    if config.time:
        cols["_time"] = "float64"
    cols["_bad"] = "bool"
    return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in cols.items()})


def input_frame(files: list[Path], config: TabularConfig):
    """(dask DataFrame of typed rows, bad rows included, flagged; number of raw rows)."""
    import dask
    import dask.dataframe as dd

    fmt = input_format(files, config)
    check_columns(files, fmt, config)
    pieces = raw_pieces(files, fmt, config)
    lengths = dask.compute(*[dask.delayed(len)(part) for _, part in pieces])
    firsts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int) if pieces else []
    parse = dask.delayed(parse_piece, pure=True)
    parsed = dd.from_delayed([parse(part, index, int(first), config)
                              for (index, part), first in zip(pieces, firsts)], meta=meta(config),
                             verify_meta=False)
    return parsed, int(sum(lengths))
