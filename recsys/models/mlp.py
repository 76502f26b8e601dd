"""A plain ReLU MLP block shared by the models."""
from __future__ import annotations

import tensorflow as tf

from recsys.models.dropout import ResumableDropout


def mlp(units, name, dropout=0.0, last_linear=False, last_dtype=None, seed=0):
    """Dense+ReLU stack (+dropout); ``last_linear`` leaves the final layer without activation.

    ``last_dtype='float32'`` keeps the logit layer in fp32 under mixed precision.
    ``seed``: the dropout after layer i draws from stream ``seed + i`` (resumable, see
    recsys.models.dropout).
    """
    layers = []
    for i, n in enumerate(units):
        last = i == len(units) - 1
        act = None if (last and last_linear) else "relu"
        kw = {"dtype": last_dtype} if (last and last_dtype) else {}
        layers.append(tf.keras.layers.Dense(
            n, activation=act, name=f"{name}_{i}",
            kernel_initializer=tf.keras.initializers.GlorotNormal(),
            bias_initializer=tf.keras.initializers.RandomNormal(stddev=(1.0 / n) ** 0.5), **kw))
        if dropout and not last:
            layers.append(ResumableDropout(dropout, seed=seed + i, name=f"{name}_dropout_{i}"))
    return tf.keras.Sequential(layers, name=name)
