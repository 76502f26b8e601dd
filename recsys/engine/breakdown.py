"""The step breakdown (--breakdown-steps): where a training step's time goes, phase by phase.

A fused step cannot be timed inside; so after a benchmark's timed steps, N split steps run the
same parts of the step (:class:`recsys.engine.step.Step`: its forward+backward, gradient exchange
and optimizer) each as its own call, synchronised and timed on the host, and then compute and the
embedding exchange each alone on the same inputs. The summary's ``step_breakdown`` holds each
rank's means (docs/engine.md, "--breakdown-steps"); the study's projection stands on it.
"""
from __future__ import annotations

import contextlib
import math
import time

import numpy as np
import tensorflow as tf

from recsys.embeddings.alltoall import ModelParallelEmbedding
from recsys.embeddings.group import EmbeddingGroup
from recsys.engine.guards import Guards
from recsys.engine.step import Step
from recsys.monitoring import watchdog
from recsys.runtime.distributed import gradient_payload_bytes
from recsys.runtime.tracing import graph_function

# The phases of a split step (--breakdown-steps), in order; their times add up to the step's.
BREAKDOWN_PHASES = ("input_wait", "compute", "embedding_exchange", "gradient_exchange", "optimizer", "remainder")
# Version of the summary's `step_breakdown` object (docs/engine-log.md); 2: compute timed on its own
# (1: forward+backward less the exchange, which left the remainder 0 by construction), the remainder a
# measurement, `forward_backward_ms`, `timed_step_ms` and `split_over_timed` added.
BREAKDOWN_VERSION = 2
BREAKDOWN_METHOD = ("split step: next(it), forward+backward (its embedding alltoalls inside), gradient exchange "
                    "and optimizer each called and synchronised on its own under host timers; then, on the same "
                    "step's inputs, compute alone (forward+backward with the model-parallel alltoalls replaced "
                    "by local stand-ins of the same shapes) and the embedding alltoalls alone (after a barrier) "
                    "each timed on its own; remainder = split step - the timed phases, a measurement (what the "
                    "step's forward+backward took beyond compute and exchange alone: waits, overlap, noise)")


class StepBreakdown:
    """The split step's functions (built once, at the first :meth:`measure`) and its timing."""

    def __init__(self, step: Step, guards: Guards):
        self.step, self.guards = step, guards
        self.state = step.state
        self.config, self.dist = step.config, step.dist
        self._split = None                        # the split step's functions, once built

    def functions(self) -> dict:
        """The split step's units, each a tf.function called and synchronised on its own; built once.

        Forward+backward is the fused step's ``grad_fn`` (returning too the ids each model-parallel
        layer was given, for the exchange run on the same tensors), the gradient exchange its
        ``exchange_gradients``, the optimizer its ``apply_gradients``: one code path for both."""
        if self._split is None:
            layers = [m for m in self.state.model.submodules if isinstance(m, ModelParallelEmbedding)]
            unmeasured = any(isinstance(m, EmbeddingGroup) and m.implementation == "distributed-embeddings"
                             for m in self.state.model.submodules)
            if self.dist.size == 1:
                layers = []

            # Gradients travel between the units as a flat list of tensors (IndexedSlices as their
            # parts, packed again inside the next function): an IndexedSlices argument costs a
            # tf.function call about twice the host time of its tensors passed flat.
            # The exchange may change the structure (--sparse-as-dense: IndexedSlices in, dense
            # out), so the optimizer unpacks with the structure the exchange returned.
            split = {"structure": None, "reduced": None}

            def gradients(inputs, labels):
                loss, grads = self.step.grad_fn(inputs, labels)
                split["structure"] = list(grads)
                return loss, tf.nest.flatten(split["structure"], expand_composites=True), \
                    [layer.traced_ids() for layer in layers]

            def unflatten(flat, key="structure"):
                return tf.nest.pack_sequence_as(split[key], list(flat), expand_composites=True)

            def gradient_exchange(loss, flat):
                loss, _, reduced, finite = self.step.exchange_gradients(loss, unflatten(flat))
                split["reduced"] = list(reduced)
                # --amp: the shared decision goes to the optimizer unit (a bool, not None, for tf.function)
                return loss, tf.nest.flatten(split["reduced"], expand_composites=True), \
                    tf.constant(True) if finite is None else finite

            def optimizer(flat, finite=None):
                return self.step.apply_gradients(unflatten(flat, "reduced" if self.dist.size > 1 else "structure"),
                                                 finite if self.step.loss_scaler is not None else None)

            def compute(inputs, labels):
                # forward+backward traced with every model-parallel layer's exchange local (the grads
                # returned, so that backward is not pruned); not grad_fn: that one is traced already
                with contextlib.ExitStack() as local:
                    for layer in layers:
                        local.enter_context(layer.local_exchange())
                    loss, grads = self.step.gradients(inputs, labels)
                return loss, tf.nest.flatten(list(grads), expand_composites=True)

            gradients_fn = graph_function(gradients, reduce_retracing=True)
            # without model-parallel layers the step's forward+backward has no exchange to take out:
            # compute alone is a second call of it (one trace fewer)
            compute_fn = (graph_function(compute, jit_compile=bool(self.config.xla), reduce_retracing=True)
                          if layers else gradients_fn)

            def exchange(ids_per_layer):
                sent = tf.constant(0, tf.int64)
                for layer, ids in zip(layers, ids_per_layer):
                    with tf.control_dependencies([sent]):      # one layer after the other, as in the step
                        sent = sent + layer.exchange_only(ids)
                return sent

            split.update(
                layers=layers, unmeasured=unmeasured, unflatten=unflatten,
                gradients=gradients_fn, compute=compute_fn,
                exchange=graph_function(exchange, reduce_retracing=True),
                gradient_exchange=graph_function(gradient_exchange, reduce_retracing=True),
                optimizer=graph_function(optimizer, reduce_retracing=True),
                gpu=bool(tf.config.list_logical_devices("GPU")))
            self._split = split
        return self._split

    def _sync(self, small):
        """Wait until a unit's work is done: on GPUs a device sync (ops are queued asynchronously; a
        Horovod op completes when its collective has), then read a small output back (on CPUs the
        call itself returned when its ops had run)."""
        if self._split["gpu"]:
            tf.test.experimental.sync_devices()
        return small.numpy()

    def _split_step(self, it):
        """One training step as separately timed units, then compute and the embedding exchange each
        alone on the step's inputs; returns (loss, {phase: seconds, step, forward_backward}, bytes)."""
        f = self._split
        t_start = time.perf_counter()
        watchdog.phase(watchdog.INPUT)
        inputs, labels = next(it)
        t_input = time.perf_counter()
        watchdog.phase("compute (forward+backward, with the embedding exchange), split step")
        loss, grads, ids = f["gradients"](inputs, labels)
        loss_v = float(self._sync(loss))
        t_grads = t_exchanged = time.perf_counter()
        reduced, finite = grads, None               # one rank: allreduce_gradients is the identity
        if self.dist.size > 1:
            watchdog.phase("gradient exchange (allreduce/allgather), split step")
            loss, reduced, finite = f["gradient_exchange"](loss, grads)
            finite = finite if self.step.loss_scaler is not None else None     # --amp's shared decision
            loss_v = float(self._sync(loss))
            t_exchanged = time.perf_counter()
        watchdog.phase("optimizer, split step")
        self._sync(f["optimizer"](reduced) if finite is None else f["optimizer"](reduced, finite))
        t_end = time.perf_counter()
        # Outside the step: compute alone on this step's inputs (no collective, unless
        # distributed-embeddings' layer holds one: then the ranks are aligned first) ...
        watchdog.phase("compute alone (forward+backward, no embedding exchange), split step")
        if f["unmeasured"] and self.dist.size > 1:
            self.dist.barrier()
        t_c = time.perf_counter()
        self._sync(f["compute"](inputs, labels)[0])
        compute_s = time.perf_counter() - t_c
        # ... and the embedding exchange alone on this step's ids, the ranks aligned first (so that it
        # times the exchange, not a wait for a slower rank), and the bytes.
        exchange_s, embedding_bytes = 0.0, 0
        if f["layers"]:
            watchdog.phase("embedding exchange (barrier, alltoall), split step")
            self.dist.barrier()
            t_x = time.perf_counter()
            embedding_bytes = int(self._sync(f["exchange"](ids)))
            exchange_s = time.perf_counter() - t_x
        gradient_bytes = 0
        if self.dist.size > 1:
            grads = f["unflatten"](grads)
            shared = self.step.shared_indices()
            gradient_bytes = sum(b or 0 for b in gradient_payload_bytes(
                [grads[k] for k in shared], self.config.sparse_as_dense,
                extras=[loss, self.state.stop_flag] + ([tf.cast(finite, tf.float32)] if finite is not None else [])))
        step = t_end - t_start
        parts = dict(input_wait=t_input - t_start, compute=compute_s,
                     embedding_exchange=exchange_s, gradient_exchange=t_exchanged - t_grads,
                     optimizer=t_end - t_exchanged)
        # measured: the step's own forward+backward less compute and exchange timed alone (any sign)
        parts["remainder"] = step - sum(parts.values())
        parts["step"], parts["forward_backward"] = step, t_grads - t_input
        return loss_v, parts, dict(embedding_exchange=embedding_bytes, gradient_exchange=gradient_bytes)

    def measure(self, it, n: int, losses: list) -> dict:
        """``step_breakdown`` of the summary: n split steps after an untimed one (which traces the
        split functions); each rank's means, gathered (a collective: every rank calls it)."""
        watchdog.outside_steps("tracing the split step")    # its first step traces: the long limit
        self.functions()
        rows, sent = [], []
        for k in range(n + 1):
            loss_v, parts, nbytes = self._split_step(it)
            step = int(self.state.global_step.numpy())
            watchdog.step_done(step)
            if not math.isfinite(loss_v) and not self.config.amp:
                self.guards.diverged(step, f"the training loss is {loss_v}")
            losses[1:] = [(step, loss_v)]
            if k:
                rows.append(parts)
                sent.append(nbytes)
        keys = ["step_ms"] + [f"{p}_ms" for p in BREAKDOWN_PHASES] + ["forward_backward_ms"]
        mine = {key: 1000.0 * float(np.mean([r[key[:-3]] for r in rows])) for key in keys}
        mine_bytes = {key: float(np.mean([b[key] for b in sent])) for key in sent[0]}
        every = self.dist.allgather_object(dict(rank=self.dist.rank, ms=mine, bytes=mine_bytes))
        slowest = max(every, key=lambda e: e["ms"]["step_ms"])
        out = {"version": BREAKDOWN_VERSION, "steps": n, "method": BREAKDOWN_METHOD,
               "phases": list(BREAKDOWN_PHASES),
               "mean": {key: float(np.mean([e["ms"][key] for e in every])) for key in keys},
               "slowest_rank": {"rank": int(slowest["rank"]), **{key: slowest["ms"][key] for key in keys}},
               "bytes_per_step": {key: int(round(np.mean([e["bytes"][key] for e in every])))
                                  for key in ("embedding_exchange", "gradient_exchange")}}
        if self._split["unmeasured"]:
            # distributed-embeddings' exchange is inside its layer: not timed apart, it stays in compute
            out["embedding_exchange_in_compute"] = True
        return out
