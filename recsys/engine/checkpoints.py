"""The run's checkpoints: what was written last and what this process started from.

The loops, the best model and the summary all ask "which checkpoint holds this step?": the one
written last (:attr:`Checkpoints.saved_path`) or the one restored (:attr:`Checkpoints.restored_path`);
this object is the one place that knows. Replicated weights: rank 0 writes; model-parallel tables:
every rank its shard (recsys.checkpoints.sharded).
"""
from __future__ import annotations

import time

from recsys.checkpoints.atomic import BestEvaluation, note_attempt
from recsys.engine.state import TrainState, inner_optimizer


class Checkpoints:
    """Save and restore of the train state (no checkpointer without --checkpoint-dir: saving is a no-op)."""

    def __init__(self, state: TrainState, best: BestEvaluation):
        self.state, self.best = state, best
        self.config, self.dist, self.log = state.config, state.dist, state.log
        self.saved_step = self.saved_path = None    # step and path of the last checkpoint written
        self.restored_path = None                   # the checkpoint this process started from
        self.restored_epoch_end = False             # it was saved at an epoch's end (evaluated there)
        self.restored_step = None
        self.startup_s = None                       # process start -> first trained step of this process
        self.checkpointer = None
        if self.config.checkpoint_dir:
            from recsys.checkpoints.sharded import make_checkpointer
            self.checkpointer = make_checkpointer(
                self.config, state.checkpoint(), state.model, self.dist, state.counters(),
                optimizers=[inner_optimizer(o) for _, o, _ in state.groups], log=self.log)

    def restore(self, path: str | None = None) -> dict:
        """Read a checkpoint (the latest without ``path``) into the train state; its metadata."""
        meta = self.checkpointer.restore(path)
        self.restored_epoch_end = int(meta.get("step_in_epoch", 0) or 0) == 0 and int(meta.get("step", 0) or 0) > 0
        self.restored_step = int(meta.get("step", 0) or 0)
        self.restored_path = meta["path"]
        return meta

    def save(self, reason: str) -> str | None:
        """A checkpoint of the current step (every rank calls it); its path, None without a checkpointer."""
        if self.checkpointer is None:
            return None
        s = self.state
        t0 = time.time()
        path = self.checkpointer.save(s.step(), epoch=int(s.epoch.numpy()),
                                      step_in_epoch=int(s.step_in_epoch.numpy()), reason=reason,
                                      early_stop=self.best.state())
        self.dist.barrier()
        self.saved_step, self.saved_path = s.step(), path
        if self.dist.is_chief:
            self.log.record("checkpoint", path=path, step=s.step(), reason=reason)
            note_attempt(self.config.checkpoint_dir, startup_s=self.startup_s, checkpoint_s=round(time.time() - t0, 3),
                         step=self.saved_step, reason=reason)
        return path

    def path_of(self, step: int) -> str | None:
        """The checkpoint that holds ``step``: written by this process, or restored, or none."""
        return (self.saved_path if self.saved_step == step else
                self.restored_path if self.restored_step == step else None)
