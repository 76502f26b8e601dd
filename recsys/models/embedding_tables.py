"""A model's embedding tables, grouped as its layers hold them: the one builder of the table list.

Pure Python (no TensorFlow). The configuration plans the placement and checks the memory on
these groups before TensorFlow starts; the models build one EmbeddingGroup layer per group from
them; the ``placement`` log record, ``python -m recsys.place_tables`` and the sharded-checkpoint
signature list them. Nothing else decides a table's name, width or combiner.
"""
from __future__ import annotations

from recsys.models.defaults import CATEGORICAL_CHANNELS, dense_param_count, embedding_dims
from recsys.placement.tables import Table, TableGroup

# Wide & Deep trains its wide part (the 1-wide tables) with FTRL, whatever --optimizer says.
WIDE_OPTIMIZER = "ftrl"
# The models that train on numerical features alone (no embedding table).
MODELS_WITHOUT_TABLES = ("wide_deep",)


def dlrm_groups(features, width, optimizer=None):
    """DLRM: one group, a table per categorical feature ``(name, rows)``, all ``width`` wide
    (the dot interaction needs one width)."""
    return (TableGroup("embeddings", tuple(Table(f, f, "categorical", int(rows), int(width))
                                           for f, rows in features), optimizer),)


def wide_deep_groups(onehot, multihot, embedding_dim, combiner="sum", optimizer=None):
    """Wide & Deep: the deep group, then the wide one (a 1-wide table per feature, summed).

    ``onehot``/``multihot``: ``[(feature, rows)]``. ``embedding_dim``: one width, which
    :func:`recsys.models.defaults.embedding_dims` turns into the recipe's per-feature widths
    where they apply, or the list of deep widths itself. Multi-hot deep rows are combined by
    ``combiner``. A table of numericals alone has no tables: no group (the deep MLP and the wide
    part's linear term read the numericals)."""
    features = [(f, int(r), "onehot_categorical", None) for f, r in onehot]
    features += [(f, int(r), "multihot_categorical", combiner) for f, r in multihot]
    if not features:
        return ()
    names = [f for f, _, _, _ in features]
    widths = (embedding_dims("wide_deep", names, int(embedding_dim)) if isinstance(embedding_dim, int)
              else [int(w) for w in embedding_dim])
    if len(widths) != len(features):
        raise ValueError(f"{len(widths)} deep embedding widths for {len(features)} features")
    deep = tuple(Table(f, f, ch, r, w, comb) for (f, r, ch, comb), w in zip(features, widths))
    wide = tuple(Table(f"{f}/wide", f, ch, r, 1, None if comb is None else "sum") for f, r, ch, comb in features)
    return TableGroup("deep_embeddings", deep, optimizer), TableGroup("wide_embeddings", wide, WIDE_OPTIMIZER)


def ncf_groups(user, item, factors, mlp_width, optimizer=None):
    """NCF (NeuMF): one group of four tables, the GMF user and item factors (``factors`` wide),
    then the MLP tower's user and item embeddings (``mlp_width``: half its first layer).
    ``user``/``item``: ``(feature, rows)``."""
    (u, users), (i, items) = user, item
    return (TableGroup("embeddings", (
        Table(f"{u}/gmf", u, "user_ch", int(users), int(factors)),
        Table(f"{i}/gmf", i, "item_ch", int(items), int(factors)),
        Table(f"{u}/mlp", u, "user_ch", int(users), int(mlp_width)),
        Table(f"{i}/mlp", i, "item_ch", int(items), int(mlp_width))), optimizer),)


def model_groups(model, channels, *, embedding_dim=None, factors=None, layers=None, combiner="sum",
                 optimizer=None):
    """The embedding groups of ``model`` from its categorical ``channels`` ({channel: [(feature,
    rows)]}, see :func:`spec_channels`) and the run's sizes; ``optimizer`` updates every group but
    the Wide & Deep wide one (:data:`WIDE_OPTIMIZER`)."""
    if model == "dlrm":
        return dlrm_groups(channels.get("categorical", []), embedding_dim, optimizer)
    if model == "wide_deep":
        return wide_deep_groups(channels.get("onehot_categorical", []), channels.get("multihot_categorical", []),
                                embedding_dim, combiner, optimizer)
    if model == "ncf":
        return ncf_groups(channels["user_ch"][0], channels["item_ch"][0], factors, layers[0] // 2, optimizer)
    raise ValueError(f"unknown model {model!r}")


def spec_channels(model, spec):
    """{channel: [(feature, cardinality)]} of the model's categorical channels in a FeatureSpec.

    Wide & Deep reads a table of numericals alone (no channel has a feature); DLRM and NCF look
    up ids, so a spec without them is a ValueError naming what the model needs."""
    channels = {ch: [(f, spec.cardinality(f)) for f in spec.features(ch)]
                for ch in CATEGORICAL_CHANNELS[model] if ch in spec.channel_spec}
    if not any(channels.values()) and model not in MODELS_WITHOUT_TABLES:
        raise ValueError(f"{spec.origin}: --model {model} needs categorical features (channel "
                         f"{' / '.join(CATEGORICAL_CHANNELS[model])}) and the spec has none: a table of numerical "
                         f"columns alone trains with --model wide_deep")
    return channels


def dense_params(model, groups, **sizes):
    """Replicated (non-embedding) parameters of ``model`` built on ``groups`` (its first group
    feeds the MLPs); ``sizes``: the run's layer widths (bottom_mlp, deep_hidden_units, ...)."""
    if not groups:                       # numericals alone (Wide & Deep): the MLP reads them only
        return dense_param_count(model, n_tables=0, embedding_dim=0, total_embedding_dim=0, **sizes)
    main = groups[0]
    return dense_param_count(model, n_tables=len(main.tables), embedding_dim=main.widths[0],
                             total_embedding_dim=sum(main.widths), **sizes)
