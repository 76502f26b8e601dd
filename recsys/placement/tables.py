"""What an embedding table and a group of them are: the unit the placement plans and a layer holds.

Pure Python that imports nothing of recsys; each model's list of groups is built by
:mod:`recsys.models.embedding_tables`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class Table:
    name: str                       # unique in the model: the feature, "<feature>/wide", "<feature>/gmf" ...
    feature: str                    # the input whose ids it looks up
    channel: str                    # the feature-spec channel of that input
    rows: int
    width: int
    combiner: Optional[str] = None  # multi-hot rows: "sum" or "mean"; None: one id per row


@dataclass(frozen=True)
class TableGroup:
    """The tables of one EmbeddingGroup layer (``name`` is the layer's) and the optimizer that
    updates them (its slots count in the memory estimate)."""
    name: str
    tables: Tuple[Table, ...]
    optimizer: Optional[str] = None

    @property
    def cardinalities(self):
        return [t.rows for t in self.tables]

    @property
    def widths(self):
        return [t.width for t in self.tables]

    @property
    def combiners(self):
        return [t.combiner for t in self.tables]


def flat_tables(groups):
    """``[(name, rows, width)]`` of every table, group after group (the checkpoint signature)."""
    return [(t.name, t.rows, t.width) for g in groups for t in g.tables]
