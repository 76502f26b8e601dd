"""The best evaluation and the early stop (--keep-best, --early-stop-patience) over a run's evaluations.

Every evaluation is judged here: a new best is recorded with the checkpoint that holds its step
(kept from pruning with --keep-best, and named in best.json), and spent patience ends the epoch
loop on every rank at once. The count itself is :class:`recsys.checkpoints.atomic.BestEvaluation`'s; this
object ties it to the run (its checkpoints, its ranks, its log).

When the evaluations are a validation mapping's, the best one's weights are also kept in memory (a
numpy copy on each rank, its model-parallel shards included: each rank copies its own), so that the
test mapping is evaluated once, at the end, with the weights the validation chose
(:meth:`BestModel.use_best_weights`), without a checkpoint to read back.
"""
from __future__ import annotations

import numpy as np

from recsys.checkpoints.atomic import BestEvaluation, write_best
from recsys.engine.checkpoints import Checkpoints
from recsys.engine.state import TrainState


class BestModel:
    """Judges evaluations; keeps the best one's checkpoint; says when to stop early."""

    def __init__(self, state: TrainState, checkpoints: Checkpoints):
        self.state, self.checkpoints = state, checkpoints
        self.config, self.dist, self.log = state.config, state.dist, state.log
        self.best: BestEvaluation = checkpoints.best
        # the best evaluation's weights (validation runs only): (step, epoch, [arrays in model.weights order])
        self.keep_weights = state.task.eval_mapping != "test"
        self.best_weights: tuple | None = None

    @property
    def stop(self) -> bool:
        """The patience ran out: the epoch loop ends."""
        return bool(self.best.stop)

    def restored(self, meta: dict) -> None:
        """A restored checkpoint's count goes on (its ``early_stop`` state); its best stays protected."""
        self.best.restored(meta.get("early_stop"))
        self.protect()

    def judge(self, metrics: dict) -> None:
        """Count an evaluation: a new best is recorded (its checkpoint kept with --keep-best and named
        in best.json); spent patience is logged and ends the epoch loop. Rank 0's value decides for
        every rank (one small collective): the metric is reduced already, and the stop must be one."""
        step, epoch = self.state.step(), int(self.state.epoch.numpy())
        value = metrics.get(self.best.metric)
        if self.dist.size > 1:
            value = self.dist.allgather_object(value)[0]
        checkpoint = self.checkpoints.path_of(step)
        counting = step > self.state.task.warmup_steps()        # patience counts from the warm-up's end
        improved = self.best.update(step, epoch, dict(metrics, **{self.best.metric: value}), checkpoint,
                                    counting=counting)
        if self.keep_weights and (improved or step == self.best.step):
            self._copy_weights()        # a new best, or a restored run evaluating its best step again
        if improved:
            self.protect()
            if self.config.keep_best and checkpoint and self.dist.is_chief:
                write_best(self.config.checkpoint_dir, self.best)
        if self.best.stop and self.dist.is_chief:
            b = self.best
            self.log.info(f"early stop at epoch {epoch} step {step}: {b.metric} has not beaten {b.value:.5f} "
                          f"(epoch {b.epoch} step {b.step}) for {b.since_best} evaluations "
                          f"(--early-stop-patience {b.patience})", early_stop=True, best_step=b.step,
                          best_value=b.value)

    def _copy_weights(self) -> None:
        """A numpy copy of this rank's weights (its shards too) at the current step."""
        self.best_weights = (self.state.step(), int(self.state.epoch.numpy()),
                             [np.array(v.numpy(), copy=True) for v in self.state.model.weights])

    def use_best_weights(self) -> tuple[str, int, int]:
        """Assign the best evaluation's kept weights to the model: ``("best", step, epoch)``; or, when
        this process holds none (a restored run whose best came before it and was not beaten since),
        keep the current ones: ``("last", step, epoch)``. Every rank answers alike (same judgements)."""
        if self.best_weights is None:
            return "last", self.state.step(), int(self.state.epoch.numpy())
        step, epoch, arrays = self.best_weights
        for variable, value in zip(self.state.model.weights, arrays):
            variable.assign(value)
        return "best", step, epoch

    def protect(self) -> None:
        """--keep-best: the best checkpoint is never pruned (the newest --keep-checkpoints are kept besides)."""
        checkpointer = self.checkpoints.checkpointer
        if checkpointer is not None and self.config.keep_best:
            checkpointer.protected = {self.best.checkpoint} if self.best.checkpoint else set()
            checkpointer.prune()            # the best before this one may go now

    def fields(self) -> dict:
        """The summary's ``best_eval`` (the best evaluation; the summary's own metrics are the last one's)
        and ``early_stopped`` (the epoch and step the patience ran out at, or null)."""
        b = self.best
        stopped = dict(step=b.last_step, epoch=int(self.state.epoch.numpy()), patience=b.patience) if b.stop else None
        return dict(best_eval=b.summary() if b.value is not None else None, early_stopped=stopped)
