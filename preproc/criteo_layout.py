"""What the Criteo 1TB click logs look like and what the DLRM split-binary output is.

Pure Python (no Spark): column names, day files, frequency thresholds, the
numerical transform, output dtypes, and the directory layout of the stages.

Input: one tab-separated text file per day, ``day_<d>`` (optionally with a
suffix such as ``.txt``; gzip is read by Spark but cannot be split), 40 fields
per line: label (0/1), 13 integer features ``I1..I13`` (may be negative, may be
empty), 26 categorical features ``C1..C26`` (hashed 8-hex-digit strings, may be
empty).

Semantics (the reference DLRM preprocessing, hpc-facts.md section 4):

* Days: with ``D`` days used (``--days``, default every day file found), days
  ``0..D-2`` are training data and day ``D-1`` (day 23 of the full set) is split
  in row order: the first ``floor(n/2)`` rows are ``test``, the rest
  ``validation``.
* Dictionary, per categorical column over the training days only: values
  ranked by descending count, ties by ascending value (string order, which for
  the fixed-width lower-case hex of Criteo is numeric order); ids start at 1.
  Values seen fewer than ``T`` times (the column's threshold), values unseen in
  training, and missing values map to 0. Cardinality = kept values + 1.
* Numerical: missing -> 0, negatives -> 0, then ``ln(x + 3)``: in full
  ``ln(3 + max(x, 0))`` (the shift of the reference Spark code; the clamp keeps
  Criteo's few negative values, >= -3 in feature I2, away from ln(0) and is the
  same rule as ``recsys.data.transcode``'s ``transform: "log(x+3)"``), stored as
  float16.
* Categorical ids are stored as int8, int16 or int32, the smallest signed type
  that holds ``cardinality - 1`` (``recsys.feature_spec.categorical_dtype``).
* Row order: day, then line order inside the day file (deterministic).
"""
from __future__ import annotations

import re
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
TRANSFORM_DOC = "ln(3 + max(x, 0)), missing x = 0"
DEFAULT_THRESHOLD = 15
REPORT_THRESHOLDS = (0, 3, 15)  # extra-large, large, small model of the reference
EMBEDDING_DIM = 128
DAY_RE = re.compile(r"^day_(\d+)(?:\.[A-Za-z0-9.]+)?$")
MAPPINGS = ("train", "test", "validation")


def numerical_transform(values: np.ndarray) -> np.ndarray:
    """Reference implementation of the numerical transform (float64 in, float16 out; NaN = missing)."""
    x = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=0.0)
    return np.log(NUMERICAL_SHIFT + np.maximum(x, NUMERICAL_FLOOR)).astype(np.float16)


def categorical_dtype(cardinality: int) -> str:
    """int8/int16/int32 for ids 0..cardinality-1 (DATA's rule when available)."""
    try:
        from recsys.feature_spec import categorical_dtype as rule
    except ImportError:  # pragma: no cover - recsys not installed next to preproc
        for name in ("int8", "int16", "int32"):
            if cardinality - 1 <= np.iinfo(name).max:
                return name
        raise PreprocError(f"cardinality {cardinality} too large for int32 ids") from None
    return rule(cardinality)


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


def test_rows(last_day_rows: int) -> int:
    """Rows of the last day that go to ``test`` (the first half; the rest is validation)."""
    return last_day_rows // 2


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
