"""The train/test split of a user's table: seeded random (by row, or by group) or by time.

Pure numpy/pandas on one partition at a time, so the split does not depend on how
the input was cut into partitions:

* random: a row is a test row when ``uniform(seed, global row number) <
  test_fraction``; with a group (``map``) column the uniform number comes from the
  group's value instead, so a group never straddles the split. The uniform numbers
  are splitmix64 hashes (data- and machine-independent).
* time: the rows at or after the cut time are test rows; the cut is the time of the
  row at position ``n - round(n * test_fraction)`` in time order (from the value
  counts of the time column), so rows tied with it go to test.

The validation rows (``validation_fraction`` of all rows) come from the non-test rows the same
way: random, from a second hash (the seed salted with ``VALIDATION_SALT``, so the draw is
independent of the test one) at ``validation_fraction / (1 - test_fraction)``; time, the rows
from a second, earlier cut (at ``test_fraction + validation_fraction``) up to the test cut.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

_M64 = (1 << 64) - 1


def splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser of uint64 values (vectorised)."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def uniform(seed: int, keys: np.ndarray) -> np.ndarray:
    """A number in [0, 1) per uint64 key, fixed by (seed, key)."""
    with np.errstate(over="ignore"):
        mixed = splitmix64(splitmix64(np.asarray(keys).astype(np.uint64)) ^ splitmix64(np.array([seed], np.uint64)))
    return (mixed >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def group_keys(values: pd.Series) -> np.ndarray:
    """A stable uint64 per group value (pandas' fixed-key hash of its text), 0 for a missing one."""
    text = values.astype(object).where(values.notna(), "").astype(str).to_numpy(dtype=object)
    return pd.util.hash_array(text, categorize=True)


def group_ids(values: pd.Series) -> np.ndarray:
    """The int64 id a group is stored under (``map``): its integer value, else its hash."""
    if pd.api.types.is_integer_dtype(values.dtype):
        return values.to_numpy(dtype=np.int64)
    return group_keys(values).view(np.int64)


def random_test_rows(rows: np.ndarray, seed: int, fraction: float, groups: pd.Series | None = None) -> np.ndarray:
    """Boolean test mask of one partition: by global row number, or by group value."""
    keys = group_keys(groups) if groups is not None else np.asarray(rows, dtype=np.uint64)
    return uniform(seed, keys) < fraction


VALIDATION_SALT = 0x76616C6964   # "valid": the validation draw's seed is the split's seed xor this


def random_validation_rows(rows: np.ndarray, seed: int, fraction: float, test_fraction: float,
                           groups: pd.Series | None = None) -> np.ndarray:
    """Boolean validation mask of one partition (test rows included: the caller drops them), drawn
    at ``fraction / (1 - test_fraction)`` so that ``fraction`` of all rows are validation rows."""
    return random_test_rows(rows, seed ^ VALIDATION_SALT, fraction / (1.0 - test_fraction), groups)


def time_cut(counts: pd.Series, fraction: float):
    """The cut time from ``counts`` (time value -> rows): the time of the row at position
    ``n - round(n * fraction)`` in time order; at least one row is a test row and, when there
    are two distinct times, at least one a training row."""
    counts = counts.sort_index()
    n = int(counts.sum())
    test = min(max(1, int(np.floor(n * fraction + 0.5))), n)
    position = n - test                         # 0-based position of the first test row
    cum = counts.cumsum().to_numpy()
    cut = counts.index[int(np.searchsorted(cum, position + 1))]
    if cut == counts.index[0] and len(counts) > 1:
        cut = counts.index[1]                    # keep some training rows
    return cut


def time_values(values: pd.Series) -> pd.Series:
    """Numbers as they are (float64), anything else parsed as dates (ns since the epoch, float64);
    NaN when missing or unparsable."""
    if pd.api.types.is_numeric_dtype(values.dtype) and not pd.api.types.is_bool_dtype(values.dtype):
        return values.astype("float64")
    if pd.api.types.is_datetime64_any_dtype(values.dtype):
        stamps = values
    else:
        numeric = pd.to_numeric(values, errors="coerce")
        if numeric.notna().sum() == values.notna().sum():
            return numeric.astype("float64")
        stamps = pd.to_datetime(values, errors="coerce", utc=True)
    out = stamps.astype("int64").astype("float64")
    return out.where(stamps.notna())
