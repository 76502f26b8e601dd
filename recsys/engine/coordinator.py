"""The engine: one run's collaborators built in order and wired together, and the verbs the entry point calls.

One :class:`Engine` drives a :class:`recsys.models.tasks.Task` (which knows its model, data and
metric). It holds no training logic of its own: the train state (recsys.engine.state), the step
with --amp's loss scaling (step), the divergence guards (guards), checkpoints (checkpoints), the
best model and early stop (best), the loops (loops), the summary (summary), and the benchmark with
its step breakdown (benchmark, breakdown) each own their part and their state; ``Engine`` builds
them once and forwards ``train``, ``evaluate``, ``benchmark``, ``inference``, ``write_predictions``
(predict), ``restore`` and ``save`` to the one that owns each.
"""
from __future__ import annotations

from recsys.checkpoints.atomic import BestEvaluation
from recsys.configuration.train_config import TrainConfig
from recsys.engine.benchmark import Benchmark
from recsys.engine.best import BestModel
from recsys.engine.breakdown import StepBreakdown
from recsys.engine.checkpoints import Checkpoints
from recsys.engine.guards import Guards
from recsys.engine.loops import Loops
from recsys.engine.predict import Predictions
from recsys.engine.state import TrainState
from recsys.engine.step import Step
from recsys.engine.summary import Summary
from recsys.monitoring.tensorboard import ProfileWindow


class Engine:
    """A thin coordinator over the run's collaborators (attributes named for each)."""

    def __init__(self, config: TrainConfig, task, dist, logger):
        self.config, self.task, self.dist, self.log = config, task, dist, logger
        self.profiler = ProfileWindow.of(config, dist.rank)   # --profile-steps (recsys.monitoring.tensorboard)
        self.state = TrainState(config, task, dist, logger)
        # the best evaluation and the early stop's count (--early-stop-patience, --keep-best)
        self.best = BestEvaluation(task.watched_metric, config.early_stop_patience, config.early_stop_min_delta)
        self.step = Step(self.state)
        self.checkpoints = Checkpoints(self.state, self.best)
        self.guards = Guards(self.state, self.checkpoints.checkpointer)
        self.best_model = BestModel(self.state, self.checkpoints)
        self.summary = Summary(self.guards, self.checkpoints)
        self.loops = Loops(self.step, self.guards, self.checkpoints, self.best_model, self.summary, self.profiler)
        self.breakdown = StepBreakdown(self.step, self.guards)
        self.bench = Benchmark(self.breakdown, self.summary, self.profiler)
        self.predictions = Predictions(self.step, self.summary)
        s = self.state
        self.model, self.groups, self.loss_scaler = s.model, s.groups, s.loss_scaler
        self.global_step, self.epoch, self.step_in_epoch = s.global_step, s.epoch, s.step_in_epoch
        self.checkpointer = self.checkpoints.checkpointer

    # --- the state ----------------------------------------------------------------
    def state_variables(self) -> list:
        return self.state.state_variables()

    def broadcast_initial_state(self) -> None:
        self.state.broadcast_initial_state()

    def predict(self, inputs):
        return self.step.predict(inputs)

    def weights_digest(self) -> str:
        return self.guards.weights_digest()

    def replica_digest(self) -> str:
        return self.guards.replica_digest()

    # --- checkpoints ----------------------------------------------------------------
    def restore(self, path: str | None = None) -> dict:
        """The latest checkpoint (or ``path``) restored, made every rank's, its early-stop count resumed."""
        meta = self.checkpoints.restore(path)
        self.state.broadcast_initial_state()
        self.best_model.restored(meta)
        step, epoch = self.state.step(), int(self.epoch.numpy())
        # Training: steps after this one that an earlier attempt logged are trained (and logged) again.
        then = f"; training continues at step {step + 1}" if self.config.mode == "train" else ""
        self.log.info(f"restored {meta['path']} at step {step} epoch {epoch}{then}", checkpoint=meta["path"],
                      restored_step=step, restored_epoch=epoch)
        return meta

    def save(self, reason: str) -> str | None:
        return self.checkpoints.save(reason)

    # --- the run modes ----------------------------------------------------------------
    def train(self) -> dict:
        return self.loops.train()

    def evaluate(self, log: bool = False) -> dict:
        return self.loops.evaluate(log=log)

    def evaluate_checkpoint(self) -> dict:
        return self.loops.evaluate_checkpoint()

    def benchmark(self) -> dict:
        return self.bench.benchmark()

    def inference(self) -> dict:
        return self.bench.inference()

    def write_predictions(self) -> dict:
        """--run-mode predict: the restored checkpoint's scores of the test rows, in --predictions."""
        return self.predictions.write(self.checkpoints.restored_path)
