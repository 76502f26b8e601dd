"""What the Criteo 1TB click logs look like and what the DLRM split-binary output is.

Pure Python (no Spark): column names, day files, frequency thresholds, the
numerical transform, output dtypes, and the directory layout of the stages.

Input: one tab-separated text file per day, ``day_<d>`` (optionally with a
suffix such as ``.txt``; gzip is read by Spark but cannot be split), 40 fields
per line: label (0/1), 13 integer features ``I1..I13`` (may be negative, may be
empty), 26 categorical features ``C1..C26`` (hashed 8-hex-digit strings, may be
empty).

Semantics: NVIDIA's DLRM Spark preprocessing by default, our stricter rules as
options (the table of rules is docs/criteo.md):

* Days: with ``D`` days used (``--days``, default every day file found), days
  ``0..D-2`` are training data and day ``D-1`` (day 23 of the full set) is cut at
  half of its raw lines: lines ``0..floor(L/2)-1`` are ``test``, the rest
  ``validation`` (bad lines count for the cut, then are dropped), both in input order.
* Dictionary, per categorical column over every day (``--dictionary-days all``)
  or the training days only (``train``, no test-day leak): values ranked by
  descending count, ties by ascending value (string order, which for the
  fixed-width lower-case hex of Criteo is numeric order); ids start at 1. Values
  seen fewer than ``T`` times, unseen values and missing values map to 0.
  Cardinality = kept values + 1.
* Numerical (``--numerical reference``): ``ln(x + 3)`` of the value as is,
  0 where it is missing or ``x <= -3`` (log undefined); ``clamp``:
  ``ln(3 + max(x, 0))``, missing = 0 (so ln 3), the transcoder's ``log(x+3)``.
  Stored as float16.
* Categorical ids: int8, int16 or int32, the first type whose maximum is larger
  than the cardinality (the reference's rule: cardinality 127 is already int16).
* Training rows (``--train-order shuffle``): ordered by a seeded hash of (file,
  line), see ``shuffle_key``; ``input``: day, then line order.
* Feature spec: ``feature_spec.yaml`` with exactly the mappings ``train`` and
  ``test`` (what NVIDIA's loaders accept) plus ``feature_spec_validation.yaml``
  for ``validation`` (``--spec-layout reference``), or one spec with the three
  mappings (``combined``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from preproc.errors import PreprocError

NUM_INT = 13
NUM_CAT = 26
NUM_FIELDS = 1 + NUM_INT + NUM_CAT
INT_FEATURES = [f"num_{i}" for i in range(NUM_INT)]
CAT_FEATURES = [f"cat_{i}" for i in range(NUM_CAT)]
NUMERICAL_SHIFT = 3.0
NUMERICAL_FLOOR = 0.0
NUMERICAL_RULES = {"reference": "ln(x + 3); 0 where x is missing or x <= -3",
                   "clamp": "ln(3 + max(x, 0)), missing x = 0"}
DICTIONARY_DAYS = ("all", "train")
TRAIN_ORDERS = ("shuffle", "input")
SPEC_LAYOUTS = ("reference", "combined")
VALIDATION_SPEC = "feature_spec_validation.yaml"
SHUFFLE_BUCKET_ROWS = 1 << 21  # rows per shuffle bucket (what finalize merges in memory)
MAX_FILE_LINES = (1 << 31) - 1
DEFAULT_THRESHOLD = 15
REPORT_THRESHOLDS = (0, 3, 15)  # extra-large, large, small model of the reference
EMBEDDING_DIM = 128
DAY_RE = re.compile(r"^day_(\d+)(?:\.[A-Za-z0-9.]+)?$")
MAPPINGS = ("train", "test", "validation")
SPEC_VERSION = 2  # dictionary.json / manifests: 2 = rules record, mapping per piece, shuffle buckets


@dataclass(frozen=True)
class Rules:
    """The choices that differ from NVIDIA's reference; defaults = the reference (docs/criteo.md)."""

    dictionary_days: str = "all"
    train_order: str = "shuffle"
    seed: int = 0
    numerical: str = "reference"
    spec_layout: str = "reference"

    def __post_init__(self):
        for flag, value, allowed in (("--dictionary-days", self.dictionary_days, DICTIONARY_DAYS),
                                     ("--train-order", self.train_order, TRAIN_ORDERS),
                                     ("--numerical", self.numerical, tuple(NUMERICAL_RULES)),
                                     ("--spec-layout", self.spec_layout, SPEC_LAYOUTS)):
            if value not in allowed:
                raise PreprocError(f"{flag}: {value!r} is not one of {', '.join(allowed)}")
        if not 0 <= int(self.seed) <= 0x7FFFFFFF:
            raise PreprocError(f"--seed: {self.seed} is not in 0..{0x7FFFFFFF}")

    @classmethod
    def from_dict(cls, data: dict) -> "Rules":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def numerical_transform(values: np.ndarray, rule: str = "reference") -> np.ndarray:
    """Reference implementation of the numerical transform (float64 in, float16 out; NaN = missing)."""
    x = np.asarray(values, dtype=np.float64)
    if rule == "clamp":
        x = np.nan_to_num(x, nan=0.0)
        return np.log(NUMERICAL_SHIFT + np.maximum(x, NUMERICAL_FLOOR)).astype(np.float32).astype(np.float16)
    shifted = x + NUMERICAL_SHIFT
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(shifted > 0, np.log(np.where(shifted > 0, shifted, 1.0)), 0.0)
    return np.where(np.isnan(x), 0.0, out).astype(np.float32).astype(np.float16)


def categorical_dtype(cardinality: int) -> str:
    """int8/int16/int32: the first whose maximum is larger than ``cardinality`` (the reference's rule).

    Stricter than ``recsys.features.spec.categorical_dtype`` (which needs only
    ``cardinality - 1 <= max``) at cardinalities 127-128 and 32767-32768; both
    readers follow the dtype the spec names.
    """
    for name in ("int8", "int16", "int32"):
        if cardinality < np.iinfo(name).max:
            return name
    raise PreprocError(f"cardinality {cardinality} too large for int32 ids")


_MASK31 = 0x7FFFFFFF
_MIX = (0x2C1B3C6D, 0x297A2D39)


def mix31(x):
    """A bijection of 0..2**31-1 (xor-shift, multiply by odd constants mod 2**31).

    Products stay below 2**61, so the same integer arithmetic gives the same
    result in numpy, Spark SQL and DuckDB (the benchmark re-implements it).
    Works on ints, numpy int64 arrays and Spark columns (``^``/``&``/``>>``
    written as methods there, see ``transform.with_shuffle_key``).
    """
    x = ((x ^ (x >> 15)) * _MIX[0]) & _MASK31
    x = ((x ^ (x >> 12)) * _MIX[1]) & _MASK31
    return x ^ (x >> 15)


def shuffle_key(seed, file_idx, line):
    """Sort key of a training row under ``--train-order shuffle`` (numpy/int version).

    ``salt = mix31(seed ^ mix31(file_idx))``; ``hi = mix31(line ^ salt)`` (a
    bijection of the line within a file); ``lo = mix31(hi ^ mix31(line))``;
    key = ``hi * 2**31 + lo``. Rows are ordered by (key mod buckets, key,
    file, line): the order depends only on the data and the seed, never on
    how Spark split the input or how many array tasks ran.
    """
    salt = mix31(seed ^ mix31(file_idx))
    hi = mix31(line ^ salt)
    lo = mix31(hi ^ mix31(line))
    return hi * (1 << 31) + lo


def shuffle_buckets(train_lines: int) -> int:
    """Number of shuffle buckets for this many training lines (each about SHUFFLE_BUCKET_ROWS)."""
    return max(1, -(-int(train_lines) // SHUFFLE_BUCKET_ROWS))


def parse_thresholds(text: str | None) -> list[int]:
    """``"15"`` or ``"15,cat_3:2,C5:0"`` -> 26 thresholds.

    A bare integer is the default for every column; ``<column>:<T>`` overrides one
    column, named ``cat_<i>`` (0-based, as in the feature spec) or ``C<k>`` (1-based,
    Criteo's naming). T <= 1 keeps every value seen.
    """
    thresholds = [DEFAULT_THRESHOLD] * NUM_CAT
    if text is None or text == "":
        return thresholds
    overrides = {}
    for item in str(text).split(","):
        item = item.strip()
        name, sep, value = item.rpartition(":")
        try:
            t = int(value)
        except ValueError:
            raise PreprocError(f"--threshold: {item!r} is not T or column:T with an integer T") from None
        if t < 0:
            raise PreprocError(f"--threshold: {item!r}: threshold must be >= 0")
        if not sep:
            thresholds = [t] * NUM_CAT
            continue
        overrides[_column_index(name, item)] = t
    for index, t in overrides.items():
        thresholds[index] = t
    return thresholds


def _column_index(name: str, item: str) -> int:
    match = re.fullmatch(r"cat_(\d+)|[Cc](\d+)", name.strip())
    if match:
        index = int(match.group(1)) if match.group(1) is not None else int(match.group(2)) - 1
        if 0 <= index < NUM_CAT:
            return index
    raise PreprocError(f"--threshold: {item!r}: unknown column {name!r} (cat_0..cat_25 or C1..C26)")


def day_files(files: list[Path], days: int | None = None) -> list[tuple[int, Path]]:
    """[(day, file)] of the days used: files named ``day_<d>``, days 0..D-1 all present."""
    by_day = {}
    for path in files:
        match = DAY_RE.match(path.name)
        if not match:
            raise PreprocError(f"--input: {path}: not a Criteo day file (expected day_<d>, e.g. day_0)")
        day = int(match.group(1))
        if day in by_day:
            raise PreprocError(f"--input: {path}: second file for day {day} (also {by_day[day]})")
        by_day[day] = path
    wanted = len(by_day) if days is None else days
    if wanted < 2:
        raise PreprocError(f"--days: need at least 2 days (training days + the last day split into test and "
                           f"validation), have {wanted}")
    missing = [d for d in range(wanted) if d not in by_day]
    if missing:
        raise PreprocError(f"--input: day_{missing[0]} missing (days 0..{wanted - 1} are used)")
    return [(d, by_day[d]) for d in range(wanted)]


def shard_of(file_index: int, num_shards: int) -> int:
    """Transform shard that owns input file ``file_index`` (round robin over the day files)."""
    return file_index % num_shards


def embedding_gib(cardinalities: list[int], dim: int = EMBEDDING_DIM, itemsize: int = 4) -> float:
    """Size of the embedding tables in GiB (fp32 by default)."""
    return sum(cardinalities) * dim * itemsize / 2**30


def test_rows(last_day_lines: int) -> int:
    """Raw lines of the last day that go to ``test`` (the first half, as the reference's ``wc -l``/2)."""
    return last_day_lines // 2


class Staging:
    """Where the stages keep their intermediate results: ``<output>.stages/`` next to the output."""

    def __init__(self, output: str | Path):
        self.output = Path(output).absolute()
        self.root = self.output.parent / f"{self.output.name}.stages"
        self.dictionary = self.root / "dictionary"
        self.shards = self.root / "shards"

    def shard(self, index: int, count: int) -> Path:
        return self.shards / f"shard-{index:05d}-of-{count:05d}"


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n}"  # pragma: no cover
