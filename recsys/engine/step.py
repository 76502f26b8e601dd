"""The training step: loss -> gradients -> exchange across ranks -> apply, with --amp's loss scaling.

The train step is ``loss -> gradients`` (XLA-compiled with ``--xla``), then a Horovod allreduce of
the gradients (outside XLA: Horovod ops are not XLA ops), then one ``apply_gradients`` per optimizer
group (W&D has two). Under ``--amp`` the first optimizer is a LossScaleOptimizer whose dynamic
scale is used for the whole loss. Whether a step is applied (and the scale grows or halves) is
decided for all ranks at once: each rank's "some gradient of mine is not finite" joins the
allreduce the step already makes (a model-parallel shard's gradient lives on its owner only), and
every optimizer group applies, or skips, on that shared answer (docs/engine.md, "--amp").
The split step (recsys.engine.breakdown) calls these same parts one by one.
"""
from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from recsys.embeddings.group import distributed_tape
from recsys.engine.state import TrainState
from recsys.monitoring import watchdog
from recsys.runtime.distributed import gradient_payload_bytes
from recsys.runtime.tracing import as_written, graph_function

# Test-only: "RANK:STEP" makes that rank's first model-parallel shard gradient non-finite at that
# step, as an fp16 overflow on the shard's owner would (tests/recsys/test_amp_sync.py).
NONFINITE_HOOK_ENV = "RECSYS_TEST_NONFINITE_SHARD_GRAD"


class Step:
    """The compiled step functions (one step, several steps per call, prediction) over one train state."""

    def __init__(self, state: TrainState):
        self.state = state
        self.config, self.dist, self.log = state.config, state.dist, state.log
        self.loss_scaler = state.loss_scaler
        self.count_nonfinite, self.nonfinite = False, 0   # predictions counted during an evaluation
        self._exchange_logged = False
        self._nonfinite_hook = self._nonfinite_hook_step()
        # Without XLA the gradient code is traced inline into the step (one graph, no nested call).
        # The step has no control flow on tensors (tf.cond where it branches): traced as written
        # (recsys.runtime.tracing). Only the several-steps loop, a while on tensors, is converted
        # by AutoGraph, and not the step it calls.
        self.grad_fn = (graph_function(self.gradients, jit_compile=True, reduce_retracing=True)
                        if self.config.xla else self.gradients)
        self.train_step = graph_function(self._train_step_impl, reduce_retracing=True)
        self._one_step = as_written(self._train_step_impl)
        self.train_steps = tf.function(self._train_steps_impl, reduce_retracing=True)
        # Several steps per call on one rank only: Horovod keys a collective by its op's name, and
        # inside a compiled loop the names carry per-process graph counters (while/cond/then/_178 on
        # one rank, _186 on the other: a 2-rank model-parallel run deadlocked on its alltoall).
        self.steps_per_call = self.config.steps_per_call if self.dist.size == 1 else 1
        self._predict = graph_function(self._predict_impl, jit_compile=bool(self.config.xla), reduce_retracing=True)

    def gradients(self, inputs, labels):
        """(loss, unscaled gradients of every trained variable) of one batch on this rank."""
        variables = self.state.variables()
        with tf.GradientTape() as tape:
            logits = self.state.model(inputs, training=True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
            scaled = self.loss_scaler.get_scaled_loss(loss) if self.loss_scaler is not None else loss
        grads = (distributed_tape(tape) if self.state.de else tape).gradient(scaled, variables)
        if self.loss_scaler is not None:
            grads = self.loss_scaler.get_unscaled_gradients(grads)
        if self._nonfinite_hook is not None:
            grads = self._poison_shard_gradient(grads, variables)
        return loss, grads

    def _nonfinite_hook_step(self) -> int | None:
        """The step of :data:`NONFINITE_HOOK_ENV` for this rank, or None (unset: no op is added)."""
        value = os.environ.get(NONFINITE_HOOK_ENV, "")
        if not value:
            return None
        rank, _, step = value.partition(":")
        if int(rank) != self.dist.rank:
            return None
        if not any(id(v) in self.state.local_ids for v in self.state.variables()):
            raise RuntimeError(f"{NONFINITE_HOOK_ENV}={value}: rank {rank} holds no model-parallel shard")
        return int(step)

    def _poison_shard_gradient(self, grads, variables):
        """Test-only: +inf into this rank's first shard gradient at the hook's step."""
        k = next(k for k, v in enumerate(variables) if id(v) in self.state.local_ids)
        g = grads[k]
        bad = tf.where(self.state.global_step + 1 == self._nonfinite_hook, np.inf, 0.0)
        values = g.values if isinstance(g, tf.IndexedSlices) else g
        values = values + tf.cast(bad, values.dtype)
        grads = list(grads)
        grads[k] = tf.IndexedSlices(values, g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices) else values
        return grads

    def _reduced_gradients(self, inputs, labels):
        """(mean loss over ranks, stop flag summed over ranks, gradients, all finite on every rank):
        averaged over ranks, embedding gradients kept IndexedSlices (allgathered) unless
        --sparse-as-dense; local shards' as they are."""
        loss, grads = self.grad_fn(inputs, labels)
        return self.exchange_gradients(loss, grads)

    def shared_indices(self) -> list[int]:
        """Positions (in :meth:`TrainState.variables`) of the gradients averaged over ranks."""
        local = self.state.local_ids
        return [k for k, v in enumerate(self.state.variables()) if id(v) not in local]

    def exchange_gradients(self, loss, grads):
        """The gradient exchange of a step (fused step and split step): ``(loss, stop, grads, finite)``;
        ``finite`` (None without --amp): no rank had a non-finite gradient, the same on every rank."""
        grads = list(grads)
        local = list(grads)
        shared = [] if self.state.de else self.shared_indices()
        # Model-parallel table shards get their gradients through the alltoall and belong to this rank
        # only: only the other gradients are averaged (distributed-embeddings' tape did it all already).
        # The loss, the stop flag and (--amp) this rank's non-finite flag ride along in the same
        # allreduce (no extra collective): a shard's overflow is seen by its owner only, and a rank
        # that skipped a step while the others applied it would train on apart.
        extras = [tf.cast(loss, tf.float32), tf.identity(self.state.stop_flag)]
        if self.loss_scaler is not None:
            extras.append(1.0 - tf.cast(all_finite(grads), tf.float32))
        reduced, extras = self.dist.allreduce_gradients(
            [grads[k] for k in shared], sparse_as_dense=self.config.sparse_as_dense, extras=extras)
        for k, g in zip(shared, reduced):
            grads[k] = g
        if not self._exchange_logged:          # at the first trace: how the gradients travel
            self._exchange_logged = True
            self._log_gradient_exchange(local, shared)
        finite = (extras[2] <= 0.0) if self.loss_scaler is not None else None
        return extras[0], extras[1], grads, finite

    def _log_gradient_exchange(self, grads, shared):
        """``gradient_exchange`` record: how many of this rank's gradients are averaged as IndexedSlices
        (allgather of the rows a step touched) or dense (allreduce of the whole variable), and how many
        stay local."""
        if not self.dist.is_chief or self.dist.size == 1:
            return
        variables = self.state.variables()
        sparse_as_dense = bool(self.config.sparse_as_dense)
        sparse = [k for k in shared if isinstance(grads[k], tf.IndexedSlices) and not sparse_as_dense]
        dense = [k for k in shared if grads[k] is not None and k not in sparse]
        dense_bytes, _ = gradient_payload_bytes([grads[k] for k in dense], sparse_as_dense=True,
                                                variables=[variables[k] for k in dense])
        self.log.record("gradient_exchange", allgathered_indexed_slices=len(sparse), allreduced_dense=len(dense),
                        allreduced_dense_bytes=dense_bytes, local=len(variables) - len(shared),
                        sparse_as_dense=sparse_as_dense)

    def apply_gradients(self, grads, finite=None):
        """Every optimizer group applies its (reduced) gradients; the step counters advance.

        Under --amp ``finite`` is the decision every rank shares (:meth:`exchange_gradients`; None:
        this rank's own gradients, right for one rank): all groups apply, or none does, and the
        dynamic loss scale is updated by Keras's own rule fed that decision, never by a rank's
        local view (LossScaleOptimizer.apply_gradients would decide from this rank's gradients)."""
        if self.loss_scaler is not None and finite is None:
            finite = all_finite(grads)
        i = 0
        for k, (_, opt, variables) in enumerate(self.state.groups):
            g = grads[i:i + len(variables)]
            i += len(variables)
            pairs = [(gg, v) for gg, v in zip(g, variables) if gg is not None]
            if self.loss_scaler is None:
                opt.apply_gradients(pairs)
                continue
            if k == 0:
                update_loss_scale(opt, finite)
                inner = opt.inner_optimizer
            else:
                inner = opt

            def apply(inner=inner, pairs=pairs):
                inner.apply_gradients(pairs)
                return tf.constant(True)

            def skip(inner=inner, scaled=k == 0):
                if scaled:       # as Keras's skipped step: the optimizer's iterations still count it
                    inner.iterations.assign_add(1)
                return tf.constant(False)
            tf.cond(finite, apply, skip)
        self.state.global_step.assign_add(1)
        self.state.step_in_epoch.assign_add(1)
        return tf.identity(self.state.global_step)

    def _train_step_impl(self, inputs, labels):
        """One step; returns (mean loss over ranks, > 0 when any rank was asked to stop)."""
        loss, stop, grads, finite = self._reduced_gradients(inputs, labels)
        self.apply_gradients(grads, finite)
        return loss, stop

    def _train_steps_impl(self, iterator, n):
        """Up to ``n`` fused steps on ``iterator``'s batches in one call (``steps_per_call``): the
        per-call host work (Python dispatch, argument packing, the loss read-back) is paid once per
        ``n`` steps. Returns (every step's mean loss over ranks [k], the last step's stop flag);
        k < n when the data ends, when a rank was asked to stop, or (without --amp) after a
        non-finite loss, so that the guard stops the run at that step with no step after it trained."""
        losses = tf.TensorArray(tf.float32, size=0, dynamic_size=True, element_shape=[])
        stop = tf.constant(0.0)
        i = tf.constant(0)
        go = tf.constant(True)
        while go:
            batch = iterator.get_next_as_optional()
            if batch.has_value():
                inputs, labels = batch.get_value()
                loss, stop = self._one_step(inputs, labels)
                losses = losses.write(i, loss)
                i += 1
                go = (i < n) & (stop <= 0)
                if not self.config.amp:
                    go = go & tf.math.is_finite(loss)
            else:
                go = tf.constant(False)
        return losses.stack(), stop

    def _predict_impl(self, inputs):
        return tf.sigmoid(self.state.model(inputs, training=False))

    def predict(self, inputs):
        """Probabilities of one batch; during an evaluation its non-finite ones are counted."""
        watchdog.outside_steps("evaluation or inference (a prediction batch)")   # progress, the long limit
        out = self._predict(inputs)
        if self.count_nonfinite:
            self.nonfinite += int(tf.math.count_nonzero(~tf.math.is_finite(out)))
        return out


def all_finite(grads):
    """One scalar bool: every gradient (IndexedSlices: its values) is finite."""
    checks = [tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
              for g in grads if g is not None]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def update_loss_scale(optimizer, finite) -> None:
    """Keras's dynamic loss-scale update (grow after its growth steps, halve on an overflow), fed the
    decision ``finite`` that every rank shares instead of this rank's gradients. Its state object
    (``LossScaleOptimizer._loss_scale``: run here on 2.15.1, read in the Keras 2 / tf-keras sources)
    checks the gradients it is given, so it is handed one scalar, finite exactly when ``finite`` holds."""
    state = getattr(optimizer, "_loss_scale", None)
    if not hasattr(state, "update"):
        raise TypeError(f"--amp: this Keras's LossScaleOptimizer keeps no dynamic loss-scale state "
                        f"(_loss_scale is {type(state).__name__})")
    state.update([tf.where(finite, 0.0, np.inf)])
