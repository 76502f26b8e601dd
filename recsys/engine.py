"""The training loop shared by all models: custom train step, evaluation, benchmark, checkpoints.

One :class:`Engine` drives a :class:`recsys.models.tasks.Task` (which knows its model,
data and metric). The train step is ``loss -> gradients`` (XLA-compiled with
``--xla``), then a Horovod allreduce of the gradients (outside XLA: Horovod ops
are not XLA ops), then one ``apply_gradients`` per optimizer group (W&D has
two). Under ``--amp`` the first optimizer is a LossScaleOptimizer whose
dynamic scale is used for the whole loss. Whether a step is applied (and the scale grows or
halves) is decided for all ranks at once: each rank's "some gradient of mine is not finite" joins
the allreduce the step already makes (a model-parallel shard's gradient lives on its owner only),
and every optimizer group applies, or skips, on that shared answer (docs/engine.md, "--amp").
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import time

import numpy as np
import tensorflow as tf

from recsys import provenance, watchdog
from recsys.checkpoint import BestEvaluation, StopRequest, note_attempt, write_best
from recsys.config import TrainConfig
from recsys.distributed import gradient_payload_bytes
from recsys.embeddings.alltoall import ModelParallelEmbedding
from recsys.embeddings.group import EmbeddingGroup, broadcast, distributed_tape, uses_distributed_embeddings
from recsys.errors import DataError, DivergedError, data_error_message
from recsys.logger import process_start
from recsys.tensorboard import ProfileWindow, optimizer_figures


# Full weight digests (bitwise run comparisons in the summary) only for models up to this size.
DIGEST_MAX_PARAMS = 50_000_000
# The replica check, at any size: rows of every replicated variable sampled at fixed positions.
REPLICA_SAMPLE_ROWS = 64
# Test-only: "RANK:STEP" makes that rank's first model-parallel shard gradient non-finite at that
# step, as an fp16 overflow on the shard's owner would (tests/recsys/test_amp_sync.py).
NONFINITE_HOOK_ENV = "RECSYS_TEST_NONFINITE_SHARD_GRAD"
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
# Version of the `summary` log record (docs/engine-log.md); 2: throughput from the slowest
# rank's timed seconds (1: their mean), and `provenance`; 3: a benchmark's timed steps include
# their input wait, and `step_breakdown` (--breakdown-steps).
SUMMARY_VERSION = 3
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


class StopTraining(Exception):
    pass


class Engine:
    def __init__(self, config: TrainConfig, task, dist, logger):
        self.config, self.task, self.dist, self.log = config, task, dist, logger
        self.model = task.build_model()
        self.groups = task.optimizer_groups(self.model)          # [(name, optimizer, variables)]
        if config.amp:
            name, opt, var_fn = self.groups[0]
            self.groups[0] = (name, tf.keras.mixed_precision.LossScaleOptimizer(opt), var_fn)
        self.loss_scaler = self.groups[0][1] if config.amp else None
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.step_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="step_in_epoch")
        self._stop_flag = tf.Variable(0.0, trainable=False, name="stop_requested")  # set by SIGUSR2
        self._eval_step = None                    # step of the last evaluation (None: none yet)
        self._saved_step = self._saved_path = None  # step and path of the last checkpoint written
        self._restored_path = None                # the checkpoint this process started from
        self._restored_epoch_end = False          # it was saved at an epoch's end (evaluated there)
        self._restored_step = None
        # the best evaluation and the early stop's count (--early-stop-patience, --keep-best)
        self.best = BestEvaluation(task.watched_metric, config.early_stop_patience, config.early_stop_min_delta)
        self._startup_s = None                    # process start -> first trained step of this process
        self._count_nonfinite, self._nonfinite = False, 0
        self._exchange_logged = False
        self._split = None                        # the split step's functions (--breakdown-steps), once built
        self.profiler = ProfileWindow.of(config, dist.rank)   # --profile-steps (recsys.tensorboard)
        self._build()
        self._nonfinite_hook = self._nonfinite_hook_step()
        ckpt = tf.train.Checkpoint(model=self.model, global_step=self.global_step, epoch=self.epoch,
                                   step_in_epoch=self.step_in_epoch,
                                   **{f"optimizer_{n}": o for n, o, _ in self.groups})
        self.checkpointer = None
        if config.checkpoint_dir:
            # Replicated weights: rank 0 writes; model-parallel tables: every rank its shard.
            from recsys.sharded_checkpoint import make_checkpointer
            self.checkpointer = make_checkpointer(
                config, ckpt, self.model, dist, dict(global_step=self.global_step, epoch=self.epoch,
                                                     step_in_epoch=self.step_in_epoch),
                optimizers=[o.inner_optimizer if isinstance(o, tf.keras.mixed_precision.LossScaleOptimizer) else o
                            for _, o, _ in self.groups], log=logger)
        # Without XLA the gradient code is traced inline into the step (one graph, no nested call).
        self._grad_fn = (tf.function(self._gradients, jit_compile=True, reduce_retracing=True)
                         if config.xla else self._gradients)
        self._train_step = tf.function(self._train_step_impl, reduce_retracing=True)
        self._train_steps = tf.function(self._train_steps_impl, reduce_retracing=True)
        # Several steps per call on one rank only: Horovod keys a collective by its op's name, and
        # inside a compiled loop the names carry per-process graph counters (while/cond/then/_178 on
        # one rank, _186 on the other: a 2-rank model-parallel run deadlocked on its alltoall).
        self._steps_per_call = config.steps_per_call if dist.size == 1 else 1
        self._predict = tf.function(self._predict_impl, jit_compile=bool(config.xla), reduce_retracing=True)

    # --- building ----------------------------------------------------------
    def _build(self):
        inputs, _ = self.task.sample_batch()
        self.model(inputs, training=False)
        # Variable lists are fixed once the model is built: resolve them outside any tf.function.
        self.groups = [(n, opt, list(var_fn())) for n, opt, var_fn in self.groups]
        for _, opt, variables in self.groups:
            inner = opt.inner_optimizer if isinstance(opt, tf.keras.mixed_precision.LossScaleOptimizer) else opt
            inner.build(variables)
        self._local_ids = self.task.local_variable_ids(self.model)
        self._seeded_ids, self._table_seeds = self.task.seeded_tables(self.model)
        self._de = uses_distributed_embeddings(self.model)   # its tape and broadcast (docs/embeddings.md)
        if self._de and self.dist.is_chief:     # what DE built, per rank (checked equal to the placement's plan)
            from recsys.embeddings.de_adapter import built_line
            for m in self.model.submodules:
                if isinstance(m, EmbeddingGroup) and m.implementation == "distributed-embeddings":
                    self.log.info(built_line(m.name, m._dist))
        # The divergence guard's weight checks: the dense (replicated) weights at every log interval,
        # every weight before a checkpoint and an evaluation.
        tables = {id(v) for m in self.model.submodules if isinstance(m, EmbeddingGroup) for v in m.variables}
        floats = [v for v in self.model.weights if v.dtype.is_floating]
        self._dense_weights = [v for v in floats if id(v) not in tables]
        self._all_weights = floats
        # What data parallelism keeps equal on every rank: all but this rank's model-parallel shards,
        # and the loss scale (the replica check, _replica_digest).
        self._replicated_weights = [v for v in self.model.weights if id(v) not in self._local_ids]
        self._replica_sample_fn = tf.function(self._replica_sample)
        self._finite_fn = tf.function(lambda vs: tf.stack([tf.reduce_all(tf.math.is_finite(v)) for v in vs]))

    def state_variables(self):
        out = list(self.model.variables)
        for _, opt, _ in self.groups:
            out += list(opt.variables)
        return out

    def broadcast_initial_state(self):
        """Every rank starts from rank 0's dense weights (after init or restore).

        Not broadcast: model-parallel shards (each rank holds its own); embedding tables, which
        every rank initialises identically from its group's seed (checked here: the seeds are
        compared across ranks, and broadcast after all if they differ), since a broadcast costs a
        transient copy of every table on every rank; optimizer state, identical on every rank
        by construction (constant initial slots; after a restore every rank has read the same
        checkpoint). An ``initial_state`` record says what was broadcast.
        """
        if self.dist.size == 1:
            return
        seeded = self._seeded_ids
        if seeded:
            seeds = np.asarray(self._table_seeds, np.int64)
            every = np.asarray(self.dist.allgather(seeds[None, :]))
            if (every != seeds[None, :]).any():
                self.log.info("embedding table seeds differ across ranks: broadcasting the tables from rank 0")
                seeded = set()
        shared = [v for v in self.model.variables if id(v) not in self._local_ids and id(v) not in seeded]
        if self._de:          # distributed-embeddings' own: every variable but its shards, as `shared`
            broadcast(self.model.variables, root_rank=0)
        else:
            self.dist.broadcast_variables(shared, root_rank=0)
        if self.dist.is_chief:
            nbytes = lambda vs: sum(int(v.shape.num_elements()) * v.dtype.size for v in vs)  # noqa: E731
            self.log.record("initial_state", broadcast_variables=len(shared), broadcast_bytes=nbytes(shared),
                            seeded_table_bytes=nbytes(v for v in self.model.variables if id(v) in seeded),
                            local_bytes=nbytes(v for v in self.model.variables if id(v) in self._local_ids))

    # --- steps -------------------------------------------------------------
    def _variables(self):
        return [v for _, _, variables in self.groups for v in variables]

    def _gradients(self, inputs, labels):
        variables = self._variables()
        with tf.GradientTape() as tape:
            logits = self.model(inputs, training=True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
            scaled = self.loss_scaler.get_scaled_loss(loss) if self.loss_scaler is not None else loss
        grads = (distributed_tape(tape) if self._de else tape).gradient(scaled, variables)
        if self.loss_scaler is not None:
            grads = self.loss_scaler.get_unscaled_gradients(grads)
        if self._nonfinite_hook is not None:
            grads = self._poison_shard_gradient(grads, variables)
        return loss, grads

    def _nonfinite_hook_step(self):
        """The step of :data:`NONFINITE_HOOK_ENV` for this rank, or None (unset: no op is added)."""
        import os
        value = os.environ.get(NONFINITE_HOOK_ENV, "")
        if not value:
            return None
        rank, _, step = value.partition(":")
        if int(rank) != self.dist.rank:
            return None
        if not any(id(v) in self._local_ids for v in self._variables()):
            raise RuntimeError(f"{NONFINITE_HOOK_ENV}={value}: rank {rank} holds no model-parallel shard")
        return int(step)

    def _poison_shard_gradient(self, grads, variables):
        """Test-only: +inf into this rank's first shard gradient at the hook's step."""
        k = next(k for k, v in enumerate(variables) if id(v) in self._local_ids)
        g = grads[k]
        bad = tf.where(self.global_step + 1 == self._nonfinite_hook, np.inf, 0.0)
        values = g.values if isinstance(g, tf.IndexedSlices) else g
        values = values + tf.cast(bad, values.dtype)
        grads = list(grads)
        grads[k] = tf.IndexedSlices(values, g.indices, g.dense_shape) if isinstance(g, tf.IndexedSlices) else values
        return grads

    def _reduced_gradients(self, inputs, labels):
        """(mean loss over ranks, stop flag summed over ranks, gradients, all finite on every rank):
        averaged over ranks, embedding gradients kept IndexedSlices (allgathered) unless
        --sparse-as-dense; local shards' as they are."""
        loss, grads = self._grad_fn(inputs, labels)
        return self._exchange_gradients(loss, grads)

    def _exchange_gradients(self, loss, grads):
        """The gradient exchange of a step (fused step and split step): ``(loss, stop, grads, finite)``;
        ``finite`` (None without --amp): no rank had a non-finite gradient, the same on every rank."""
        grads = list(grads)
        local = list(grads)
        shared = [] if self._de else [k for k, v in enumerate(self._variables()) if id(v) not in self._local_ids]
        # Model-parallel table shards get their gradients through the alltoall and belong to this rank
        # only: only the other gradients are averaged (distributed-embeddings' tape did it all already).
        # The loss, the stop flag and (--amp) this rank's non-finite flag ride along in the same
        # allreduce (no extra collective): a shard's overflow is seen by its owner only, and a rank
        # that skipped a step while the others applied it would train on apart.
        extras = [tf.cast(loss, tf.float32), tf.identity(self._stop_flag)]
        if self.loss_scaler is not None:
            extras.append(1.0 - tf.cast(_all_finite(grads), tf.float32))
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
        variables = self._variables()
        sparse_as_dense = bool(self.config.sparse_as_dense)
        sparse = [k for k in shared if isinstance(grads[k], tf.IndexedSlices) and not sparse_as_dense]
        dense = [k for k in shared if grads[k] is not None and k not in sparse]
        dense_bytes, _ = gradient_payload_bytes([grads[k] for k in dense], sparse_as_dense=True,
                                                variables=[variables[k] for k in dense])
        self.log.record("gradient_exchange", allgathered_indexed_slices=len(sparse), allreduced_dense=len(dense),
                        allreduced_dense_bytes=dense_bytes, local=len(variables) - len(shared),
                        sparse_as_dense=sparse_as_dense)

    def _apply_gradients(self, grads, finite=None):
        """Every optimizer group applies its (reduced) gradients; the step counters advance.

        Under --amp ``finite`` is the decision every rank shares (:meth:`_exchange_gradients`; None:
        this rank's own gradients, right for one rank): all groups apply, or none does, and the
        dynamic loss scale is updated by Keras's own rule fed that decision, never by a rank's
        local view (LossScaleOptimizer.apply_gradients would decide from this rank's gradients)."""
        if self.loss_scaler is not None and finite is None:
            finite = _all_finite(grads)
        i = 0
        for k, (_, opt, variables) in enumerate(self.groups):
            g = grads[i:i + len(variables)]
            i += len(variables)
            pairs = [(gg, v) for gg, v in zip(g, variables) if gg is not None]
            if self.loss_scaler is None:
                opt.apply_gradients(pairs)
                continue
            if k == 0:
                _update_loss_scale(opt, finite)
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
        self.global_step.assign_add(1)
        self.step_in_epoch.assign_add(1)
        return tf.identity(self.global_step)

    def _train_step_impl(self, inputs, labels):
        """One step; returns (mean loss over ranks, > 0 when any rank was asked to stop)."""
        loss, stop, grads, finite = self._reduced_gradients(inputs, labels)
        self._apply_gradients(grads, finite)
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
                loss, stop = self._train_step_impl(inputs, labels)
                losses = losses.write(i, loss)
                i += 1
                go = (i < n) & (stop <= 0)
                if not self.config.amp:
                    go = go & tf.math.is_finite(loss)
            else:
                go = tf.constant(False)
        return losses.stack(), stop

    def _predict_impl(self, inputs):
        return tf.sigmoid(self.model(inputs, training=False))

    def predict(self, inputs):
        watchdog.outside_steps("evaluation or inference (a prediction batch)")   # progress, the long limit
        out = self._predict(inputs)
        if self._count_nonfinite:
            self._nonfinite += int(tf.math.count_nonzero(~tf.math.is_finite(out)))
        return out

    def weights_digest(self):
        """SHA-1 of all model weights (bitwise), to compare replicas or runs."""
        h = hashlib.sha1()
        for v in self.model.weights:
            h.update(np.ascontiguousarray(v.numpy()).tobytes())
        return h.hexdigest()

    def _replica_sample(self):
        """Fixed rows of every replicated variable (at most REPLICA_SAMPLE_ROWS, evenly spaced, first
        and last included; read by gather, never the whole variable), and the loss scale state."""
        out = []
        for v in self._replicated_weights:
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

    def replica_digest(self):
        """SHA-1 of a fixed sample of what every rank must hold alike (all but its model-parallel
        shards, plus the loss scale): cheap at any model size, bitwise like the full digest."""
        h = hashlib.sha1()
        for t in self._replica_sample_fn():
            h.update(np.ascontiguousarray(t.numpy()).tobytes())
        return h.hexdigest()

    def _check_replicas(self, step):
        """Replicas that drifted apart (a collective: every rank calls it) stop the run as a divergence;
        returns every rank's digest."""
        digests = self.dist.allgather_object(self.replica_digest())
        if len(set(digests)) > 1:
            apart = [r for r, d in enumerate(digests) if d != digests[0]]
            self._diverged(step, f"the replicated weights of rank(s) {apart} differ from rank 0's (sampled digests "
                                 f"{digests[0][:8]} vs {digests[apart[0]][:8]}): the replicas drifted apart",
                          advice=DRIFT_ADVICE)
        return digests

    # --- checkpoints ----------------------------------------------------------
    def restore(self, path=None):
        meta = self.checkpointer.restore(path)
        self.broadcast_initial_state()
        self.best.restored(meta.get("early_stop"))
        self._protect_best()
        self._restored_epoch_end = int(meta.get("step_in_epoch", 0) or 0) == 0 and int(meta.get("step", 0) or 0) > 0
        self._restored_step = int(meta.get("step", 0) or 0)
        step, epoch = int(self.global_step.numpy()), int(self.epoch.numpy())
        self._restored_path = meta["path"]
        # Training: steps after this one that an earlier attempt logged are trained (and logged) again.
        then = f"; training continues at step {step + 1}" if self.config.mode == "train" else ""
        self.log.info(f"restored {meta['path']} at step {step} epoch {epoch}{then}", checkpoint=meta["path"],
                      restored_step=step, restored_epoch=epoch)
        return meta

    def save(self, reason):
        if self.checkpointer is None:
            return None
        t0 = time.time()
        path = self.checkpointer.save(int(self.global_step.numpy()), epoch=int(self.epoch.numpy()),
                                      step_in_epoch=int(self.step_in_epoch.numpy()), reason=reason,
                                      early_stop=self.best.state())
        self.dist.barrier()
        self._saved_step, self._saved_path = int(self.global_step.numpy()), path
        if self.dist.is_chief:
            self.log.record("checkpoint", path=path, step=int(self.global_step.numpy()), reason=reason)
            note_attempt(self.config.checkpoint_dir, startup_s=self._startup_s, checkpoint_s=round(time.time() - t0, 3),
                         step=self._saved_step, reason=reason)
        return path

    # --- loops -----------------------------------------------------------------
    def train(self):
        """Epoch loop; after each epoch (and after the last step) a checkpoint, then an evaluation.

        The checkpoint comes first so that an evaluation that fails (bad test data) loses no
        trained step. The summary reports the evaluation and the checkpoint of the last step.
        A non-finite loss stops the run (:class:`DivergedError`) without writing a checkpoint.
        """
        c, dist = self.config, self.dist
        stop = StopRequest()
        max_steps = c.max_steps or None
        steps_per_epoch = self.task.steps_per_epoch()
        total = min(max_steps or steps_per_epoch * c.epochs, steps_per_epoch * c.epochs)
        global_batch = self.task.global_batch
        self.broadcast_initial_state()
        self._warn_schedule(total)
        metrics, timed_steps, timed_seconds = {}, 0, 0.0
        if self._restored_epoch_end and self.best.last_step != int(self.global_step.numpy()):
            # Restored from an epoch's checkpoint whose evaluation its run did not finish: the count
            # goes on from that evaluation, as in a run that was never stopped.
            metrics = self.evaluate(log=True)
            self._judge(metrics)
        losses = []                      # (step, loss) of the first and the last step of this run
        interrupted = False
        nonfinite_in_a_row = 0
        # Warm-up is counted per attempt (steps this process trained), not by the global step: a
        # restored or requeued attempt traces its functions again, and its first steps are as slow.
        attempt_steps, first_timed = 0, None
        try:
            while int(self.epoch.numpy()) < c.epochs and not self.best.stop:
                if max_steps and int(self.global_step.numpy()) >= max_steps:
                    break
                epoch = int(self.epoch.numpy())
                skip = int(self.step_in_epoch.numpy())
                ds = self.task.train_dataset(epoch)
                if skip:
                    ds = ds.skip(skip)
                t_last, n_last = time.perf_counter(), 0
                it = iter(ds)
                while True:
                    before = int(self.global_step.numpy())
                    if max_steps and before >= max_steps:
                        break
                    # A call ends at the next log step and at --max-steps: the guard's weight check,
                    # the step record and the end of the run stay where one step per call puts them.
                    n = min(self._steps_per_call, c.log_every - before % c.log_every,
                            (max_steps - before) if max_steps else self._steps_per_call)
                    t0 = time.perf_counter()
                    if stop.requested:
                        self._stop_flag.assign(1.0)
                    n = self.profiler.limit(before, n)         # one step per call in the profiled window
                    with self.profiler.steps(before, n):
                        step_losses, stop_any = self._train_call(it, n)
                    if not step_losses:
                        break                                   # the epoch's data has ended
                    watchdog.step_done(before + len(step_losses))
                    if self._startup_s is None:
                        self._startup_s = round(time.time() - process_start(), 3)
                    per_step = (time.perf_counter() - t0) / len(step_losses)
                    for step, loss_v in enumerate(step_losses, start=before + 1):
                        if math.isfinite(loss_v):
                            nonfinite_in_a_row = 0
                            self._check_explosion(step, loss_v, losses)
                        else:
                            nonfinite_in_a_row += 1
                            if not c.amp or nonfinite_in_a_row > AMP_MAX_SKIPPED_STEPS:
                                self._diverged(step, f"the training loss is {loss_v}")
                            self._check_loss_scale_floor(step, loss_v)
                        losses[1:] = [(step, loss_v)]    # keeps the first, replaces the last
                        n_last += 1
                        if step % c.log_every == 0 or (max_steps and step >= max_steps):
                            self._check_weights(step, loss_v, dense_only=True)
                            now = time.perf_counter()
                            self.log.step(step, epoch, loss_v, n_last * global_batch / max(now - t_last, 1e-9),
                                          total_steps=total, lr=self._current_lr(),
                                          step_time_ms=1000.0 * (now - t_last) / n_last,
                                          **optimizer_figures(self.groups, self.loss_scaler))
                            t_last, n_last = now, 0
                        attempt_steps += 1
                        if attempt_steps > c.benchmark_warmup_steps:
                            first_timed = step if first_timed is None else first_timed
                            timed_steps += 1
                            timed_seconds += per_step
                    if stop_any > 0:      # every rank sees the same reduced flag
                        interrupted = True
                        raise StopTraining
                at_max = max_steps and int(self.global_step.numpy()) >= max_steps
                if at_max and int(self.step_in_epoch.numpy()) < steps_per_epoch:
                    break       # mid-epoch: the final checkpoint and evaluation follow the loop
                self._check_final_loss(losses)
                self._check_weights(int(self.global_step.numpy()), losses[-1][1] if losses else None)
                watchdog.outside_steps("the epoch's checkpoint and evaluation")
                self._end_epoch()
                self.save("epoch")
                metrics = self.evaluate(log=True)
                self._judge(metrics)
            if self._eval_step != int(self.global_step.numpy()):
                # The run ended between evaluations (--max-steps, or a restore of the final step).
                watchdog.outside_steps("the final checkpoint and evaluation")
                self._check_final_loss(losses)
                self._check_weights(int(self.global_step.numpy()), losses[-1][1] if losses else None)
                self.save("end")
                metrics = self.evaluate(log=True)
                self._judge(metrics)
        except StopTraining:
            self.save("signal")
            if dist.is_chief:
                self.log.info("checkpoint saved on signal")
        finally:
            stop.restore_handlers()
            self.profiler.close()
        return self._summary("train", timed_steps, timed_seconds, metrics, losses, interrupted,
                             extra=dict(self._best_fields(), first_timed_step=first_timed))

    # --- the best evaluation and the early stop (recsys.checkpoint.BestEvaluation) ----------------
    def _judge(self, metrics):
        """Count an evaluation: a new best is recorded (its checkpoint kept with --keep-best and named
        in best.json); spent patience is logged and ends the epoch loop. Rank 0's value decides for
        every rank (one small collective): the metric is reduced already, and the stop must be one."""
        step, epoch = int(self.global_step.numpy()), int(self.epoch.numpy())
        value = metrics.get(self.best.metric)
        if self.dist.size > 1:
            value = self.dist.allgather_object(value)[0]
        checkpoint = (self._saved_path if self._saved_step == step else
                      self._restored_path if self._restored_step == step else None)
        if self.best.update(step, epoch, dict(metrics, **{self.best.metric: value}), checkpoint):
            self._protect_best()
            if self.config.keep_best and checkpoint and self.dist.is_chief:
                write_best(self.config.checkpoint_dir, self.best)
        if self.best.stop and self.dist.is_chief:
            b = self.best
            self.log.info(f"early stop at epoch {epoch} step {step}: {b.metric} has not beaten {b.value:.5f} "
                          f"(epoch {b.epoch} step {b.step}) for {b.since_best} evaluations "
                          f"(--early-stop-patience {b.patience})", early_stop=True, best_step=b.step,
                          best_value=b.value)

    def _protect_best(self):
        """--keep-best: the best checkpoint is never pruned (the newest --keep-checkpoints are kept besides)."""
        if self.checkpointer is not None and self.config.keep_best:
            self.checkpointer.protected = {self.best.checkpoint} if self.best.checkpoint else set()
            self.checkpointer.prune()            # the best before this one may go now

    def _best_fields(self):
        """The summary's ``best_eval`` (the best evaluation; the summary's own metrics are the last one's)
        and ``early_stopped`` (the epoch and step the patience ran out at, or null)."""
        b = self.best
        stopped = dict(step=b.last_step, epoch=int(self.epoch.numpy()), patience=b.patience) if b.stop else None
        return dict(best_eval=b.summary() if b.value is not None else None, early_stopped=stopped)

    def _train_call(self, it, n):
        """Up to ``n`` training steps on the batches of iterator ``it``: ``([loss per step], stop flag)``,
        no loss when the data has ended. One step per call (``steps_per_call`` 1, and every run of more
        than one rank) is the fused step fed from Python; more run in one compiled loop
        (:meth:`_train_steps_impl`).

        A reader's data error (raised inside tf.data) becomes one line; before raising, the steps
        trained so far (those of this call before the bad batch included) are checkpointed: bad data
        found late loses nothing."""
        try:
            if self._steps_per_call == 1:
                watchdog.phase(watchdog.INPUT)
                try:
                    inputs, labels = next(it)
                except StopIteration:
                    return [], 0.0
                watchdog.phase(watchdog.FUSED_STEP)
                loss, stop_any = self._train_step(inputs, labels)
                # The stop flag is read every step anyway: reading the loss too costs no extra sync.
                return [float(loss.numpy())], float(stop_any.numpy())
            watchdog.phase(f"{n} training steps in one compiled call (input and step)")
            losses, stop_any = self._train_steps(it, tf.constant(n, tf.int32))
            return [float(v) for v in losses.numpy()], float(stop_any.numpy())
        except tf.errors.OpError as err:
            message = data_error_message(err)
            if message is None:
                raise
            if self.global_step.numpy() > 0 and self._saved_step != int(self.global_step.numpy()):
                self.save("data-error")
            raise DataError(message) from None

    def _check_explosion(self, step, loss_v, losses):
        """A finite loss far above the run's first one (EXPLOSION_LOSS_FACTOR) is a divergence."""
        if not losses:
            return
        first = losses[0][1]
        limit = max(EXPLOSION_LOSS_FACTOR * first, EXPLOSION_MIN_LOSS) if math.isfinite(first) else math.inf
        if loss_v > limit:
            self._diverged(step, f"the training loss {loss_v:.4g} is more than {EXPLOSION_LOSS_FACTOR:g} times "
                                 f"the first one ({first:.4g} at step {losses[0][0]})")

    def _check_loss_scale_floor(self, step, loss_v):
        """--amp: a skipped step while the loss scale sits at its floor (Keras's dynamic scale never
        goes below AMP_LOSS_SCALE_FLOOR) is a divergence: halving cannot help, every later step is skipped."""
        if self.loss_scaler is None:
            return
        scale = float(self.loss_scaler.loss_scale.numpy())
        if scale <= AMP_LOSS_SCALE_FLOOR:
            self._diverged(step, f"the training loss is {loss_v} with --amp's loss scale at its floor "
                                 f"({scale:g}): every step is skipped")

    def _check_final_loss(self, losses):
        """A run whose last loss is non-finite (--amp skipped its last steps) has not trained: it fails."""
        if losses and not math.isfinite(losses[-1][1]):
            self._diverged(losses[-1][0], f"the training loss of the last step is {losses[-1][1]}"
                                          + (" (--amp skipped it)" if self.loss_scaler is not None else ""))

    def _check_weights(self, step, loss_v=None, dense_only=False):
        """Non-finite weights are a divergence even when the loss stays finite: fused kernels
        (MatMul+BiasAdd+Relu on CPU inside tf.function) turn a NaN input into 0, so NaN weights can
        leave the loss finite. ``dense_only``: the replicated weights (cheap, the same on every rank,
        so no collective); else every weight, model-parallel shards included (a collective)."""
        variables = self._dense_weights if dense_only else self._all_weights
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
            self._diverged(step, f"non-finite weights ({bad[0]}{more}){loss}")
        if not dense_only and self.dist.size > 1:
            self._check_replicas(step)

    def _diverged(self, step, what, advice=None):
        latest = self.checkpointer.latest() if self.checkpointer is not None else None
        if self.dist.is_chief:
            self.log.record("diverged", step=step, reason=what, last_checkpoint=latest)
        hint = "--lr or --linear-lr" if self.config.model == "wide_deep" else "--lr"
        raise DivergedError(f"step {step}: {what}: the run diverged ({advice or f'lower {hint}?'}); "
                            + (f"last good checkpoint {latest}" if latest else "no checkpoint written"))

    def _warn_schedule(self, total):
        """Warn when a learning rate decays to 0 before the run's last step (later steps learn nothing)."""
        for name, opt, _ in self.groups:
            inner = opt.inner_optimizer if isinstance(opt, tf.keras.mixed_precision.LossScaleOptimizer) else opt
            schedule = getattr(inner, "_learning_rate", None)
            end = getattr(schedule, "zero_from_step", lambda: None)()
            if end is not None and end < total:
                self.log.info(f"warning: the learning rate of optimizer '{name}' reaches 0 at step {end}, "
                              f"before the run ends at step {total}: later steps do not learn "
                              f"(see --decay-start-step / --decay-steps)", warning="lr_schedule_ends_early",
                              lr_zero_step=end, total_steps=total)

    def _end_epoch(self):
        self.epoch.assign_add(1)
        self.step_in_epoch.assign(0)

    def _current_lr(self):
        _, opt, _ = self.groups[0]
        lr = opt.learning_rate
        try:
            return float(lr.numpy() if hasattr(lr, "numpy") else lr)
        except Exception:
            return None

    def evaluate(self, log=False):
        """Metrics of the task at the current step; non-finite predictions stop the run."""
        t0 = time.perf_counter()
        step = int(self.global_step.numpy())
        self._count_nonfinite, self._nonfinite = True, 0
        try:
            metrics = self.task.evaluate(self)
        except tf.errors.OpError as err:
            message = data_error_message(err)
            if message is None:
                raise
            raise DataError(message) from None
        finally:
            self._count_nonfinite = False
        nonfinite = int(self.dist.allreduce_sum(np.array([self._nonfinite], np.int64))[0])
        if nonfinite:
            self._diverged(step, f"{nonfinite} non-finite predictions at evaluation")
        metrics = {k: float(v) for k, v in metrics.items()}
        self._eval_step = step
        if log:
            self.log.eval(int(self.global_step.numpy()), int(self.epoch.numpy()), metrics)
            self.log.record("eval_time", seconds=time.perf_counter() - t0)
        return metrics

    def evaluate_checkpoint(self):
        """``--run-mode evaluate``: the metrics of the restored checkpoint, as a ``summary`` record
        (``evaluated_checkpoint`` names it; ``checkpoint``, the one written, stays null)."""
        metrics = self.evaluate(log=True)
        return self._summary("evaluate", 0, 0.0, metrics, [], False, batch=self.task.global_eval_batch,
                             evaluated=self._restored_path)

    def benchmark(self):
        """Warm-up steps, then timed training steps on a repeating dataset (warm-up excluded); then,
        with ``--breakdown-steps N``, N split steps whose phases are timed one by one (step_breakdown).

        A timed step runs from the end of the previous one (before ``next(it)``: input stalls count)
        to its loss read back: the timed steps tile the timed stretch without gaps, so a stall
        anywhere in the loop (the bookkeeping and logging between steps too) is in some step."""
        c = self.config
        self.broadcast_initial_state()
        it = iter(self.task.benchmark_dataset())
        warm, steps = c.benchmark_warmup_steps, c.benchmark_steps
        times = []
        losses = []
        t0 = time.perf_counter()
        for i in range(warm + steps):
            if i == 1:
                self.log.startup("first_step")      # the first step (its tracing included) has ended
            if i == warm:
                t0 = time.perf_counter()            # the timed stretch starts here
            watchdog.phase(watchdog.INPUT)
            inputs, labels = next(it)
            watchdog.phase(watchdog.FUSED_STEP)
            with self.profiler.steps(i):
                loss, _ = self._train_step(inputs, labels)
                loss_v = float(loss.numpy())      # step boundary: wait for the device
            watchdog.step_done(i + 1)
            t1 = time.perf_counter()
            elapsed, t0 = t1 - t0, t1
            if i >= warm:
                times.append(elapsed)
            if not math.isfinite(loss_v) and not c.amp:
                self._diverged(i + 1, f"the training loss is {loss_v}")
            losses[1:] = [(i + 1, loss_v)]            # keeps the first, replaces the last
            if (i + 1) % c.log_every == 0:
                # this step's own rate (warm-up included), not a division by a placeholder time
                self.log.step(i + 1, 0, loss_v, self.task.global_batch / max(elapsed, 1e-9),
                              total_steps=warm + steps, step_time_ms=1000.0 * elapsed,
                              **optimizer_figures(self.groups, self.loss_scaler))
        self.profiler.close()
        breakdown = self._step_breakdown(it, c.breakdown_steps, losses) if c.breakdown_steps > 0 else None
        return self._summary("benchmark", len(times), float(np.sum(times)), {}, losses, False, step_times=times,
                             breakdown=breakdown)

    # --- step breakdown (--breakdown-steps) ------------------------------------------
    def _split_functions(self):
        """The split step's units, each a tf.function called and synchronised on its own; built once.

        Forward+backward is the fused step's ``_grad_fn`` (returning too the ids each model-parallel
        layer was given, for the exchange run on the same tensors), the gradient exchange its
        ``_exchange_gradients``, the optimizer its ``_apply_gradients``: one code path for both."""
        if self._split is None:
            layers = [m for m in self.model.submodules if isinstance(m, ModelParallelEmbedding)]
            unmeasured = any(isinstance(m, EmbeddingGroup) and m.implementation == "distributed-embeddings"
                             for m in self.model.submodules)
            if self.dist.size == 1:
                layers = []

            # Gradients travel between the units as a flat list of tensors (IndexedSlices as their
            # parts, packed again inside the next function): an IndexedSlices argument costs a
            # tf.function call about twice the host time of its tensors passed flat.
            # The exchange may change the structure (--sparse-as-dense: IndexedSlices in, dense
            # out), so the optimizer unpacks with the structure the exchange returned.
            split = {"structure": None, "reduced": None}

            def gradients(inputs, labels):
                loss, grads = self._grad_fn(inputs, labels)
                split["structure"] = list(grads)
                return loss, tf.nest.flatten(split["structure"], expand_composites=True), \
                    [layer.traced_ids() for layer in layers]

            def unflatten(flat, key="structure"):
                return tf.nest.pack_sequence_as(split[key], list(flat), expand_composites=True)

            def gradient_exchange(loss, flat):
                loss, _, reduced, finite = self._exchange_gradients(loss, unflatten(flat))
                split["reduced"] = list(reduced)
                # --amp: the shared decision goes to the optimizer unit (a bool, not None, for tf.function)
                return loss, tf.nest.flatten(split["reduced"], expand_composites=True), \
                    tf.constant(True) if finite is None else finite

            def optimizer(flat, finite=None):
                return self._apply_gradients(unflatten(flat, "reduced" if self.dist.size > 1 else "structure"),
                                             finite if self.loss_scaler is not None else None)

            def compute(inputs, labels):
                # forward+backward traced with every model-parallel layer's exchange local (the grads
                # returned, so that backward is not pruned); not _grad_fn: that one is traced already
                with contextlib.ExitStack() as local:
                    for layer in layers:
                        local.enter_context(layer.local_exchange())
                    loss, grads = self._gradients(inputs, labels)
                return loss, tf.nest.flatten(list(grads), expand_composites=True)

            gradients_fn = tf.function(gradients, reduce_retracing=True)
            # without model-parallel layers the step's forward+backward has no exchange to take out:
            # compute alone is a second call of it (one trace fewer)
            compute_fn = (tf.function(compute, jit_compile=bool(self.config.xla), reduce_retracing=True)
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
                exchange=tf.function(exchange, reduce_retracing=True),
                gradient_exchange=tf.function(gradient_exchange, reduce_retracing=True),
                optimizer=tf.function(optimizer, reduce_retracing=True),
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
            finite = finite if self.loss_scaler is not None else None     # --amp's shared decision
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
            shared = [k for k, v in enumerate(self._variables()) if id(v) not in self._local_ids]
            gradient_bytes = sum(b or 0 for b in gradient_payload_bytes(
                [grads[k] for k in shared], self.config.sparse_as_dense,
                extras=[loss, self._stop_flag] + ([tf.cast(finite, tf.float32)] if finite is not None else [])))
        step = t_end - t_start
        parts = dict(input_wait=t_input - t_start, compute=compute_s,
                     embedding_exchange=exchange_s, gradient_exchange=t_exchanged - t_grads,
                     optimizer=t_end - t_exchanged)
        # measured: the step's own forward+backward less compute and exchange timed alone (any sign)
        parts["remainder"] = step - sum(parts.values())
        parts["step"], parts["forward_backward"] = step, t_grads - t_input
        return loss_v, parts, dict(embedding_exchange=embedding_bytes, gradient_exchange=gradient_bytes)

    def _step_breakdown(self, it, n, losses):
        """``step_breakdown`` of the summary: n split steps after an untimed one (which traces the
        split functions); each rank's means, gathered (a collective: every rank calls it)."""
        watchdog.outside_steps("tracing the split step")    # its first step traces: the long limit
        self._split_functions()
        rows, sent = [], []
        for k in range(n + 1):
            loss_v, parts, nbytes = self._split_step(it)
            step = int(self.global_step.numpy())
            watchdog.step_done(step)
            if not math.isfinite(loss_v) and not self.config.amp:
                self._diverged(step, f"the training loss is {loss_v}")
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

    def inference(self):
        """Timed forward passes over the test data (warm-up batches excluded)."""
        c = self.config
        times, n = [], 0
        for i, (inputs, _) in enumerate(self.task.eval_dataset()):
            t0 = time.perf_counter()
            self.predict(inputs).numpy()
            if i >= c.benchmark_warmup_steps:
                times.append(time.perf_counter() - t0)
                n += 1
            if c.benchmark_steps and n >= c.benchmark_steps:
                break
        batch = self.task.global_eval_batch
        summary = self._summary("inference", len(times), float(np.sum(times)), {}, [], False,
                                step_times=times, batch=batch)
        return summary

    def _summary(self, mode, timed_steps, timed_seconds, metrics, losses, interrupted, step_times=None,
                 batch=None, checkpoint=None, evaluated=None, breakdown=None, extra=None):
        watchdog.outside_steps("the summary (allreduce of the timed seconds, provenance)")
        batch = batch or self.task.global_batch
        # Per-rank times differ a little; report the slowest rank (a synchronous data-parallel
        # job goes at the pace of its slowest rank).
        timed_seconds = float(self.dist.allreduce_max(np.array([timed_seconds], np.float64))[0])
        nodes = provenance.nodes(self.dist.allgather_object)       # a collective: every rank
        out = dict(mode=mode, model=self.config.model, world_size=self.dist.size, global_batch_size=batch,
                   step=int(self.global_step.numpy()), epoch=int(self.epoch.numpy()),
                   timed_steps=timed_steps, excluded_warmup_steps=self.config.benchmark_warmup_steps,
                   throughput_samples_per_s=(timed_steps * batch / timed_seconds) if timed_seconds > 0 else None,
                   mean_step_time_ms=(1000.0 * timed_seconds / timed_steps) if timed_steps else None,
                   interrupted=interrupted, summary_version=SUMMARY_VERSION,
                   eval_step=self._eval_step if metrics else None,
                   checkpoint=checkpoint or self._saved_path)
        if mode == "evaluate":
            out["evaluated_checkpoint"] = evaluated
        self._drift_hook()
        if sum(int(np.prod(v.shape)) for v in self.model.weights) <= DIGEST_MAX_PARAMS:
            out["weights_digest"] = self.weights_digest()
            if self.dist.size > 1:
                # every rank's whole weights (its model-parallel shards too), for bitwise comparisons
                out["replica_weight_digests"] = self.dist.allgather_object(out["weights_digest"])
        drifted = False
        if self.dist.size > 1:
            # Data parallelism must keep replicas identical, at any model size: a sampled digest.
            out["replica_state_digests"] = self.dist.allgather_object(self.replica_digest())
            drifted = len(set(out["replica_state_digests"])) > 1
        # Nothing model-parallel: every weight is replicated, so the full digests must be equal too
        # (the sampled check reads a few rows of each variable only).
        full = out.get("replica_weight_digests") if not self._local_ids and not self._de else None
        full_drifted = bool(full) and len(set(full)) > 1
        if step_times:
            out["p50_step_time_ms"] = 1000.0 * float(np.percentile(step_times, 50))
        if breakdown is not None:
            # the split step against the timed (fused) step of this same run: a projection
            # calibrates on the timed step, the split step only apportions it
            timed_ms = out["mean_step_time_ms"]
            out["step_breakdown"] = dict(breakdown, timed_step_ms=timed_ms, split_over_timed=(
                breakdown["mean"]["step_ms"] / timed_ms if timed_ms else None))
        if losses:
            out["first_loss_step"], out["first_loss"] = losses[0]
            out["final_loss_step"], out["final_loss"] = losses[-1]
        out.update(metrics)
        out.update(extra or {})
        if self.dist.is_chief:          # only rank 0 writes the record: the others skip git and scontrol
            out["provenance"] = provenance.collect(nodes)
        self.log.summary(**out)
        if drifted:                     # recorded, then the run fails: its weights are not one model
            digests = out["replica_state_digests"]
            self._diverged(out["step"], f"the replicas drifted apart (sampled digests per rank: "
                                        f"{', '.join(d[:8] for d in digests)})", advice=DRIFT_ADVICE)
        if full_drifted:
            self._diverged(out["step"], f"the replicas drifted apart (full weight digests per rank: "
                                        f"{', '.join(d[:8] for d in full)}; the sampled check passed)",
                           advice=DRIFT_ADVICE)
        return out

    def _drift_hook(self):
        """Test-only (:data:`DRIFT_HOOK_ENV`): one unsampled row of this rank's largest replicated weight nudged."""
        import os
        value = os.environ.get(DRIFT_HOOK_ENV, "")
        if not value or int(value) != self.dist.rank:
            return
        v = max(self._replicated_weights, key=lambda w: int(w.shape[0]) if w.shape.rank else 0)
        n = int(v.shape[0]) if v.shape.rank else 0
        sampled = set(np.linspace(0, n - 1, REPLICA_SAMPLE_ROWS).round().astype(np.int64).tolist())
        row = next((r for r in range(n) if r not in sampled), None)
        if n <= REPLICA_SAMPLE_ROWS or row is None:
            raise RuntimeError(f"{DRIFT_HOOK_ENV}={value}: no replicated weight has an unsampled row")
        v.scatter_nd_add([[row]], tf.ones([1] + v.shape.as_list()[1:], v.dtype) * 1e-3)



def _all_finite(grads):
    """One scalar bool: every gradient (IndexedSlices: its values) is finite."""
    checks = [tf.reduce_all(tf.math.is_finite(g.values if isinstance(g, tf.IndexedSlices) else g))
              for g in grads if g is not None]
    return tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)


def _update_loss_scale(optimizer, finite):
    """Keras's dynamic loss-scale update (grow after its growth steps, halve on an overflow), fed the
    decision ``finite`` that every rank shares instead of this rank's gradients. Its state object
    (``LossScaleOptimizer._loss_scale``: run here on 2.15.1, read in the Keras 2 / tf-keras sources)
    checks the gradients it is given, so it is handed one scalar, finite exactly when ``finite`` holds."""
    state = getattr(optimizer, "_loss_scale", None)
    if not hasattr(state, "update"):
        raise TypeError(f"--amp: this Keras's LossScaleOptimizer keeps no dynamic loss-scale state "
                        f"(_loss_scale is {type(state).__name__})")
    state.update([tf.where(finite, 0.0, np.inf)])
