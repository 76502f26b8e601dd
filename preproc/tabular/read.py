"""A user's CSV or parquet files -> typed dask partitions (pandas), with bad rows flagged.

``input_frame(files, config)`` gives a dask DataFrame whose partitions follow the
input (file by file, block by block) with:

* ``_row`` (global row number in file order: the random split's key), ``_file``
  (index of the input file), ``_bad`` (the row is dropped and counted per file) and
  ``_why`` (int16: 0, or 1 + the index in :func:`bad_reasons` of the first reason the
  row is bad, so that a bad-row message can name the column and the reason);
* ``label`` float32 0/1: the label column's values (``positive`` values -> 1, other
  values -> 0; without ``positive`` the column must hold 0/1); ``_label_kind`` (int8:
  0, 1, :data:`OTHER` or :data:`MISSING`) and ``_label_other`` (the value as text when
  it is neither 0 nor 1, else None): a column of other values is refused as a whole
  (``check_labels``), not dropped row by row (a -1/1 column would lose a class);
* categorical columns as text (None when missing), multi-hot columns as arrays of
  text (a parquet list, or a string cut at the column's separator), numerical
  columns as float64 (NaN when missing or a written NaN; not a number or infinite -> bad row);
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
from preproc.tabular.config import LABEL, TabularConfig, key_column, label_text
from preproc.tabular.split import group_ids, time_values

BLOCK_BYTES = 64 << 20
MAP = "map"
OTHER, MISSING = 2, 3          # _label_kind of a label neither 0 nor 1, and of a missing one
DECIMAL_COMMA = "a decimal comma (3,5: write 3.5, or convert the file)"
SEPARATORS = (";", "\t", "|", ",")   # what a header cut at the wrong separator shows inside one name
CONTINUOUS_LABEL_VALUES = 10   # more distinct numbers than this in a label: a continuous value, not classes


def bad_reasons(config: TabularConfig) -> list[str]:
    """Why a row is bad, per column: ``_why`` is 1 + the index in this list."""
    out = [f"label {config.label!r}: missing", f"label {config.label!r}: neither 0 nor 1"]
    for c in config.numerical:
        out += [f"numerical {c.column!r}: not a number", f"numerical {c.column!r}: infinite",
                f"numerical {c.column!r}: {DECIMAL_COMMA}"]
    if config.map:
        out.append(f"map {config.map!r}: missing")
    if config.time:
        out.append(f"time {config.time!r}: missing or not a time")
    return out


def _code(reasons: list, column: str, what: str) -> int:
    return reasons.index(next(r for r in reasons if r.endswith(f"{column!r}: {what}"))) + 1


def header_names(path: Path, separator: str) -> list[str]:
    """The CSV header's names as written (pandas renames a repeated name ``x.1``)."""
    import csv
    import io

    from pandas.io.common import get_handle

    with get_handle(str(path), "r", compression="infer", encoding="utf-8", errors="replace") as handle:
        line = handle.handle.readline()
    return [name.strip() for name in next(csv.reader(io.StringIO(line), delimiter=separator), [])]


def check_unique_names(path: Path, names: list[str]) -> None:
    """A column named twice is refused in one line: reading would silently pick one of the two."""
    seen: dict = {}
    for index, name in enumerate(names):
        if name in seen:
            raise PreprocError(f"{path}: the header names column {name!r} twice (columns {seen[name] + 1} and "
                               f"{index + 1}): rename one")
        seen[name] = index


def separator_hint(names: list[str], config: TabularConfig) -> str:
    """When the header reads as one name holding another separator: the ``csv`` key that reads it."""
    if len(names) != 1:
        return ""
    for sep in SEPARATORS:
        if sep != config.csv_separator and sep in names[0]:
            shown, quoted = ("tab", '"\\t"') if sep == "\t" else (repr(sep), f"'{sep}'")
            return f"; the header looks separated by {shown}: set `csv: {{separator: {quoted}}}` in {config.source}"
    return ""


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
            names = list(pq.read_schema(path).names)
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise PreprocError(f"{path}: not a readable parquet file: {str(exc).splitlines()[0]}") from None
        check_unique_names(path, names)
        return names
    try:
        header = pd.read_csv(path, sep=separator, nrows=0, compression="infer")
        names = header_names(path, separator)
    except (ValueError, OSError, UnicodeDecodeError) as exc:
        raise PreprocError(f"{path}: no readable CSV header line: {str(exc).splitlines()[0]}") from None
    check_unique_names(path, names)
    return [str(c) for c in header.columns]


def check_columns(files: list[Path], fmt: str, config: TabularConfig) -> None:
    """Every configured column in every file, and of a type its role can read (parquet), else one
    line naming the file and the column."""
    for path in files:
        names = file_columns(path, fmt, config.csv_separator)
        have = set(names)
        missing = [c for c in config.input_columns if c not in have]
        if missing:
            raise PreprocError(f"{path}: has no column {missing[0]!r} (named in {config.source}; "
                               f"columns: {', '.join(sorted(have)[:20])}){separator_hint(names, config)}")
        if fmt == "parquet":
            check_types(path, config)


def check_types(path: Path, config: TabularConfig) -> None:
    """A nested parquet column (list, struct, map) is read only as a multi-hot list: as a categorical
    it would become the text of the list, as a number every row would be bad; one line instead."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    roles = [("categorical", c.column) for c in config.categorical] + [("numerical", c.column)
                                                                      for c in config.numerical]
    roles += [("label", config.label)] * bool(config.label)
    roles += [(k, getattr(config, k)) for k in ("map", "time") if getattr(config, k)]
    for role, column in roles:
        typ = schema.field(column).type
        if pa.types.is_nested(typ):
            lists = role == "categorical" and (pa.types.is_list(typ) or pa.types.is_large_list(typ))
            hint = "a list of ids per row goes under `multihot`" if lists else "flatten it into plain columns"
            raise PreprocError(f"{path}: column {column!r} is {typ}, a nested type: a {role} column holds one "
                               f"value per row ({hint})")
    for m in config.multihot:
        typ = schema.field(m.column).type
        if pa.types.is_struct(typ) or pa.types.is_map(typ):
            raise PreprocError(f"{path}: column {m.column!r} is {typ}: a multihot column is a list or a "
                               f"string cut at its separator")


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


def decimal_commas(values: pd.Series) -> np.ndarray:
    """Where a value is a number written with a decimal comma (``3,5``, ``-0,25``)."""
    if not (values.dtype == object or pd.api.types.is_string_dtype(values.dtype)):
        return np.zeros(len(values), dtype=bool)
    return values.astype(str).str.strip().str.fullmatch(r"[+-]?\d*,\d+").fillna(False).to_numpy(dtype=bool)


def _cell_text(v) -> str:
    """A categorical cell as text: whole floats without ".0", so 3 and 3.0 are one value."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v).strip()


def _text(values: pd.Series, missing: pd.Series, as_text=_cell_text) -> pd.Series:
    """Values as text (``as_text`` of each: a categorical's, or config.label_text), None where missing."""
    return values.astype(object).where(~missing, None).map(lambda v: None if v is None else as_text(v))


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
    reasons = bad_reasons(config)
    out = pd.DataFrame({"_row": np.arange(first_row, first_row + n, dtype=np.int64),
                        "_file": np.full(n, file_index, dtype=np.int32)})
    why = np.zeros(n, dtype=np.int16)

    def flag(mask, column, what):          # the first reason of a row is the one reported
        why[(why == 0) & np.asarray(mask, dtype=bool)] = _code(reasons, column, what)

    raw = frame[config.label] if config.label else pd.Series(np.zeros(n, np.float32))
    gone = _missing(raw, tokens)
    kind = np.full(n, MISSING, dtype=np.int8)
    other = np.full(n, None, dtype=object)
    if not config.label:              # rows without labels (tabular apply): the placeholder 0
        label = raw
        kind[:] = 0
    elif config.positive:
        label = _text(raw, gone, label_text).isin(config.positive).astype("float32")
        kind[~gone.to_numpy()] = label.to_numpy()[~gone.to_numpy()].astype(np.int8)
    else:
        number = pd.to_numeric(raw.where(~gone), errors="coerce")
        binary = number.isin([0, 1]).to_numpy()
        label = number.where(binary, 0).astype("float32")
        kind[binary] = number.to_numpy()[binary].astype(np.int8)
        odd = ~binary & ~gone.to_numpy()
        kind[odd] = OTHER
        other[odd] = _text(raw[odd], gone[odd]).to_numpy(dtype=object)
        flag(odd, config.label, "neither 0 nor 1")
    flag(gone, config.label, "missing")
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
        flag(~gone.to_numpy() & ~finite & decimal_commas(values), c.column, DECIMAL_COMMA)
        flag(~gone.to_numpy() & np.isinf(number.to_numpy()), c.column, "infinite")
        flag(~gone.to_numpy() & ~finite, c.column, "not a number")
        out[c.column] = number.where(~gone & finite).to_numpy()
    for k, stored in config.key_columns.items():      # as they are: any type, nulls kept
        values = frame[k].astype(object)
        out[stored] = values.where(values.notna(), None).to_numpy(dtype=object)
    if config.map:
        groups = frame[config.map]
        gone = _missing(groups, tokens)
        flag(gone, config.map, "missing")
        out[MAP] = group_ids(groups.where(~gone, 0 if pd.api.types.is_numeric_dtype(groups.dtype) else ""))
    if config.time:
        times = time_values(frame[config.time].where(~_missing(frame[config.time], tokens)))
        flag(times.isna(), config.time, "missing or not a time")
        out["_time"] = times.to_numpy(dtype=np.float64)
    out["_bad"] = why > 0
    out["_why"] = why
    out["_label_kind"] = kind
    out["_label_other"] = other
    return out


def meta(config: TabularConfig) -> pd.DataFrame:
    """An empty frame with the dtypes of :func:`parse_piece`'s output."""
    cols = {"_row": "int64", "_file": "int32", LABEL: "float32"}
    cols.update({c.column: "object" for c in config.categorical})
    cols.update({m.column: "object" for m in config.multihot})
    cols.update({c.column: "float64" for c in config.numerical})
    cols.update({stored: "object" for stored in config.key_columns.values()})
    if config.map:
        cols[MAP] = "int64"
    if config.time:
        cols["_time"] = "float64"
    cols.update({"_bad": "bool", "_why": "int16", "_label_kind": "int8", "_label_other": "object"})
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


def check_labels(kinds: pd.Series, others: pd.Series, config: TabularConfig) -> None:
    """``kinds``: rows per ``_label_kind``; ``others``: rows per label value that is neither 0 nor 1.
    A label column of other values (-1/1, 1/2, 0/5, yes/no) is refused in one line naming the
    values seen and the ``positive`` key that maps them: dropped row by row it would leave one class."""
    if not len(others):
        return
    continuous_label(kinds, others, config)
    seen = {"0": int(kinds.get(0, 0)), "1": int(kinds.get(1, 0))}
    seen.update({str(k): int(v) for k, v in others.items()})
    seen = {k: v for k, v in sorted(seen.items(), key=lambda kv: -kv[1]) if v}
    shown = ", ".join(f"{k!r} ({v} rows)" for k, v in list(seen.items())[:5])
    more = f" and {len(seen) - 5} more values" if len(seen) > 5 else ""
    numbers = pd.to_numeric(pd.Series(list(seen)), errors="coerce")
    suggest = label_text(numbers.max()) if numbers.notna().all() else list(seen)[-1]
    raise PreprocError(f"{config.source}: label column {config.label!r} must hold the two classes 0 and 1; "
                       f"values seen: {shown}{more}: map them with `label: {{column: {config.label}, positive: "
                       f"[{yaml_value(suggest)}]}}` (the values in `positive` -> 1, every other value -> 0)")


def continuous_label(kinds: pd.Series, others: pd.Series, config: TabularConfig) -> None:
    """A label of many distinct numbers (a rating, a price) is a value to regress, not two classes:
    no ``positive`` list maps it, so the one line says what to do instead."""
    numbers = pd.to_numeric(pd.Series(list(others.index)), errors="coerce")
    distinct = len(others) + sum(1 for k in (0, 1) if int(kinds.get(k, 0)))
    if numbers.isna().any() or distinct <= CONTINUOUS_LABEL_VALUES:
        return
    raise PreprocError(f"{config.source}: label column {config.label!r} holds {distinct} distinct numbers from "
                       f"{label_text(numbers.min())} to {label_text(numbers.max())}, a continuous value: the "
                       "models here are binary classifiers; add a 0/1 column to the table (e.g. 1 where "
                       f"{config.label} >= a threshold of your choice) and name it as `label`")


def yaml_value(text: str) -> str:
    """``text`` as the config should spell it in a flow list: bare where YAML reads it back as that
    text (or as a number written that way), else single-quoted: a bare `no`, `True` or `on` is a
    boolean to YAML, which `positive` refuses, so a suggestion pasted as printed must not be one."""
    import yaml
    try:
        back = yaml.safe_load(f"[{text}]")
    except yaml.YAMLError:
        back = None
    if isinstance(back, list) and len(back) == 1 and not isinstance(back[0], bool) \
            and isinstance(back[0], (str, int, float)) and str(back[0]) == text:
        return text
    return "'" + text.replace("'", "''") + "'"


def first_bad_rows(frame: pd.DataFrame, keep: int = 3) -> pd.DataFrame:
    """The first ``keep`` bad rows of each reason of one partition: (_why, _file, _row)."""
    bad = frame.loc[frame["_why"] > 0, ["_why", "_file", "_row"]]
    return bad.sort_values("_row", kind="stable").groupby("_why", sort=True).head(keep)


def describe_bad_rows(first: pd.DataFrame, counts: pd.Series, config: TabularConfig, file_offsets: dict,
                      files: list, keep: int = 3) -> str:
    """One line: per reason, its rows and the first ``keep`` (file name and 0-based data row of
    that file, the header line not counted), most frequent reason first."""
    reasons = bad_reasons(config)
    parts = []
    for code, n in sorted(((int(k), int(v)) for k, v in counts.items() if int(k)), key=lambda kv: -kv[1]):
        rows = first[first["_why"] == code].sort_values("_row").head(keep)
        at = ", ".join(f"{Path(str(files[int(f)])).name} row {int(r) - file_offsets[int(f)]}"
                       for f, r in zip(rows["_file"], rows["_row"]))
        parts.append(f"{reasons[code - 1]}: {n} row(s) ({at}{', ...' if n > keep else ''})")
    return "; ".join(parts)
