"""DLRM: bottom MLP over numericals, one embedding per categorical, dot interaction, top MLP."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from recsys.embeddings.group import EmbeddingGroup
from recsys.models.mlp import mlp


class DotInteraction(tf.keras.layers.Layer):
    """Pairwise dot products of the n feature vectors (strictly lower triangle), concatenated
    with the bottom-MLP output, as in the reference DLRM (no self-interaction)."""

    def call(self, bottom, embeddings):
        feats = tf.stack([bottom] + embeddings, axis=1)            # [B, n, d]
        n = feats.shape[1]
        dots = tf.matmul(feats, feats, transpose_b=True)          # [B, n, n]
        rows, cols = np.tril_indices(n, k=-1)
        flat = tf.reshape(dots, [-1, n * n])
        pairs = tf.gather(flat, rows * n + cols, axis=1)          # [B, n(n-1)/2]
        return tf.concat([bottom, pairs], axis=1)


class DLRM(tf.keras.Model):
    """inputs: {'numerical': [B, n_num] f32, 'categorical': [B, n_cat] int}; returns logits [B, 1] f32.

    ``groups``: its one table group (recsys.models.embedding_tables.dlrm_groups); ``placement``: the
    run's embedding placement (None: replicated)."""

    def __init__(self, groups, bottom_mlp=(512, 256, 128), top_mlp=(1024, 1024, 512, 256, 1), interaction="dot",
                 placement=None, name="dlrm"):
        super().__init__(name=name)
        (group,) = groups
        width = group.widths[0]
        if interaction == "dot" and bottom_mlp[-1] != width:
            raise ValueError(f"the last bottom MLP width ({bottom_mlp[-1]}) must equal --embedding-dim "
                             f"({width}) for the dot interaction")
        self.n_cat = len(group.tables)
        self.bottom = mlp(list(bottom_mlp), "bottom_mlp")
        self.embeddings = EmbeddingGroup(group, placement)
        self.interaction = interaction
        self.dot = DotInteraction()
        self.top = mlp(list(top_mlp), "top_mlp", last_linear=True, last_dtype="float32")

    def call(self, inputs, training=False):
        cat = inputs["categorical"]
        x = self.bottom(inputs["numerical"])
        embs = self.embeddings([cat[:, i] for i in range(self.n_cat)])
        embs = [tf.cast(e, x.dtype) for e in embs]
        z = self.dot(x, embs) if self.interaction == "dot" else tf.concat([x] + embs, axis=1)
        return tf.cast(self.top(z, training=training), tf.float32)

    def mlp_flops_per_sample(self):
        """Multiply-adds x2 of the bottom and top MLPs (forward), for the FLOP/s benchmark."""
        total = 0
        for seq in (self.bottom, self.top):
            for layer in seq.layers:
                if isinstance(layer, tf.keras.layers.Dense):
                    k = layer.kernel.shape
                    total += 2 * int(k[0]) * int(k[1])
        return total
