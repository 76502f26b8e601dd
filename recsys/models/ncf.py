"""NCF NeuMF: a GMF tower (elementwise product of user/item factors) and an MLP tower
(concatenated user/item embeddings), joined by one linear output."""
from __future__ import annotations

import tensorflow as tf

from recsys.embeddings.group import EmbeddingGroup
from recsys.models.dropout import ResumableDropout
from recsys.models.mlp import mlp


class NeuMF(tf.keras.Model):
    """inputs: {'user': [B] int, 'item': [B] int}; returns logits [B, 1] f32.

    ``groups``: its one group of GMF user/item and MLP user/item tables
    (recsys.models.embedding_tables.ncf_groups); ``layers``: the MLP tower, whose first width is the
    two MLP tables' widths together. Always replicated (small tables)."""

    def __init__(self, groups, layers=(256, 256, 128, 64), dropout=0.5, seed=0, name="neumf"):
        super().__init__(name=name)
        (group,) = groups
        if layers[0] != sum(group.widths[2:]):
            raise ValueError(f"the first NCF MLP layer ({layers[0]}) must be the user+item MLP embedding widths "
                             f"({group.widths[2:]})")
        self.embeddings = EmbeddingGroup(group)
        self.mlp = (mlp(list(layers[1:]), "mlp_tower", dropout=dropout, seed=seed * 100 + 1)
                    if len(layers) > 1 else None)
        self.drop = ResumableDropout(dropout, seed=seed * 100, name="input_dropout")
        self.out = tf.keras.layers.Dense(1, name="neumf_out", dtype="float32")

    def call(self, inputs, training=False):
        user, item = inputs["user"], inputs["item"]
        gu, gi, mu, mi = self.embeddings([user, item, user, item])
        gmf = gu * gi
        x = tf.concat([mu, mi], axis=1)
        x = self.drop(x, training=training)
        if self.mlp is not None:
            x = self.mlp(x, training=training)
        return tf.cast(self.out(tf.concat([tf.cast(gmf, tf.float32), tf.cast(x, tf.float32)], axis=1)),
                       tf.float32)
