"""Small Criteo-like raw click logs, so the pipeline runs with no 1 TB download.

Writes ``day_0 .. day_<D-1>`` in the real layout: 40 tab-separated fields per
line (label, 13 integer features, 26 categorical features as 8-hex-digit
hashes), empty fields where a value is missing. Category frequencies follow a
truncated power law (rank k drawn with probability proportional to
``k ** -alpha``, alpha between 1.05 and 1.4 depending on the column) over
vocabularies from 4 to ``rows/3`` values, so frequency thresholds behave as on
the real data. Integer features are heavy-tailed counts; ``I2`` also takes the
negative values -1..-3 as in Criteo. The label depends on a few features (a
learnable click-through signal, about 25 % positives). The same ``--seed``
gives the same bytes; each day is written to a temporary name and renamed.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from preproc.criteo.layout import NUM_CAT, NUM_INT
from preproc.dataio.output import atomic_dir, check_output_free

log = logging.getLogger("preproc.criteo")
BATCH_ROWS = 500_000
# Relative vocabulary sizes of the 26 columns (fractions of the row count, clipped to [4, rows/3]).
VOCAB_FRACTION = [0.3, 0.002, 0.2, 0.1, 0.0004, 0.00003, 0.01, 0.0005, 0.00001, 0.05, 0.004, 0.25, 0.003,
                  0.00002, 0.01, 0.15, 0.00002, 0.0008, 0.0003, 0.00001, 0.2, 0.00002, 0.00002, 0.05, 0.00002,
                  0.02]
CAT_MISSING = [0.0, 0.0, 0.03, 0.03, 0.0, 0.12, 0.0, 0.0, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0, 0.0, 0.03, 0.0, 0.0,
               0.44, 0.44, 0.03, 0.0, 0.76, 0.03, 0.44, 0.44]
INT_MISSING = [0.45, 0.0, 0.21, 0.22, 0.03, 0.22, 0.04, 0.0, 0.04, 0.45, 0.04, 0.77, 0.22]
INT_SCALE = [1.0, 3.5, 2.5, 1.8, 8.0, 4.5, 2.0, 2.5, 4.0, 0.5, 1.0, 0.8, 2.0]


def _vocabularies(rows: int, rng: np.random.Generator):
    """Per column: (vocabulary hex strings, cumulative rank probabilities)."""
    vocabularies = []
    for col in range(NUM_CAT):
        size = int(min(max(4, VOCAB_FRACTION[col] * rows), max(4, rows // 3)))
        alpha = 1.05 + 0.35 * rng.random()
        weights = np.arange(1, size + 1, dtype=np.float64) ** -alpha
        cdf = np.cumsum(weights / weights.sum())
        # an odd multiplier modulo 2**32 is a bijection: distinct ranks give distinct hashes
        hashes = (np.arange(size, dtype=np.uint64) * np.uint64(2654435761 + 2 * col)
                  + np.uint64(rng.integers(0, 2**32))) % np.uint64(2**32)
        vocabularies.append((np.char.mod("%08x", hashes.astype(np.int64)).astype(object), cdf))
    return vocabularies


def _batch(n: int, vocabularies, rng: np.random.Generator):
    """One pyarrow Table of ``n`` raw rows."""
    import pyarrow as pa

    columns, names = [], ["label"]
    ranks = []
    for col, (vocab, cdf) in enumerate(vocabularies):
        rank = np.minimum(np.searchsorted(cdf, rng.random(n)), len(vocab) - 1)
        ranks.append(rank)
        missing = rng.random(n) < CAT_MISSING[col]
        indices = pa.array(rank.astype(np.int32), mask=missing)
        columns.append(pa.DictionaryArray.from_arrays(indices, pa.array(vocab, pa.string())).cast(pa.string()))
    ints = []
    for col in range(NUM_INT):
        values = np.floor(rng.lognormal(0.0, 1.2, n) * INT_SCALE[col]).astype(np.int64)
        if col == 1:
            negative = rng.random(n) < 0.08
            values[negative] = -rng.integers(1, 4, negative.sum())
        ints.append(values)
    signal = (-1.3 + 0.8 * (ranks[0] < 3) - 0.6 * (ranks[2] % 2) + 0.35 * np.log1p(np.maximum(ints[0], 0))
              - 0.25 * np.log1p(np.maximum(ints[4], 0)) + 0.5 * (ranks[8] == 0))
    label = (rng.random(n) < 1 / (1 + np.exp(-signal))).astype(np.int8)
    int_columns = [pa.array(v, mask=rng.random(n) < INT_MISSING[c]) for c, v in enumerate(ints)]
    names += [f"I{i + 1}" for i in range(NUM_INT)] + [f"C{i + 1}" for i in range(NUM_CAT)]
    return pa.Table.from_arrays([pa.array(label)] + int_columns + columns, names=names)


def generate(out: str | os.PathLike, rows: int, days: int, seed: int = 0, overwrite: bool = False) -> list[Path]:
    """Write ``days`` day files holding ``rows`` rows in all (earlier days get the remainder)."""
    import pyarrow.csv as pacsv

    check_output_free(out, overwrite)
    rng = np.random.default_rng(seed)
    vocabularies = _vocabularies(rows, rng)
    options = pacsv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    paths = []
    with atomic_dir(out, overwrite=overwrite) as tmp:
        for day in range(days):
            n_day = rows // days + (day < rows % days)
            path = tmp / f"day_{day}"
            with pacsv.CSVWriter(path, _batch(1, vocabularies, rng).schema, write_options=options) as writer:
                done = 0
                while done < n_day:
                    n = min(BATCH_ROWS, n_day - done)
                    day_rng = np.random.default_rng([seed, day, done])
                    writer.write_table(_batch(n, vocabularies, day_rng))
                    done += n
            log.info("generate: %s: %d rows", path.name, n_day)
            paths.append(Path(out) / path.name)
    return paths
