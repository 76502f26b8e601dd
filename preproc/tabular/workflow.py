"""The NVTabular workflow of a user's table: ids for categoricals, filled and scaled numericals.

Built from NVTabular's operators, so the same graph runs on pandas (CPU) and cudf
(GPU) partitions:

* categorical and multi-hot columns: ``Categorify(freq_threshold=T per column)`` then
  :class:`DenseIds`. Categorify encodes 0 padding, 1 missing, 2 rare or unseen, 3..
  values; after fitting, :func:`frequency_order` puts every vocabulary in a fixed
  order (descending training count, ties by value) and ``DenseIds`` shifts the
  encoding to this project's: **0 = missing, rare or unseen, 1.. by frequency**;
  cardinality = kept values + 1. Multi-hot lists are cut to ``max_hotness`` with
  ``ListSlice`` first.
* numerical columns, per column: ``standard`` = ``Normalize`` (training mean and sample
  std; a constant column is only centred) then ``FillMissing(0)`` (missing -> the
  mean); ``log`` = ``FillMissing(0)``, ``Clip(min_value=0)``, ``LogOp`` (``log(1 + x)``);
  ``none`` = ``FillMissing(0)``.
* the label (and ``map``) pass through.

The workflow is fitted on the training rows only (vocabularies, counts, means, stds);
:func:`statistics` reads back what it learnt for the feature spec's metadata.
"""
from __future__ import annotations

import os

import numpy as np

from preproc.runtime.workflow_ops import ops_of
from preproc.tabular.config import LABEL, TabularConfig

NULL_ID, OOV_ID, FIRST_ID = 1, 2, 3   # Categorify's encoding (NVTabular 23.08)
MAP = "map"


def _dense(values):
    return (values - (FIRST_ID - 1)).clip(lower=0).astype("int32")


def dense_ids(col):
    """Categorify's ids (1 missing, 2 rare/unseen, 3.. values) -> 0 for the first two, 1.. for values;
    list columns element-wise (pandas or cudf)."""
    from merlin.core.dispatch import encode_list_column, flatten_list_column_values, is_list_dtype

    if is_list_dtype(col):
        return encode_list_column(col, _dense(flatten_list_column_values(col)))
    return _dense(col)


def build(config: TabularConfig, out_path: str, max_hotness: dict, keep: tuple = ()):
    """(features-only workflow, workflow that also carries ``keep``): two graphs over the same
    operators, so fitting the second fits the first (the first is the one saved)."""
    import nvtabular as nvt
    from nvtabular import ops

    # one Categorify for the one-hot columns and one per list column, each used once per graph
    cats = [c.column for c in config.categorical]
    categorify = ops.Categorify(freq_threshold={c.column: c.threshold for c in config.categorical},
                                out_path=out_path) if cats else None
    lists = {m.column: ops.Categorify(freq_threshold={m.column: m.threshold}, out_path=out_path)
             for m in config.multihot}
    normalize = ops.Normalize()
    by_transform = {t: [n.column for n in config.numerical if n.transform == t] for t in ("standard", "log", "none")}

    def features():
        graph = [LABEL]
        if cats:
            graph = graph + (cats >> categorify >> ops.LambdaOp(dense_ids, dtype=np.int32))
        for m in config.multihot:
            graph = graph + ([m.column] >> ops.ListSlice(0, max_hotness[m.column]) >> lists[m.column]
                             >> ops.LambdaOp(dense_ids, dtype=np.int32))
        if by_transform["standard"]:
            graph = graph + (by_transform["standard"] >> normalize >> ops.FillMissing(fill_val=0.0))
        if by_transform["log"]:
            graph = graph + (by_transform["log"] >> ops.FillMissing(fill_val=0.0) >> ops.Clip(min_value=0)
                             >> ops.LogOp())
        if by_transform["none"]:
            graph = graph + (by_transform["none"] >> ops.FillMissing(fill_val=0.0))
        if config.map:
            graph = graph + [MAP]
        return graph

    return nvt.Workflow(features()), nvt.Workflow(features() + list(keep))


def frequency_order(workflow) -> dict:
    """Rewrite every fitted vocabulary in descending count, ties by value; {column: cardinality}."""
    import pandas as pd
    from nvtabular.ops import Categorify

    cardinalities = {}
    for op in {id(o): o for o in ops_of(workflow, Categorify)}.values():
        for name, path in op.categories.items():
            table = pd.read_parquet(path)
            values = table[table[name].notna()]
            if len(values):
                size = f"{name}_size"
                ordered = values.assign(_key=values[name].astype(str)).sort_values(
                    [size, "_key"], ascending=[False, True], kind="stable").drop(columns="_key")
                ordered.index = pd.RangeIndex(FIRST_ID, FIRST_ID + len(ordered))
                tmp = f"{path}.tmp-{os.getpid()}"
                ordered.to_parquet(tmp, compression=None)
                os.replace(tmp, path)
            cardinalities[name] = len(values) + 1
    return cardinalities


def vocabulary(workflow, column: str) -> list:
    """The kept values of a fitted categorical column in id order (id 1 first)."""
    import pandas as pd
    from nvtabular.ops import Categorify

    for op in ops_of(workflow, Categorify):
        if column in op.categories:
            table = pd.read_parquet(op.categories[column])
            return [str(v) for v in table[column][table[column].notna()]]
    raise KeyError(column)


def statistics(workflow, config: TabularConfig) -> dict:
    """{column: {transform, mean, std}} of the numerical columns (mean/std: training statistics,
    recorded for ``standard`` columns)."""
    from nvtabular.ops import Normalize

    normalize = {}
    for op in ops_of(workflow, Normalize):
        normalize.update({c: (float(op.means[c]), float(op.stds[c])) for c in op.means})
    out = {}
    for n in config.numerical:
        item = {"transform": n.transform}
        if n.column in normalize:
            item["mean"], item["std"] = normalize[n.column]
        out[n.column] = item
    return out
