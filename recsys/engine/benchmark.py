"""The timed runs: ``--run-mode benchmark`` (training steps, then the step breakdown) and ``inference``.

Their numbers are what a study projects from, so how a step is timed is decided here once: a timed
step runs from the end of the previous one to its loss read back, so the timed steps tile the timed
stretch without gaps (an input stall, or the bookkeeping between steps, is in some step).
"""
from __future__ import annotations

import math
import time

import numpy as np

from recsys.engine.breakdown import StepBreakdown
from recsys.engine.summary import Summary
from recsys.monitoring import watchdog
from recsys.monitoring.tensorboard import ProfileWindow, optimizer_figures


class Benchmark:
    """Warm-up and timed steps on a repeating dataset; timed forward passes; the breakdown after them."""

    def __init__(self, breakdown: StepBreakdown, summary: Summary, profiler: ProfileWindow):
        self.breakdown, self.summary, self.profiler = breakdown, summary, profiler
        self.step, self.guards = breakdown.step, breakdown.guards
        self.state = self.step.state
        self.config, self.task, self.log = self.state.config, self.state.task, self.state.log

    def benchmark(self) -> dict:
        """Warm-up steps, then timed training steps on a repeating dataset (warm-up excluded); then,
        with ``--breakdown-steps N``, N split steps whose phases are timed one by one (step_breakdown).

        A timed step runs from the end of the previous one (before ``next(it)``: input stalls count)
        to its loss read back: the timed steps tile the timed stretch without gaps, so a stall
        anywhere in the loop (the bookkeeping and logging between steps too) is in some step."""
        c, s = self.config, self.state
        s.broadcast_initial_state()
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
                loss, _ = self.step.train_step(inputs, labels)
                loss_v = float(loss.numpy())      # step boundary: wait for the device
            watchdog.step_done(i + 1)
            t1 = time.perf_counter()
            elapsed, t0 = t1 - t0, t1
            if i >= warm:
                times.append(elapsed)
            if not math.isfinite(loss_v) and not c.amp:
                self.guards.diverged(i + 1, f"the training loss is {loss_v}")
            losses[1:] = [(i + 1, loss_v)]            # keeps the first, replaces the last
            if (i + 1) % c.log_every == 0:
                # this step's own rate (warm-up included), not a division by a placeholder time
                self.log.step(i + 1, 0, loss_v, self.task.global_batch / max(elapsed, 1e-9),
                              total_steps=warm + steps, step_time_ms=1000.0 * elapsed,
                              **optimizer_figures(s.groups, s.loss_scaler))
        self.profiler.close()
        breakdown = self.breakdown.measure(it, c.breakdown_steps, losses) if c.breakdown_steps > 0 else None
        return self.summary.write("benchmark", len(times), float(np.sum(times)), {}, losses, False,
                                  step_times=times, breakdown=breakdown)

    def inference(self) -> dict:
        """Timed forward passes over the test data (warm-up batches excluded)."""
        c = self.config
        times, n = [], 0
        for i, (inputs, _) in enumerate(self.task.eval_dataset()):
            t0 = time.perf_counter()
            self.step.predict(inputs).numpy()
            if i >= c.benchmark_warmup_steps:
                times.append(time.perf_counter() - t0)
                n += 1
            if c.benchmark_steps and n >= c.benchmark_steps:
                break
        batch = self.task.global_eval_batch
        return self.summary.write("inference", len(times), float(np.sum(times)), {}, [], False,
                                  step_times=times, batch=batch)
