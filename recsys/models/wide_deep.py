"""Wide & Deep: a linear model over 1-d embeddings of all categoricals plus the numericals,
and a deep MLP over embeddings; the logits are summed."""
from __future__ import annotations

import tensorflow as tf

from recsys.embeddings.group import EmbeddingGroup
from recsys.models.embedding_tables import wide_deep_groups
from recsys.models.mlp import mlp


class WideDeep(tf.keras.Model):
    """inputs: {'numerical': [B, n], 'onehot_categorical': {name: [B]},
    'multihot_categorical': {name: [B, hot] padded with -1}}; returns logits [B, 1] f32.

    ``groups``: the (deep, wide) table groups of recsys.models.embedding_tables.wide_deep_groups; without
    them the model calls that builder with ``onehot``, ``multihot`` (``[(feature, rows)]``),
    ``embedding_dim`` (one width or one per feature) and ``combiner``. ``placement``: the run's
    embedding placement (None: replicated). ``wide_variables`` / ``deep_variables`` split the
    weights for the two optimizers.
    """

    def __init__(self, onehot=(), multihot=(), embedding_dim=64, deep_hidden_units=(1024,) * 5,
                 deep_dropout=0.1, combiner="sum", placement=None, seed=0, groups=None, name="wide_deep"):
        super().__init__(name=name)
        groups = wide_deep_groups(onehot, multihot, embedding_dim, combiner) if groups is None else groups
        # No groups: a table of numericals alone, read by the deep MLP and the wide linear term.
        deep, wide = groups if groups else (None, None)
        # The wide group's tables follow the deep group's features in order: one id list feeds both.
        self.inputs_of = [(t.channel, t.feature) for t in deep.tables] if deep else []
        self.wide_embeddings = EmbeddingGroup(wide, placement) if wide else None
        self.wide_numerical = tf.keras.layers.Dense(1, use_bias=True, name="wide_numerical", dtype="float32")
        self.deep_embeddings = EmbeddingGroup(deep, placement) if deep else None
        self.deep = mlp(list(deep_hidden_units) + [1], "deep_mlp", dropout=deep_dropout,
                        last_linear=True, last_dtype="float32", seed=seed * 100)

    def _ids(self, inputs):
        ids = []
        for channel, feature in self.inputs_of:
            t = inputs[channel][feature]
            if isinstance(t, tf.RaggedTensor):
                t = t.to_tensor(default_value=-1)
            ids.append(t)
        return ids

    def call(self, inputs, training=False):
        ids = self._ids(inputs)
        numerical = tf.cast(inputs["numerical"], tf.float32)
        wide = self.wide_numerical(numerical)
        if self.wide_embeddings is not None:
            wide = wide + tf.add_n([tf.cast(w, tf.float32) for w in self.wide_embeddings(ids)])
        deep_in = self.deep_embeddings(ids) if self.deep_embeddings is not None else []
        deep_x = tf.concat([tf.cast(e, self.compute_dtype) for e in deep_in]
                           + [tf.cast(numerical, self.compute_dtype)], axis=1)
        deep = self.deep(deep_x, training=training)
        return tf.cast(wide, tf.float32) + tf.cast(deep, tf.float32)

    @property
    def wide_variables(self):
        tables = self.wide_embeddings.trainable_variables if self.wide_embeddings is not None else []
        return tables + self.wide_numerical.trainable_variables

    @property
    def deep_variables(self):
        tables = self.deep_embeddings.trainable_variables if self.deep_embeddings is not None else []
        return tables + self.deep.trainable_variables
