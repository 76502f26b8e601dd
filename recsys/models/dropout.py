"""Dropout whose masks are a pure function of (seed, call count), so a resumed run draws the same masks.

Keras' Dropout keeps its random state outside the checkpoint (op-level seeds or
an untracked generator): after ``--restore`` the masks differ from those of an
uninterrupted run. Here the state is one int64 counter variable of the layer
(a model weight, so checkpointed and broadcast with the model) and the mask of
a training call is ``stateless_dropout(seed=[seed, counter])``.
"""
from __future__ import annotations

import tensorflow as tf


class ResumableDropout(tf.keras.layers.Layer):
    def __init__(self, rate, seed, **kwargs):
        super().__init__(**kwargs)
        self.rate = float(rate)
        self.seed = int(seed)

    def build(self, input_shape):
        self.calls = self.add_weight(name="calls", shape=(), dtype=tf.int64, trainable=False,
                                     initializer="zeros")
        super().build(input_shape)

    def call(self, x, training=False):
        if not training or self.rate == 0:
            return x
        seed = tf.stack([tf.constant(self.seed, tf.int64), self.calls])
        self.calls.assign_add(1)
        return tf.nn.experimental.stateless_dropout(x, rate=self.rate, seed=seed)

    def get_config(self):
        return dict(super().get_config(), rate=self.rate, seed=self.seed)
