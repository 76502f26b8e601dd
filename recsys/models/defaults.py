"""Reference hyper-parameters of each model and the small sizes used with --synthetic.

Pure Python (no TensorFlow): the CLI resolves its defaults and the placement
planner counts parameters from here before anything heavy is imported.

Reference values follow NVIDIA's DeepLearningExamples recipes for each model
(DLRM on Criteo 1TB, Wide & Deep on Outbrain, NCF on MovieLens-20M).
"""
from __future__ import annotations

from typing import Any

# A model's settings by flag name: heterogeneous on purpose (numbers, widths, names, booleans),
# each read by the flag it fills.
Settings = dict[str, Any]

# Channels of each model (see recsys.features.spec / recsys.data).
CATEGORICAL_CHANNELS = {
    "dlrm": ("categorical",),
    "wide_deep": ("onehot_categorical", "multihot_categorical"),
    "ncf": ("user_ch", "item_ch"),
}

# The reference recipes train a fixed schedule: every epoch, the last checkpoint is the result.
NO_EARLY_STOP: Settings = dict(early_stop_patience=0, early_stop_min_delta=0.0, keep_best=False)

MODEL_DEFAULTS: dict[str, Settings] = {
    "dlrm": dict(
        batch_size=65536, eval_batch_size=65536, epochs=1, optimizer="sgd", lr=24.0,
        warmup_steps=8000, decay_start_step=48000, decay_steps=24000, decay_power=2.0,
        embedding_dim=128, bottom_mlp=[512, 256, 128], top_mlp=[1024, 1024, 512, 256, 1],
        embedding_optimizer="sgd", **NO_EARLY_STOP),
    "wide_deep": dict(
        batch_size=131072, eval_batch_size=131072, epochs=20, optimizer="rmsprop",
        lr=0.00012, linear_lr=0.02, deep_warmup_epochs=6.0, warmup_steps=None,
        embedding_dim=64, deep_hidden_units=[1024] * 5, deep_dropout=0.1, combiner="sum",
        embedding_optimizer="rmsprop", **NO_EARLY_STOP),
    "ncf": dict(
        batch_size=1048576, eval_batch_size=1048576, epochs=30, optimizer="adam", lr=0.0045,
        beta1=0.25, beta2=0.5, adam_eps=1e-8, warmup_steps=0, factors=64,
        layers=[256, 256, 128, 64], dropout=0.5, negative_samples=4, valid_negative=100, topk=10,
        embedding_optimizer="adam", **NO_EARLY_STOP),
}

# Deep embedding widths of NVIDIA's W&D recipe per feature of the reference Outbrain feature set
# (preproc.outbrain.features): 128 for the four largest id spaces, 19 for platform, 64 for the rest.
# With the reference dataset they give the recipe's model: total embedding width 1235, ~92M
# parameters. They apply to a dataset with exactly these 16 categorical features while the run's
# --embedding-dim is the reference 64; any other dataset or value gets --embedding-dim for every table.
WIDE_DEEP_EMBEDDING_DIMS = {
    "document_id": 128, "ad_id": 128, "document_id_promo": 128, "campaign_id": 128, "platform": 19,
    "source_id_promo": 64, "source_id": 64, "geo_location": 64, "advertiser_id": 64, "geo_location_state": 64,
    "publisher_id_promo": 64, "publisher_id": 64, "geo_location_country": 64, "topic_id_list": 64,
    "entity_id_list": 64, "category_id_list": 64,
}


def embedding_dims(model: str, features, embedding_dim: int) -> list:
    """Deep embedding width of each categorical feature (in order) for a run's ``--embedding-dim``."""
    features = list(features)
    if (model == "wide_deep" and embedding_dim == MODEL_DEFAULTS["wide_deep"]["embedding_dim"]
            and sorted(features) == sorted(WIDE_DEEP_EMBEDDING_DIMS)):
        return [WIDE_DEEP_EMBEDDING_DIMS[f] for f in features]
    return [embedding_dim] * len(features)


# Small model and data sizes for `--synthetic` (a laptop/CI-sized run).
SYNTHETIC_DEFAULTS: dict[str, Settings] = {
    "dlrm": dict(batch_size=512, eval_batch_size=2048, epochs=2, lr=0.5, warmup_steps=10,
                 decay_start_step=60, decay_steps=40, embedding_dim=16, bottom_mlp=[32, 16],
                 top_mlp=[64, 32, 1], synthetic_rows=16384),
    "wide_deep": dict(batch_size=512, eval_batch_size=2048, epochs=2, lr=0.003, linear_lr=0.1,
                      deep_warmup_epochs=0.5, embedding_dim=16, deep_hidden_units=[64, 64, 64],
                      deep_dropout=0.1, synthetic_rows=16384),
    "ncf": dict(batch_size=1024, eval_batch_size=8192, epochs=3, lr=0.01, beta1=0.9, beta2=0.999,
                factors=8, layers=[32, 16, 8], dropout=0.0, synthetic_rows=8000),
}


# Small data. The reference batches are sized for the reference datasets (Criteo 1TB: ~60000
# steps per epoch; Outbrain: ~450; MovieLens-20M: ~95 with negatives). A dataset on which the
# reference batch gives fewer than REFERENCE_MIN_STEPS_PER_EPOCH steps per epoch trains, for every
# hyper-parameter flag left unset, with a batch of about SMALL_DATA_STEPS_PER_EPOCH steps per epoch
# (a power of two, at least SMALL_DATA_MIN_BATCH, times the ranks) and the schedule below, which is
# sized for such batches (measured: NCF on MovieLens-100k, docs/data.md "Results on real data").
REFERENCE_MIN_STEPS_PER_EPOCH = 64
SMALL_DATA_STEPS_PER_EPOCH = 200
SMALL_DATA_MIN_BATCH = 128
# ... but never so few steps that an epoch is a handful of them: breast cancer's 455 training rows at
# 128 made 3 steps an epoch, and the early stop (one evaluation an epoch) stopped during the warm-up
# after 9 steps at AUC 0.9913 (0.9990 trained on). A smaller batch, down to 1 row, keeps this many.
SMALL_DATA_MIN_STEPS_PER_EPOCH = 16
# On small data the best evaluation often comes epochs before the last (W&D on Adult: docs/data.md):
# keep the best checkpoint and stop once two evaluations in a row have not beaten the best by more
# than 0.001 (of AUC, or of HR@10: one user in a thousand), what an epoch's noise moves it.
SMALL_DATA_EARLY_STOP: Settings = dict(early_stop_patience=2, early_stop_min_delta=0.001, keep_best=True)
SMALL_DATA_DEFAULTS: dict[str, Settings] = {
    # SGD at a few hundred rows per step: the transcoding example's rate; warm-up and decay span
    # the run (recsys.configuration.train_config scales them as for --synthetic).
    "dlrm": dict(lr=0.5, epochs=3, **SMALL_DATA_EARLY_STOP),
    # RMSprop for the deep part at the usual small-batch rate, one warm-up epoch; FTRL as the reference.
    "wide_deep": dict(lr=0.001, deep_warmup_epochs=1.0, epochs=10, **SMALL_DATA_EARLY_STOP),
    # Adam with its usual constants: the reference's beta1 0.25 / beta2 0.5 suit a 1M batch only.
    "ncf": dict(lr=0.002, beta1=0.9, beta2=0.999, epochs=6, **SMALL_DATA_EARLY_STOP),
}


def small_data_batch(samples: int, world_size: int = 1) -> int:
    """The small-data global batch for an epoch of ``samples``: the ranks times a power of two
    giving about SMALL_DATA_STEPS_PER_EPOCH steps (at least SMALL_DATA_MIN_BATCH rows per step
    when the epoch still has SMALL_DATA_MIN_STEPS_PER_EPOCH steps at that batch)."""
    per_rank = max(1, samples // max(1, world_size) // SMALL_DATA_STEPS_PER_EPOCH)
    batch = 1 << (per_rank.bit_length() - 1)                       # power of two <= per_rank
    if 2 * batch - per_rank < per_rank - batch:                    # the nearer power of two
        batch *= 2
    floor = max(1, SMALL_DATA_MIN_BATCH // max(1, world_size))
    fits = max(1, samples // max(1, world_size))
    while batch < floor and batch * 2 <= fits // SMALL_DATA_MIN_STEPS_PER_EPOCH:
        batch *= 2
    return batch * max(1, world_size)


def is_small_data(model: str, samples: int) -> bool:
    """True when the reference batch gives fewer than REFERENCE_MIN_STEPS_PER_EPOCH steps per epoch."""
    return samples < REFERENCE_MIN_STEPS_PER_EPOCH * MODEL_DEFAULTS[model]["batch_size"]


def resolved(model: str, synthetic: bool) -> Settings:
    """The defaults that apply to a run: reference values, small ones for --synthetic."""
    out = dict(MODEL_DEFAULTS[model])
    if synthetic:
        out.update(SYNTHETIC_DEFAULTS[model])
    return out


def _mlp_params(sizes: list[int]) -> int:
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


def dense_param_count(model: str, n_tables: int, embedding_dim: int, n_numerical: int = 13,
                      total_embedding_dim: int | None = None, **overrides: Any) -> int:
    """Replicated (non-embedding) parameters, for the per-rank memory estimate (``total_embedding_dim``:
    the summed widths when the tables differ, see :func:`embedding_dims`)."""
    d = dict(MODEL_DEFAULTS[model])
    d.update(overrides)
    if model == "dlrm":
        bottom = [n_numerical] + list(d["bottom_mlp"])
        n = n_tables + 1
        top_in = n * (n - 1) // 2 + bottom[-1]
        return _mlp_params(bottom) + _mlp_params([top_in] + list(d["top_mlp"]))
    if model == "wide_deep":
        width = n_tables * embedding_dim if total_embedding_dim is None else total_embedding_dim
        return _mlp_params([width + n_numerical] + list(d["deep_hidden_units"]) + [1])
    layers = list(d["layers"])
    return _mlp_params(layers) + layers[-1] + d["factors"] + 1
