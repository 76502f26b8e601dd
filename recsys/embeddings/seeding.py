"""Seeded table values: a column's values depend only on (seed, table, column, block of rows).

So every rank initialises a replicated table identically (no broadcast at start), and a
model-parallel slice holds exactly the columns of the whole table: a model-parallel run
starts from the weights of a replicated one.
"""
from __future__ import annotations

import random

import tensorflow as tf

SEED_BLOCK_ROWS = 65536


def _column_block(seed, key, block, rows, lim):
    """[rows] of U(-lim, lim) drawn from (seed, column key, block) alone (block < 2^16 keeps the
    seeds distinct: tables up to 2^16 blocks x SEED_BLOCK_ROWS = 2^32 rows)."""
    return tf.random.stateless_uniform([rows], seed=tf.constant([seed, key * 65536 + block], tf.int64),
                                       minval=-lim, maxval=lim, dtype=tf.float32)


def column_values(seed, table, column, block, rows):
    """[n] values of column ``column``, block of rows ``block``, of a table with ``rows`` rows:
    U(-1/sqrt(rows), 1/sqrt(rows)) from (seed, table, column, block) alone. The one place that
    keys the draws (our layers fill whole blocks; distributed-embeddings reads slices of them)."""
    n = min(SEED_BLOCK_ROWS, rows - block * SEED_BLOCK_ROWS)
    return _column_block(seed, table * 100003 + column, block, n, rows ** -0.5)


def seeded_blocks(seed, table, col_start, rows, width):
    """Yield (first row, [n, width] block) of the seeded values of columns col_start.. of a table
    with ``rows`` rows, U(-1/sqrt(rows), 1/sqrt(rows)).

    A value depends only on (seed, table, column, block of SEED_BLOCK_ROWS rows), so a column is
    the same whichever rank or slice holds it: a model-parallel run starts from exactly the
    weights of a replicated one."""
    for r0 in range(0, rows, SEED_BLOCK_ROWS):
        # eager ops, one per column: no tf.function to trace in every process (0.5 s each)
        yield r0, tf.stack([column_values(seed, table, col_start + c, r0 // SEED_BLOCK_ROWS, rows)
                            for c in range(width)], axis=1)


def fill_seeded(variable, seed, table, col_start=0):
    """Write the seeded values into a table variable in place, a block of rows at a time.

    A table is created as zeros and filled here rather than from an initializer, because an
    initializer returns the whole table as one tensor: its per-column temporaries stayed in the
    process (measured: the first 256 MiB table cost 0.55 GiB of RSS); block by block the process
    grows by the table's bytes and ~30 MB once."""
    rows, width = (int(d) for d in variable.shape)
    for r0, block in seeded_blocks(seed, table, col_start, rows, width):
        variable.scatter_update(tf.IndexedSlices(tf.cast(block, variable.dtype),
                                                 tf.range(r0, r0 + int(block.shape[0]))))


class SeededEmbedding(tf.keras.layers.Embedding):
    """A Keras Embedding whose table is filled in place from (seed, table, column), see :func:`fill_seeded`."""

    def __init__(self, input_dim, output_dim, seed, table, **kw):
        super().__init__(input_dim, output_dim, embeddings_initializer="zeros", **kw)
        self.seed, self.table = int(seed), int(table)

    def build(self, input_shape=None):
        super().build(input_shape)
        fill_seeded(self.embeddings, self.seed, self.table)

    def get_config(self):
        config = dict(super().get_config(), seed=self.seed, table=self.table)
        config.pop("embeddings_initializer", None)
        return config


def new_table_seed():
    """Base seed of a group's tables: drawn from Python's RNG, which ``set_random_seed`` seeds
    identically on every rank and in both placements."""
    return random.randint(0, 2**30)
