"""The train state: the built model, its optimizer groups, the step counters, and which weights are what.

Built once (the model traced on a sample batch, every optimizer's slots made) so that the step, the
guards and the checkpoints share one answer to "which variables are replicated, which are this
rank's model-parallel shards, which are seeded tables"; and the one place that makes every rank
start from the same weights (:meth:`TrainState.broadcast_initial_state`).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from recsys.configuration.train_config import TrainConfig
from recsys.embeddings.group import EmbeddingGroup, broadcast, uses_distributed_embeddings


def inner_optimizer(opt):
    """The optimizer a LossScaleOptimizer (--amp) wraps, or ``opt`` itself."""
    return opt.inner_optimizer if isinstance(opt, tf.keras.mixed_precision.LossScaleOptimizer) else opt


class TrainState:
    """The model, its optimizer groups ``[(name, optimizer, variables)]``, the counters and the weight sets."""

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
        self.stop_flag = tf.Variable(0.0, trainable=False, name="stop_requested")  # set by SIGUSR2
        self._build()

    def _build(self) -> None:
        inputs, _ = self.task.sample_batch()
        self.model(inputs, training=False)
        # Variable lists are fixed once the model is built: resolve them outside any tf.function.
        self.groups = [(n, opt, list(var_fn())) for n, opt, var_fn in self.groups]
        for _, opt, variables in self.groups:
            inner_optimizer(opt).build(variables)
        self.local_ids = self.task.local_variable_ids(self.model)
        self.seeded_ids, self.table_seeds = self.task.seeded_tables(self.model)
        self.de = uses_distributed_embeddings(self.model)   # its tape and broadcast (docs/embeddings.md)
        if self.de and self.dist.is_chief:     # what DE built, per rank (checked equal to the placement's plan)
            from recsys.embeddings.de_adapter import built_line
            for m in self.model.submodules:
                if isinstance(m, EmbeddingGroup) and m.implementation == "distributed-embeddings":
                    self.log.info(built_line(m.name, m._dist))
        # The divergence guard's weight checks: the dense (replicated) weights at every log interval,
        # every weight before a checkpoint and an evaluation.
        tables = {id(v) for m in self.model.submodules if isinstance(m, EmbeddingGroup) for v in m.variables}
        floats = [v for v in self.model.weights if v.dtype.is_floating]
        self.dense_weights = [v for v in floats if id(v) not in tables]
        self.all_weights = floats
        # What data parallelism keeps equal on every rank: all but this rank's model-parallel shards,
        # and the loss scale (the replica check, recsys.engine.guards).
        self.replicated_weights = [v for v in self.model.weights if id(v) not in self.local_ids]

    def variables(self) -> list:
        """Every trained variable, in the optimizer groups' order (the gradients' order)."""
        return [v for _, _, variables in self.groups for v in variables]

    def state_variables(self) -> list:
        out = list(self.model.variables)
        for _, opt, _ in self.groups:
            out += list(opt.variables)
        return out

    def checkpoint(self) -> tf.train.Checkpoint:
        """What a checkpoint holds (its keys are the checkpoints' format: do not rename them)."""
        return tf.train.Checkpoint(model=self.model, global_step=self.global_step, epoch=self.epoch,
                                   step_in_epoch=self.step_in_epoch,
                                   **{f"optimizer_{n}": o for n, o, _ in self.groups})

    def counters(self) -> dict:
        return dict(global_step=self.global_step, epoch=self.epoch, step_in_epoch=self.step_in_epoch)

    def step(self) -> int:
        return int(self.global_step.numpy())

    def broadcast_initial_state(self) -> None:
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
        seeded = self.seeded_ids
        if seeded:
            seeds = np.asarray(self.table_seeds, np.int64)
            every = np.asarray(self.dist.allgather(seeds[None, :]))
            if (every != seeds[None, :]).any():
                self.log.info("embedding table seeds differ across ranks: broadcasting the tables from rank 0")
                seeded = set()
        shared = [v for v in self.model.variables if id(v) not in self.local_ids and id(v) not in seeded]
        if self.de:          # distributed-embeddings' own: every variable but its shards, as `shared`
            broadcast(self.model.variables, root_rank=0)
        else:
            self.dist.broadcast_variables(shared, root_rank=0)
        if self.dist.is_chief:
            nbytes = lambda vs: sum(int(v.shape.num_elements()) * v.dtype.size for v in vs)  # noqa: E731
            self.log.record("initial_state", broadcast_variables=len(shared), broadcast_bytes=nbytes(shared),
                            seeded_table_bytes=nbytes(v for v in self.model.variables if id(v) in seeded),
                            local_bytes=nbytes(v for v in self.model.variables if id(v) in self.local_ids))

    def end_epoch(self) -> None:
        self.epoch.assign_add(1)
        self.step_in_epoch.assign(0)

    def current_lr(self) -> float | None:
        _, opt, _ = self.groups[0]
        lr = opt.learning_rate
        try:
            return float(lr.numpy() if hasattr(lr, "numpy") else lr)
        except Exception:
            return None

    def warn_schedule(self, total: int) -> None:
        """Warn when a learning rate decays to 0 before the run's last step (later steps learn nothing)."""
        for name, opt, _ in self.groups:
            schedule = getattr(inner_optimizer(opt), "_learning_rate", None)
            end = getattr(schedule, "zero_from_step", lambda: None)()
            if end is not None and end < total:
                self.log.info(f"warning: the learning rate of optimizer '{name}' reaches 0 at step {end}, "
                              f"before the run ends at step {total}: later steps do not learn "
                              f"(see --decay-start-step / --decay-steps)", warning="lr_schedule_ends_early",
                              lr_zero_step=end, total_steps=total)
