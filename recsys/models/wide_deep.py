"""Wide & Deep: a linear model over 1-d embeddings of all categoricals plus the numericals,
and a deep MLP over embeddings; the logits are summed."""
from __future__ import annotations

import tensorflow as tf

from recsys.models.embeddings import EmbeddingGroup
from recsys.models.mlp import mlp


class WideDeep(tf.keras.Model):
    """inputs: {'numerical': [B, n], 'onehot_categorical': {name: [B]},
    'multihot_categorical': {name: [B, hot] padded with -1}}; returns logits [B, 1] f32.

    ``embedding_dim``: one deep embedding width, or one per feature (one-hot then multi-hot, see
    recsys.models.defaults.embedding_dims). ``wide_variables`` / ``deep_variables`` split the
    weights for the two optimizers.
    """

    def __init__(self, onehot, multihot, embedding_dim=64, deep_hidden_units=(1024,) * 5,
                 deep_dropout=0.1, combiner="sum", model_parallel=False, column_slice_threshold=None,
                 seed=0, name="wide_deep"):
        super().__init__(name=name)
        self.onehot_names = [n for n, _ in onehot]
        self.multihot_names = [n for n, _ in multihot]
        cards = [c for _, c in onehot] + [c for _, c in multihot]
        combiners = [None] * len(onehot) + [combiner] * len(multihot)
        self.wide_embeddings = EmbeddingGroup(cards, 1, combiners=["sum"] * len(cards), model_parallel=model_parallel,
                                              name="wide_embeddings")
        self.wide_numerical = tf.keras.layers.Dense(1, use_bias=True, name="wide_numerical", dtype="float32")
        self.deep_embeddings = EmbeddingGroup(cards, embedding_dim, combiners=combiners,
                                              model_parallel=model_parallel,
                                              column_slice_threshold=column_slice_threshold,
                                              name="deep_embeddings")
        self.deep = mlp(list(deep_hidden_units) + [1], "deep_mlp", dropout=deep_dropout,
                        last_linear=True, last_dtype="float32", seed=seed * 100)

    def _ids(self, inputs):
        ids = [inputs["onehot_categorical"][n] for n in self.onehot_names]
        for n in self.multihot_names:
            t = inputs["multihot_categorical"][n]
            if isinstance(t, tf.RaggedTensor):
                t = t.to_tensor(default_value=-1)
            ids.append(t)
        return ids

    def call(self, inputs, training=False):
        ids = self._ids(inputs)
        numerical = tf.cast(inputs["numerical"], tf.float32)
        wide = tf.add_n([tf.cast(w, tf.float32) for w in self.wide_embeddings(ids)])
        wide = wide + self.wide_numerical(numerical)
        deep_in = self.deep_embeddings(ids)
        deep_x = tf.concat([tf.cast(e, self.compute_dtype) for e in deep_in]
                           + [tf.cast(numerical, self.compute_dtype)], axis=1)
        deep = self.deep(deep_x, training=training)
        return tf.cast(wide, tf.float32) + tf.cast(deep, tf.float32)

    @property
    def wide_variables(self):
        return self.wide_embeddings.trainable_variables + self.wide_numerical.trainable_variables

    @property
    def deep_variables(self):
        return self.deep_embeddings.trainable_variables + self.deep.trainable_variables
