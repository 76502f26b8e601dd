"""The YAML that describes a user's table (``python -m preproc tabular run --config FILE``).

Pure Python (yaml only): the file is checked before any data is read, and every
problem is one ``PreprocError`` line naming the file and the key. Example (the
Adult census table)::

    label: {column: income, positive: [">50K"]}     # or just `label: clicked` (values 0/1)
    categorical: [workclass, education, {column: native-country, threshold: 5}]
    numerical: [age, {column: capital-gain, transform: log}]
    missing_values: ["?"]

Keys (only ``label`` is required; at least one feature column):

``label``
    a column name (values 0/1) or ``{column, positive: [values that mean 1]}`` (every other
    value means 0). A column of other values (-1/1, 1/2, yes/no) without ``positive`` is refused
    (preproc.tabular.read.check_labels), as is a split of one class.
``categorical``
    columns -> dense ids by training frequency; entries are names or
    ``{column, threshold}``.
``multihot``
    list columns (parquet lists, or strings cut at ``separator``, default ``|``);
    entries ``{column, separator, max_hotness, threshold}``.
``numerical``
    entries are names or ``{column, transform}``; transform ``standard`` (the
    default: ``(x - mean) / std`` with training statistics, missing -> the mean,
    i.e. 0), ``log`` (``log(1 + max(x, 0))``, missing -> 0) or ``none`` (missing -> 0).
``threshold``
    default frequency threshold: a value seen fewer than T times in the training
    rows gets id 0, as unseen and missing values do (default 1: every training value).
``map``
    optional group column (Wide & Deep's MAP@12 groups, e.g. a display or session
    id); the split keeps a group on one side, a test group never spans two files.
``time``
    optional time column (numbers or date strings); ``split.method`` then defaults to ``time``.
``split``
    ``{method: random|time, test_fraction: 0.2, validation_fraction: 0.1, seed: 0}``. random:
    each row (each group with ``map``) is a test row with probability ``test_fraction``, from a
    seeded hash of its row number (group value); time: the latest ``test_fraction`` of the
    rows by time are test rows (rows tied with the cut go to test). ``validation_fraction``
    (of all rows, taken from the non-test rows; 0: no validation mapping) makes the
    ``validation`` mapping the training run judges its epochs on (early stop, best model),
    so that the test rows are evaluated once: random, from a second hash with another salt
    (independent of the test draw; by group with ``map``); time, the latest rows before the
    test cut. The workflow is fitted on the training rows only.
``models``
    which feature specs to write (``dlrm``, ``wide_deep``, ``ncf``); the first one is
    ``feature_spec.yaml``. Default: the models that read the table: ``wide_deep`` always
    (numerical columns alone too), ``dlrm`` with numerical and categorical columns and no
    multi-hot ones, ``ncf`` with an ``ncf`` key.
``ncf``
    ``{user: column, item: column}``: two of the categorical columns, NCF's channels.
``keys``
    columns that identify a row (an id, a date): copied as they are, not transformed and not
    features, into every parquet file the dataset and ``tabular apply`` write, as ``key_<column>``
    (CSV values as text, parquet values in their own type), so that ``recsys-train --run-mode
    predict`` can name each row's score by them; a key may also be a feature. The spec's
    ``metadata.keys`` maps each key to its stored column. Not ``file``, ``row`` or ``score``
    (the predictions' own columns).
``format``
    ``csv`` or ``parquet`` (default: from the input's file names; CSV files start with a
    header line naming the columns); ``csv: {separator}`` (default ``,``);
    ``missing_values``: values read as missing (besides empty fields and nulls).
"""
from __future__ import annotations

import collections
import dataclasses
import os
from typing import Optional

from preproc.errors import PreprocError
from slurm.common.checker import Problems, unknown_key
from slurm.common.yamlfile import YamlFileError, control_char, keyname, load_yaml_file, shown

TRANSFORMS = ("standard", "log", "none")
SPLIT_METHODS = ("random", "time")
MODELS = ("dlrm", "wide_deep", "ncf")
FORMATS = ("csv", "parquet")
KEYS = ("label", "categorical", "multihot", "numerical", "threshold", "map", "time", "split", "models", "ncf",
        "format", "csv", "missing_values", "keys")
LABEL = "label"  # the label's column name in the output
KEY_PREFIX = "key_"  # a key column's name in the output: key_<column>
RESERVED_KEYS = ("file", "row", "score")  # the predictions' own columns (recsys.engine.predict)


@dataclasses.dataclass(frozen=True)
class Categorical:
    column: str
    threshold: int


@dataclasses.dataclass(frozen=True)
class MultiHot:
    column: str
    threshold: int
    separator: str = "|"
    max_hotness: Optional[int] = None   # None: the longest list of the training rows


@dataclasses.dataclass(frozen=True)
class Numerical:
    column: str
    transform: str = "standard"


@dataclasses.dataclass(frozen=True)
class TabularConfig:
    label: str
    positive: Optional[tuple] = None          # label values meaning 1; None: the column holds 0/1
    categorical: tuple = ()
    multihot: tuple = ()
    numerical: tuple = ()
    map: Optional[str] = None
    time: Optional[str] = None
    split_method: str = "random"
    test_fraction: float = 0.2
    seed: int = 0
    validation_fraction: float = 0.1          # of all rows, taken from the non-test ones; 0: none
    models: tuple = ("wide_deep",)
    ncf_user: Optional[str] = None
    ncf_item: Optional[str] = None
    format: Optional[str] = None
    csv_separator: str = ","
    missing_values: tuple = ()
    keys: tuple = ()                          # row identifiers copied as they are (key_<column>)
    source: str = "<config>"

    @property
    def input_columns(self) -> list:
        """Every column the pipeline reads, in config order (label first; none for rows without labels)."""
        cols = [self.label] * bool(self.label) + [c.column for c in self.categorical] + [m.column for m in self.multihot]
        cols += [n.column for n in self.numerical] + [c for c in (self.map, self.time) if c]
        return list(dict.fromkeys(cols + list(self.keys)))

    @property
    def key_columns(self) -> dict:
        """{key column: its name in the output parquet files}."""
        return {k: key_column(k) for k in self.keys}

    def to_dict(self) -> dict:
        """The config in the YAML format (what is saved next to the data)."""
        out = {"label": {"column": self.label, **({"positive": list(self.positive)} if self.positive else {})},
               "categorical": [{"column": c.column, "threshold": c.threshold} for c in self.categorical],
               "multihot": [{"column": m.column, "threshold": m.threshold, "separator": m.separator,
                             **({"max_hotness": m.max_hotness} if m.max_hotness else {})} for m in self.multihot],
               "numerical": [{"column": n.column, "transform": n.transform} for n in self.numerical],
               "split": {"method": self.split_method, "test_fraction": self.test_fraction, "seed": self.seed,
                         "validation_fraction": self.validation_fraction},
               "models": list(self.models), "csv": {"separator": self.csv_separator},
               "missing_values": list(self.missing_values)}
        for key in ("map", "time", "format"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.ncf_user:
            out["ncf"] = {"user": self.ncf_user, "item": self.ncf_item}
        if self.keys:
            out["keys"] = list(self.keys)
        return out


def key_column(name: str) -> str:
    """A key column's name in the output (prefixed: a key may also be a feature of that name)."""
    return KEY_PREFIX + name


def load_config(path: str) -> TabularConfig:
    """Read and check a config file (the toolkit's YAML limits: slurm/common/yamlfile.py); one-line
    PreprocError naming the file and key otherwise."""
    if not os.path.exists(path):
        raise PreprocError(f"--config: {path}: no such file")
    try:
        raw = load_yaml_file(path)
    except YamlFileError as exc:
        raise PreprocError(f"--config: {exc}") from None
    return parse_config(raw, path)


def parse_config(raw, source: str = "<config>") -> TabularConfig:
    """A TabularConfig from the parsed YAML ``raw`` (``source`` names it in errors). A value is
    shown only through ``shown`` (a nested value printed whole can take exponential time)."""

    ck = Problems(source, PreprocError)
    fail = ck.fail
    if not isinstance(raw, dict):
        raise PreprocError(f"{source}: top level: must be a mapping with at least `label` and one feature column list")
    for key in raw:
        if key not in KEYS:
            with ck:
                fail(keyname(key), unknown_key(key, KEYS))
    threshold = 1
    with ck:
        threshold = _int(raw.get("threshold", 1), "threshold", fail, minimum=0)
    label = positive = None
    with ck:
        label, positive = _label(raw.get("label"), fail)
    categorical, multihot, numerical = [], [], []
    entries = []
    with ck:
        entries = _list(raw, "categorical", fail)
    for i, e in enumerate(entries):
        with ck:
            categorical.append(Categorical(**_entry(e, f"categorical[{i}]", fail, {"threshold": threshold})))
    entries = []
    with ck:
        entries = _list(raw, "multihot", fail)
    for i, e in enumerate(entries):
        with ck:
            item = _entry(e, f"multihot[{i}]", fail, {"threshold": threshold, "separator": "|", "max_hotness": None})
            if not isinstance(item["separator"], str) or not item["separator"]:
                fail(f"multihot[{i}].separator", "must be a non-empty string")
            if item["max_hotness"] is not None:
                item["max_hotness"] = _int(item["max_hotness"], f"multihot[{i}].max_hotness", fail, minimum=1)
            multihot.append(MultiHot(**item))
    entries = []
    with ck:
        entries = _list(raw, "numerical", fail)
    for i, e in enumerate(entries):
        with ck:
            item = _entry(e, f"numerical[{i}]", fail, {"transform": "standard"})
            if item["transform"] not in TRANSFORMS:
                fail(f"numerical[{i}].transform", f"{shown(item['transform'])} is not one of {', '.join(TRANSFORMS)}")
            numerical.append(Numerical(**item))
    for key in ("map", "time"):
        with ck:
            if raw.get(key) is not None:
                _column(raw[key], key, fail)
    features = [c.column for c in categorical] + [m.column for m in multihot] + [n.column for n in numerical]
    with ck:
        if not features and not ck.lines:
            fail("categorical/multihot/numerical", "no feature column given")
        named = [label] + features + [c for c in (raw.get("map"), raw.get("time")) if isinstance(c, str)]
        twice = sorted(c for c, n in collections.Counter(n for n in named if n is not None).items() if n > 1)
        if twice:
            fail(keyname(twice[0]), "column named twice (label, features, map and time must be different columns)")
        if LABEL in features:
            fail(LABEL, f"a feature column may not be called {LABEL!r} (the output's label column)")
    method, fraction, seed, validation = "random", 0.2, 0, 0.1
    with ck:
        method, fraction, seed, validation = _split(raw, fail)
    user = item = None
    with ck:
        user, item = _ncf(raw.get("ncf"), categorical, fail)
    models = ()
    with ck:
        models = _models(raw.get("models"), categorical, multihot, numerical, raw.get("ncf"), fail)
    fmt = raw.get("format")
    with ck:
        if fmt is not None and fmt not in FORMATS:
            fail("format", f"{shown(fmt)} is not one of {', '.join(FORMATS)}")
    separator = ","
    with ck:
        csv = raw.get("csv") or {}
        if not isinstance(csv, dict) or any(k != "separator" for k in csv):
            fail("csv", "must be a mapping {separator} (CSV files start with a header line)")
        separator = csv.get("separator", ",")
        if not isinstance(separator, str) or len(separator) != 1:
            fail("csv.separator", f"must be one character, got {shown(separator)}")
    missing = []
    with ck:
        missing = raw.get("missing_values") or []
        if not isinstance(missing, list) or not all(isinstance(v, (str, int, float)) for v in missing):
            fail("missing_values", "must be a list of values")
    keys = ()
    with ck:
        keys = _keys(raw.get("keys"), features, fail)
    ck.raise_problems()
    return TabularConfig(label=label, positive=positive, categorical=tuple(categorical), multihot=tuple(multihot),
                         numerical=tuple(numerical), map=raw.get("map"), time=raw.get("time"),
                         split_method=method, test_fraction=float(fraction), seed=seed,
                         validation_fraction=float(validation), models=tuple(models),
                         ncf_user=user, ncf_item=item, format=fmt, csv_separator=separator,
                         missing_values=tuple(str(v) for v in missing), keys=keys, source=source)


def _keys(value, stored: list, fail) -> tuple:
    """``keys:`` -> column names; each stored as key_<column>, which no other output column may be."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        fail("keys", f"must be a list of columns, got {shown(value)}")
    for i, name in enumerate(value):
        _column(name, f"keys[{i}]", fail)
        if name in RESERVED_KEYS:
            fail(f"keys[{i}]", f"{name!r} is a column of the predictions ({', '.join(RESERVED_KEYS)}): "
                               "rename it in the table")
        if key_column(name) in stored:
            fail(f"keys[{i}]", f"its output column {key_column(name)!r} is a feature's name: rename one")
    if len(set(value)) != len(value):
        fail("keys", "a column is named twice")
    return tuple(value)


def _split(raw, fail):
    """``split:`` -> (method, test fraction, seed, validation fraction)."""
    split = raw.get("split") or {}
    keys = ("method", "test_fraction", "validation_fraction", "seed")
    if not isinstance(split, dict):
        fail("split", "must be a mapping {method, test_fraction, validation_fraction, seed}")
    bad = [k for k in split if k not in keys]
    if bad:
        fail(f"split.{keyname(bad[0])}", unknown_key(bad[0], keys))
    method = split.get("method", "time" if raw.get("time") else "random")
    if method not in SPLIT_METHODS:
        fail("split.method", f"{shown(method)} is not one of {', '.join(SPLIT_METHODS)}")
    if method == "time" and not raw.get("time"):
        fail("split.method", "time needs a `time` column")
    fraction = split.get("test_fraction", 0.2)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        fail("split.test_fraction", f"must be a number in (0, 1), got {shown(fraction)}")
    validation = split.get("validation_fraction", 0.1)
    if isinstance(validation, bool) or not isinstance(validation, (int, float)) or not 0 <= validation < 1:
        fail("split.validation_fraction", f"must be a number in [0, 1) (0: no validation mapping), "
                                          f"got {shown(validation)}")
    if fraction + validation >= 1:
        fail("split.validation_fraction", f"test_fraction + validation_fraction must be below 1 (some rows "
                                          f"must train), got {fraction} + {validation}")
    return method, fraction, _int(split.get("seed", 0), "split.seed", fail, minimum=0), validation


def _ncf(ncf, categorical, fail):
    """``ncf: {user, item}`` -> (user column, item column), or (None, None)."""
    if ncf is None:
        return None, None
    if not isinstance(ncf, dict) or set(ncf) != {"user", "item"}:
        fail("ncf", "must be {user: column, item: column}")
    user, item = ncf["user"], ncf["item"]
    cats = [c.column for c in categorical]
    for key, col in (("user", user), ("item", item)):
        if col not in cats:
            fail(f"ncf.{key}", f"{shown(col)} is not one of the categorical columns")
    if user == item:
        fail("ncf", "user and item must be different columns")
    return user, item


def _models(models, categorical, multihot, numerical, ncf, fail):
    """``models:``, by default the models that read this table; a model the user did not name is
    never blamed. Wide & Deep reads any feature column (numericals alone feed its deep MLP and the
    wide part's linear term), so the list is never empty; DLRM's interaction needs categoricals."""
    if models is None:
        models = [m for m, reads in (("wide_deep", True),
                                     ("dlrm", bool(numerical and categorical and not multihot)),
                                     ("ncf", bool(ncf))) if reads]
    if isinstance(models, str):
        models = [models]
    if not isinstance(models, list) or not models or any(m not in MODELS for m in models):
        fail("models", f"must be a list of {', '.join(MODELS)}, got {shown(models)}")
    if len(set(models)) != len(models):
        fail("models", "a model is named twice")
    if "dlrm" in models and multihot:
        fail("models", "dlrm reads no multi-hot columns (drop dlrm or the multihot columns)")
    if "dlrm" in models and (not numerical or not categorical):
        fail("models", "dlrm needs numerical and categorical columns")
    if "ncf" in models and not ncf:
        fail("models", "ncf needs the `ncf: {user, item}` key")
    return models


def _int(value, key, fail, minimum):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        fail(key, f"must be an integer >= {minimum}, got {shown(value)}")
    return value


def _quoting(value) -> str:
    """The hint for a column name that YAML read as a number (``columns: [1, 2]``)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        text = shown(value)     # never a 4000-digit number in a message
        return f" (YAML reads {text} as a number: quote a numeric column name, '{text}')"
    return ""


def _column(value, key, fail):
    """A column name: it becomes a file name of the fitted workflow (categories/unique.<column>) and
    a key of the feature spec, so a '/' (a path) or a control character is refused."""
    if not isinstance(value, str) or not value:
        fail(key, f"must be a column name, got {shown(value)}{_quoting(value)}")
    if "/" in value or control_char(value) is not None:
        fail(key, f"column {shown(value)} has a '/' or a control character (column names become file names; "
                  "rename the column)")
    return value


def label_text(value) -> str:
    """A label value as `positive` and the data are compared: a whole number as its integer, however
    it is written (1, 1.0, "1.0" and a YAML 1.0 are all "1"), anything else as str() stripped."""
    text = value if isinstance(value, str) else str(value)
    try:
        number = float(text)
    except ValueError:
        return text.strip()
    return str(int(number)) if number.is_integer() else text.strip()


def _label(value, fail):
    if isinstance(value, str) and value:
        return _column(value, "label", fail), None
    if isinstance(value, dict) and isinstance(value.get("column"), str):
        extra = [k for k in value if k not in ("column", "positive")]
        if extra:
            fail(f"label.{keyname(extra[0])}", unknown_key(extra[0], ("column", "positive")))
        _column(value["column"], "label.column", fail)
        positive = value.get("positive")
        if positive is None:
            return value["column"], None
        if not isinstance(positive, list):
            positive = [positive]
        if not positive or not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in positive):
            fail("label.positive", "must be a value or a non-empty list of values"
                 + (" (YAML reads a bare yes/no, true/false or on/off as a boolean: quote the label's value, "
                    "e.g. positive: ['yes'])" if any(isinstance(v, bool) for v in positive) else ""))
        return value["column"], tuple(label_text(v) for v in positive)
    fail("label", "required: a column name or {column, positive}"
         + _quoting(value.get("column") if isinstance(value, dict) else value))


def _list(raw, key, fail):
    value = raw.get(key) or []
    if not isinstance(value, list):
        fail(key, "must be a list of columns")
    return value


def _entry(entry, key, fail, defaults: dict) -> dict:
    """A list entry: a column name, or a mapping {column, <keys of defaults>}."""
    if isinstance(entry, str) and entry:
        return {"column": _column(entry, key, fail), **defaults}
    if not isinstance(entry, dict) or not isinstance(entry.get("column"), str):
        fail(key, "must be a column name or a mapping with `column`"
             + _quoting(entry.get("column") if isinstance(entry, dict) else entry))
    _column(entry["column"], f"{key}.column", fail)
    extra = [k for k in entry if k != "column" and k not in defaults]
    if extra:
        fail(f"{key}.{keyname(extra[0])}", unknown_key(extra[0], ("column", *defaults)))
    out = {"column": entry["column"], **defaults, **{k: v for k, v in entry.items() if k != "column"}}
    if "threshold" in out:
        out["threshold"] = _int(out["threshold"], f"{key}.threshold", fail, minimum=0)
    return out
