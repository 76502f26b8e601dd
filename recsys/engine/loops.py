"""The training and evaluation loops: epochs of fused-step calls, checkpoints, evaluations, the stop.

Train: after each epoch (and after the last step) a checkpoint, then an evaluation, judged for the
best model and the early stop. The checkpoint comes first so that an evaluation that fails (bad
test data) loses no trained step. With a validation mapping (recsys.models.tasks.validation_mapping)
those evaluations are validation's, and after the last one the test mapping is evaluated once, with
the best evaluation's weights (the summary's ``test_eval``). The loops own the order of things;
what a step, a guard, a checkpoint or the summary is, each collaborator owns (recsys.engine).
"""
from __future__ import annotations

import time

import numpy as np
import tensorflow as tf

from recsys.checkpoints.atomic import StopRequest
from recsys.engine.best import BestModel
from recsys.engine.checkpoints import Checkpoints
from recsys.engine.guards import Guards
from recsys.engine.step import Step
from recsys.engine.summary import Summary
from recsys.errors import DataError, data_error_message
from recsys.monitoring import watchdog
from recsys.monitoring.logger import process_start
from recsys.monitoring.tensorboard import ProfileWindow, optimizer_figures


class StopTraining(Exception):
    """A rank was asked to stop (SIGUSR2): every rank leaves the epoch loop at the same step."""


class Loops:
    """``train``, ``evaluate`` and ``evaluate_checkpoint`` over the engine's collaborators."""

    def __init__(self, step: Step, guards: Guards, checkpoints: Checkpoints, best: BestModel,
                 summary: Summary, profiler: ProfileWindow):
        self.step, self.guards, self.checkpoints, self.best = step, guards, checkpoints, best
        self.summary, self.profiler = summary, profiler
        self.state = step.state
        s = self.state
        self.config, self.task, self.dist, self.log = s.config, s.task, s.dist, s.log
        self.eval_step = None                    # step of the last evaluation (None: none yet)

    def train(self) -> dict:
        """Epoch loop; after each epoch (and after the last step) a checkpoint, then an evaluation.

        The summary reports the evaluation and the checkpoint of the last step.
        A non-finite loss stops the run (:class:`DivergedError`) without writing a checkpoint.
        """
        c, dist, s, guards = self.config, self.dist, self.state, self.guards
        stop = StopRequest()
        max_steps = c.max_steps or None
        steps_per_epoch = self.task.steps_per_epoch()
        total = min(max_steps or steps_per_epoch * c.epochs, steps_per_epoch * c.epochs)
        global_batch = self.task.global_batch
        s.broadcast_initial_state()
        s.warn_schedule(total)
        metrics, timed_steps, timed_seconds = {}, 0, 0.0
        if self.checkpoints.restored_epoch_end and self.best.best.last_step != s.step():
            # Restored from an epoch's checkpoint whose evaluation its run did not finish: the count
            # goes on from that evaluation, as in a run that was never stopped.
            metrics = self.evaluate(log=True)
            self.best.judge(metrics)
        losses = []                      # (step, loss) of the first and the last step of this run
        interrupted = False
        guards.nonfinite_in_a_row = 0
        # Warm-up is counted per attempt (steps this process trained), not by the global step: a
        # restored or requeued attempt traces its functions again, and its first steps are as slow.
        attempt_steps, first_timed = 0, None
        try:
            while int(s.epoch.numpy()) < c.epochs and not self.best.stop:
                if max_steps and s.step() >= max_steps:
                    break
                epoch = int(s.epoch.numpy())
                skip = int(s.step_in_epoch.numpy())
                ds = self.task.train_dataset(epoch)
                if skip:
                    ds = ds.skip(skip)
                t_last, n_last = time.perf_counter(), 0
                it = iter(ds)
                while True:
                    before = s.step()
                    if max_steps and before >= max_steps:
                        break
                    # A call ends at the next log step and at --max-steps: the guard's weight check,
                    # the step record and the end of the run stay where one step per call puts them.
                    spc = self.step.steps_per_call
                    n = min(spc, c.log_every - before % c.log_every, (max_steps - before) if max_steps else spc)
                    t0 = time.perf_counter()
                    if stop.requested:
                        s.stop_flag.assign(1.0)
                    n = self.profiler.limit(before, n)         # one step per call in the profiled window
                    with self.profiler.steps(before, n):
                        step_losses, stop_any = self.train_call(it, n)
                    if not step_losses:
                        break                                   # the epoch's data has ended
                    watchdog.step_done(before + len(step_losses))
                    if self.checkpoints.startup_s is None:
                        self.checkpoints.startup_s = round(time.time() - process_start(), 3)
                    per_step = (time.perf_counter() - t0) / len(step_losses)
                    for step, loss_v in enumerate(step_losses, start=before + 1):
                        guards.check_loss(step, loss_v, losses)
                        losses[1:] = [(step, loss_v)]    # keeps the first, replaces the last
                        n_last += 1
                        if step % c.log_every == 0 or (max_steps and step >= max_steps):
                            guards.check_weights(step, loss_v, dense_only=True)
                            now = time.perf_counter()
                            self.log.step(step, epoch, loss_v, n_last * global_batch / max(now - t_last, 1e-9),
                                          total_steps=total, lr=s.current_lr(),
                                          step_time_ms=1000.0 * (now - t_last) / n_last,
                                          **optimizer_figures(s.groups, s.loss_scaler))
                            t_last, n_last = now, 0
                        attempt_steps += 1
                        if attempt_steps > c.benchmark_warmup_steps:
                            first_timed = step if first_timed is None else first_timed
                            timed_steps += 1
                            timed_seconds += per_step
                    if stop_any > 0:      # every rank sees the same reduced flag
                        interrupted = True
                        raise StopTraining
                at_max = max_steps and s.step() >= max_steps
                if at_max and int(s.step_in_epoch.numpy()) < steps_per_epoch:
                    break       # mid-epoch: the final checkpoint and evaluation follow the loop
                guards.check_final_loss(losses)
                guards.check_weights(s.step(), losses[-1][1] if losses else None)
                watchdog.outside_steps("the epoch's checkpoint and evaluation")
                s.end_epoch()
                self.checkpoints.save("epoch")
                metrics = self.evaluate(log=True)
                self.best.judge(metrics)
            if self.eval_step != s.step():
                # The run ended between evaluations (--max-steps, or a restore of the final step).
                watchdog.outside_steps("the final checkpoint and evaluation")
                guards.check_final_loss(losses)
                guards.check_weights(s.step(), losses[-1][1] if losses else None)
                self.checkpoints.save("end")
                metrics = self.evaluate(log=True)
                self.best.judge(metrics)
        except StopTraining:
            self.checkpoints.save("signal")
            if dist.is_chief:
                self.log.info("checkpoint saved on signal")
        finally:
            stop.restore_handlers()
            self.profiler.close()
        extra = dict(self.best.fields(), first_timed_step=first_timed)
        if self.task.eval_mapping != "test":
            # interrupted: the requeued attempt finishes the training and evaluates the test rows
            extra["test_eval"] = None if interrupted else self.evaluate_test()
        return self.summary.write("train", timed_steps, timed_seconds, metrics, losses, interrupted,
                                  eval_step=self.eval_step, extra=extra)

    def train_call(self, it, n: int) -> tuple[list[float], float]:
        """Up to ``n`` training steps on the batches of iterator ``it``: ``([loss per step], stop flag)``,
        no loss when the data has ended. One step per call (``steps_per_call`` 1, and every run of more
        than one rank) is the fused step fed from Python; more run in one compiled loop
        (:meth:`recsys.engine.step.Step._train_steps_impl`).

        A reader's data error (raised inside tf.data) becomes one line; before raising, the steps
        trained so far (those of this call before the bad batch included) are checkpointed: bad data
        found late loses nothing."""
        try:
            if self.step.steps_per_call == 1:
                watchdog.phase(watchdog.INPUT)
                try:
                    inputs, labels = next(it)
                except StopIteration:
                    return [], 0.0
                watchdog.phase(watchdog.FUSED_STEP)
                loss, stop_any = self.step.train_step(inputs, labels)
                # The stop flag is read every step anyway: reading the loss too costs no extra sync.
                return [float(loss.numpy())], float(stop_any.numpy())
            watchdog.phase(f"{n} training steps in one compiled call (input and step)")
            losses, stop_any = self.step.train_steps(it, tf.constant(n, tf.int32))
            return [float(v) for v in losses.numpy()], float(stop_any.numpy())
        except tf.errors.OpError as err:
            message = data_error_message(err)
            if message is None:
                raise
            if self.state.global_step.numpy() > 0 and self.checkpoints.saved_step != self.state.step():
                self.checkpoints.save("data-error")
            raise DataError(message) from None

    def evaluate(self, log: bool = False) -> dict:
        """Metrics of the task at the current step (on its ``eval_mapping``); non-finite predictions
        stop the run."""
        t0 = time.perf_counter()
        metrics = self._metrics()
        self.eval_step = self.state.step()
        if log:
            self.log.eval(self.state.step(), int(self.state.epoch.numpy()), metrics, mapping=self.task.eval_mapping)
            self.log.record("eval_time", seconds=time.perf_counter() - t0)
        return metrics

    def evaluate_test(self) -> dict:
        """The one evaluation of the test mapping at the end of a validation-judged training, with the
        best evaluation's weights (kept in memory; the last ones when this process holds none, said
        so): the summary's ``test_eval`` ``{mapping, weights, step, epoch, metrics}``, also logged as a
        ``test_eval`` record (not an ``eval`` one: the evaluation figures stay validation's)."""
        t0 = time.perf_counter()
        watchdog.outside_steps("the test evaluation")
        weights, step, epoch = self.best.use_best_weights()
        with self.task.evaluating("test"):
            metrics = self._metrics()
        out = dict(mapping="test", weights=weights, step=step, epoch=epoch, metrics=metrics)
        if self.dist.is_chief:
            why = (f"the best {self.best.best.metric} on validation" if weights == "best" else
                   "the last ones: the best validation evaluation came before this attempt and its weights "
                   "are not in memory")
            text = " ".join(f"{k} {v:.5f}" for k, v in metrics.items())
            self.log.info(f"test evaluated once with the weights of step {step} epoch {epoch} ({why}): {text}")
        self.log.record("test_eval", seconds=round(time.perf_counter() - t0, 3), **out)
        return out

    def _metrics(self) -> dict:
        """The task's metrics on its current mapping; non-finite predictions stop the run."""
        step = self.state.step()
        self.step.count_nonfinite, self.step.nonfinite = True, 0
        try:
            metrics = self.task.evaluate(self.step)
        except tf.errors.OpError as err:
            message = data_error_message(err)
            if message is None:
                raise
            raise DataError(message) from None
        finally:
            self.step.count_nonfinite = False
        nonfinite = int(self.dist.allreduce_sum(np.array([self.step.nonfinite], np.int64))[0])
        if nonfinite:
            self.guards.diverged(step, f"{nonfinite} non-finite predictions at evaluation")
        return {k: float(v) for k, v in metrics.items()}

    def evaluate_checkpoint(self) -> dict:
        """``--run-mode evaluate``: the metrics of the restored checkpoint, as a ``summary`` record
        (``evaluated_checkpoint`` names it; ``checkpoint``, the one written, stays null)."""
        metrics = self.evaluate(log=True)
        return self.summary.write("evaluate", 0, 0.0, metrics, [], False, batch=self.task.global_eval_batch,
                                  eval_step=self.eval_step, evaluated=self.checkpoints.restored_path)
