"""The divergence guards: a loss that explodes or stays non-finite, non-finite weights, replicas apart.

A diverged run stops with one line (:class:`recsys.errors.DivergedError`, exit 1) that names the
step, what was seen and the last good checkpoint, and a ``diverged`` record; a run is never let
train on from weights that are no longer one model (docs/engine.md, "the divergence guard").
"""
from __future__ import annotations

import hashlib
import math
import os

import numpy as np
import tensorflow as tf

from recsys.engine.state import TrainState
from recsys.runtime.tracing import graph_function
from recsys.errors import DivergedError

# The replica check, at any size: rows of every replicated variable sampled at fixed positions.
REPLICA_SAMPLE_ROWS = 64
# Test-only: "RANK" nudges one row of that rank's largest replicated weight that the sampled replica
# check does not read, before the summary (the full digests then differ, the sampled ones do not).
DRIFT_HOOK_ENV = "RECSYS_TEST_UNSAMPLED_DRIFT"
DRIFT_ADVICE = "data parallelism keeps replicas equal: a rank applied what another did not; please report it"
# Under --amp a non-finite loss is a step the loss scaler skips; this many in a row is divergence.
AMP_MAX_SKIPPED_STEPS = 50
# The dynamic loss scale's floor (Keras's DynamicLossScale halves it down to 1, never below).
AMP_LOSS_SCALE_FLOOR = 1.0
# A finite loss above this many times the run's first loss (and above EXPLOSION_MIN_LOSS) is a
# divergence too: a binary cross-entropy only gets there with logits of tens wrong on average.
EXPLOSION_LOSS_FACTOR = 100.0
EXPLOSION_MIN_LOSS = 10.0


class Guards:
    """The checks that stop a diverged run, and the weight digests the replica check compares."""

    def __init__(self, state: TrainState, checkpointer=None):
        self.state, self.checkpointer = state, checkpointer
        self.config, self.dist, self.log = state.config, state.dist, state.log
        self.loss_scaler = state.loss_scaler
        self.nonfinite_in_a_row = 0
        self._replica_sample_fn = graph_function(self._replica_sample)
        self._finite_fn = graph_function(lambda vs: tf.stack([tf.reduce_all(tf.math.is_finite(v)) for v in vs]))

    def diverged(self, step: int, what: str, advice: str | None = None):
        """Stop the run: a ``diverged`` record, then :class:`DivergedError` naming the last good checkpoint."""
        latest = self.checkpointer.latest() if self.checkpointer is not None else None
        if self.dist.is_chief:
            self.log.record("diverged", step=step, reason=what, last_checkpoint=latest)
        hint = "--lr or --linear-lr" if self.config.model == "wide_deep" else "--lr"
        raise DivergedError(f"step {step}: {what}: the run diverged ({advice or f'lower {hint}?'}); "
                            + (f"last good checkpoint {latest}" if latest else "no checkpoint written"))

    def check_loss(self, step: int, loss_v: float, losses: list) -> None:
        """One trained step's loss: finite ones against the first (an explosion); non-finite ones stop
        the run, under --amp only after AMP_MAX_SKIPPED_STEPS in a row or at the loss scale's floor."""
        if math.isfinite(loss_v):
            self.nonfinite_in_a_row = 0
            self.check_explosion(step, loss_v, losses)
        else:
            self.nonfinite_in_a_row += 1
            if not self.config.amp or self.nonfinite_in_a_row > AMP_MAX_SKIPPED_STEPS:
                self.diverged(step, f"the training loss is {loss_v}")
            self.check_loss_scale_floor(step, loss_v)

    def check_explosion(self, step: int, loss_v: float, losses: list) -> None:
        """A finite loss far above the run's first one (EXPLOSION_LOSS_FACTOR) is a divergence."""
        if not losses:
            return
        first = losses[0][1]
        limit = max(EXPLOSION_LOSS_FACTOR * first, EXPLOSION_MIN_LOSS) if math.isfinite(first) else math.inf
        if loss_v > limit:
            self.diverged(step, f"the training loss {loss_v:.4g} is more than {EXPLOSION_LOSS_FACTOR:g} times "
                                f"the first one ({first:.4g} at step {losses[0][0]})")

    def check_loss_scale_floor(self, step: int, loss_v: float) -> None:
        """--amp: a skipped step while the loss scale sits at its floor (Keras's dynamic scale never
        goes below AMP_LOSS_SCALE_FLOOR) is a divergence: halving cannot help, every later step is skipped."""
        if self.loss_scaler is None:
            return
        scale = float(self.loss_scaler.loss_scale.numpy())
        if scale <= AMP_LOSS_SCALE_FLOOR:
            self.diverged(step, f"the training loss is {loss_v} with --amp's loss scale at its floor "
                                f"({scale:g}): every step is skipped")

    def check_final_loss(self, losses: list) -> None:
        """A run whose last loss is non-finite (--amp skipped its last steps) has not trained: it fails."""
        if losses and not math.isfinite(losses[-1][1]):
            self.diverged(losses[-1][0], f"the training loss of the last step is {losses[-1][1]}"
                                         + (" (--amp skipped it)" if self.loss_scaler is not None else ""))

    def check_weights(self, step: int, loss_v: float | None = None, dense_only: bool = False) -> None:
        """Non-finite weights are a divergence even when the loss stays finite: fused kernels
        (MatMul+BiasAdd+Relu on CPU inside tf.function) turn a NaN input into 0, so NaN weights can
        leave the loss finite. ``dense_only``: the replicated weights (cheap, the same on every rank,
        so no collective); else every weight, model-parallel shards included (a collective)."""
        variables = self.state.dense_weights if dense_only else self.state.all_weights
        if not variables:
            return
        finite = self._finite_fn(variables).numpy()
        bad = [v.name for v, ok in zip(variables, finite) if not ok]
        if not dense_only and self.dist.size > 1:
            if int(self.dist.allreduce_sum(np.array([len(bad)], np.int64))[0]) and not bad:
                bad = ["a model-parallel table on another rank"]
        if bad:
            more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
            loss = f" while the loss is {loss_v:.4g}" if loss_v is not None and math.isfinite(loss_v) else ""
            self.diverged(step, f"non-finite weights ({bad[0]}{more}){loss}")
        if not dense_only and self.dist.size > 1:
            self.check_replicas(step)

    # --- the replicas ----------------------------------------------------------------
    def weights_digest(self) -> str:
        """SHA-1 of all model weights (bitwise), to compare replicas or runs."""
        h = hashlib.sha1()
        for v in self.state.model.weights:
            h.update(np.ascontiguousarray(v.numpy()).tobytes())
        return h.hexdigest()

    def _replica_sample(self):
        """Fixed rows of every replicated variable (at most REPLICA_SAMPLE_ROWS, evenly spaced, first
        and last included; read by gather, never the whole variable), and the loss scale state."""
        out = []
        for v in self.state.replicated_weights:
            n = int(v.shape[0]) if v.shape.rank else 0
            if n <= REPLICA_SAMPLE_ROWS:
                out.append(tf.reshape(tf.convert_to_tensor(v), [-1]))
            else:
                rows = np.unique(np.linspace(0, n - 1, REPLICA_SAMPLE_ROWS).round().astype(np.int64))
                out.append(tf.reshape(tf.gather(v, rows), [-1]))
        if self.loss_scaler is not None:
            out += [tf.reshape(self.loss_scaler.loss_scale, [-1]),
                    tf.reshape(tf.cast(self.loss_scaler.dynamic_counter, tf.float32), [-1])]
        return out

    def replica_digest(self) -> str:
        """SHA-1 of a fixed sample of what every rank must hold alike (all but its model-parallel
        shards, plus the loss scale): cheap at any model size, bitwise like the full digest."""
        h = hashlib.sha1()
        for t in self._replica_sample_fn():
            h.update(np.ascontiguousarray(t.numpy()).tobytes())
        return h.hexdigest()

    def check_replicas(self, step: int) -> list[str]:
        """Replicas that drifted apart (a collective: every rank calls it) stop the run as a divergence;
        returns every rank's digest."""
        digests = self.dist.allgather_object(self.replica_digest())
        if len(set(digests)) > 1:
            apart = [r for r, d in enumerate(digests) if d != digests[0]]
            self.diverged(step, f"the replicated weights of rank(s) {apart} differ from rank 0's (sampled digests "
                                f"{digests[0][:8]} vs {digests[apart[0]][:8]}): the replicas drifted apart",
                          advice=DRIFT_ADVICE)
        return digests

    def drift_hook(self) -> None:
        """Test-only (:data:`DRIFT_HOOK_ENV`): one unsampled row of this rank's largest replicated weight nudged."""
        value = os.environ.get(DRIFT_HOOK_ENV, "")
        if not value or int(value) != self.dist.rank:
            return
        v = max(self.state.replicated_weights, key=lambda w: int(w.shape[0]) if w.shape.rank else 0)
        n = int(v.shape[0]) if v.shape.rank else 0
        sampled = set(np.linspace(0, n - 1, REPLICA_SAMPLE_ROWS).round().astype(np.int64).tolist())
        row = next((r for r in range(n) if r not in sampled), None)
        if n <= REPLICA_SAMPLE_ROWS or row is None:
            raise RuntimeError(f"{DRIFT_HOOK_ENV}={value}: no replicated weight has an unsampled row")
        v.scatter_nd_add([[row]], tf.ones([1] + v.shape.as_list()[1:], v.dtype) * 1e-3)
