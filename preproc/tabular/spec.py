"""The feature specs of a tabular dataset: one per model, over the same parquet files.

The training engine tells the model from the channel names (``categorical``: DLRM;
``onehot_categorical``/``multihot_categorical``: Wide & Deep; ``user_ch``/``item_ch``:
NCF), so one spec cannot serve two models: the dataset holds
``feature_spec_<model>.yaml`` for every model of the config's ``models`` and
``feature_spec.yaml`` = the first one's. Every spec declares every stored column
(label float32, numericals float32, ids int32 with their cardinality, multi-hot
lists with ``max_hotness``, ``map`` int64 in the test and validation files only); they differ only
in ``channel_spec``:

=========  ===================================================================
dlrm       ``label``, ``numerical``, ``categorical`` (the one-hot columns)
wide_deep  ``label``, ``numerical``, ``onehot_categorical``, ``multihot_categorical``,
           ``map`` (when the config names a group column)
ncf        ``label_ch``, ``user_ch``, ``item_ch`` (the config's ``ncf`` columns)
=========  ===================================================================
"""
from __future__ import annotations

from preproc.tabular.config import LABEL, TabularConfig

MAP = "map"
SPEC = "feature_spec.yaml"


def spec_file(model: str) -> str:
    return f"feature_spec_{model}.yaml"


def stored(config: TabularConfig, with_map: bool) -> list:
    """Columns of a parquet file in order (the test and validation files add ``map``)."""
    cols = [LABEL] + [n.column for n in config.numerical] + [c.column for c in config.categorical]
    cols += [m.column for m in config.multihot]
    return cols + ([MAP] if with_map and config.map else [])


def feature_spec(config: TabularConfig, model: str, cardinalities: dict, hotness: dict, files: dict,
                 metadata: dict) -> dict:
    """The spec dict of ``model`` (``files``: mapping -> file paths relative to the dataset)."""
    features = {LABEL: {"dtype": "float32"}}
    features.update({n.column: {"dtype": "float32"} for n in config.numerical})
    features.update({c.column: {"dtype": "int32", "cardinality": int(cardinalities[c.column])}
                     for c in config.categorical})
    features.update({m.column: {"dtype": "int32", "cardinality": int(cardinalities[m.column]),
                                "max_hotness": int(hotness[m.column])} for m in config.multihot})
    if config.map:
        features[MAP] = {"dtype": "int64"}
    numerical = [n.column for n in config.numerical]
    onehot = [c.column for c in config.categorical]
    if model == "dlrm":
        channels = {"label": [LABEL], "numerical": numerical, "categorical": onehot}
    elif model == "wide_deep":
        channels = {"label": [LABEL], "numerical": numerical, "onehot_categorical": onehot,
                    "multihot_categorical": [m.column for m in config.multihot]}
        if config.map:
            channels["map"] = [MAP]
    else:
        channels = {"label_ch": [LABEL], "user_ch": [config.ncf_user], "item_ch": [config.ncf_item]}
    source = {mapping: [{"type": "parquet", "features": stored(config, with_map=mapping != "train"),
                         "files": list(paths)}] for mapping, paths in files.items()}
    return {"feature_spec": features, "source_spec": source, "channel_spec": channels,
            "metadata": dict(metadata, model=model)}
