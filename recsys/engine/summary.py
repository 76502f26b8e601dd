"""The ``summary`` record every run ends with (docs/engine-log.md): throughput, losses, metrics,
digests, provenance; and the last replica check, on the weights the run hands over.

It is a collective (every rank calls it): the timed seconds are the slowest rank's, the digests
and node provenance are gathered; only rank 0 writes the record. Replicas found apart here are
recorded first, then fail the run: its weights are not one model.
"""
from __future__ import annotations

import numpy as np

from recsys.monitoring import provenance

from recsys.configuration.train_config import CHECKPOINT_MODES
from recsys.engine.checkpoints import Checkpoints
from recsys.engine.guards import DRIFT_ADVICE, Guards
from recsys.monitoring import watchdog

# Full weight digests (bitwise run comparisons in the summary) only for models up to this size.
DIGEST_MAX_PARAMS = 50_000_000
# Version of the `summary` log record (docs/engine-log.md); 2: throughput from the slowest
# rank's timed seconds (1: their mean), and `provenance`; 3: a benchmark's timed steps include
# their input wait, and `step_breakdown` (--breakdown-steps).
SUMMARY_VERSION = 3


class Summary:
    """Writes a run's ``summary`` record (:meth:`write`)."""

    def __init__(self, guards: Guards, checkpoints: Checkpoints):
        self.guards, self.checkpoints = guards, checkpoints
        self.state = guards.state
        s = self.state
        self.config, self.task, self.dist, self.log = s.config, s.task, s.dist, s.log

    def write(self, mode: str, timed_steps: int, timed_seconds: float, metrics: dict, losses: list,
              interrupted: bool, step_times: list | None = None, batch: int | None = None,
              eval_step: int | None = None, evaluated: str | None = None, breakdown: dict | None = None,
              extra: dict | None = None) -> dict:
        """The record (returned too); ``eval_step``: the step of the last evaluation, named with ``metrics``."""
        watchdog.outside_steps("the summary (allreduce of the timed seconds, provenance)")
        s, dist, guards = self.state, self.dist, self.guards
        batch = batch or self.task.global_batch
        # Per-rank times differ a little; report the slowest rank (a synchronous data-parallel
        # job goes at the pace of its slowest rank).
        timed_seconds = float(dist.allreduce_max(np.array([timed_seconds], np.float64))[0])
        nodes = provenance.nodes(dist.allgather_object)       # a collective: every rank
        out = dict(mode=mode, model=self.config.model, world_size=dist.size, global_batch_size=batch,
                   step=s.step(), epoch=int(s.epoch.numpy()),
                   timed_steps=timed_steps, excluded_warmup_steps=self.config.benchmark_warmup_steps,
                   throughput_samples_per_s=(timed_steps * batch / timed_seconds) if timed_seconds > 0 else None,
                   mean_step_time_ms=(1000.0 * timed_seconds / timed_steps) if timed_steps else None,
                   interrupted=interrupted, summary_version=SUMMARY_VERSION,
                   eval_step=eval_step if metrics else None,
                   checkpoint=self.checkpoints.saved_path)
        if mode in CHECKPOINT_MODES:
            out["evaluated_checkpoint"] = evaluated
        guards.drift_hook()
        if sum(int(np.prod(v.shape)) for v in s.model.weights) <= DIGEST_MAX_PARAMS:
            out["weights_digest"] = guards.weights_digest()
            if dist.size > 1:
                # every rank's whole weights (its model-parallel shards too), for bitwise comparisons
                out["replica_weight_digests"] = dist.allgather_object(out["weights_digest"])
        drifted = False
        if dist.size > 1:
            # Data parallelism must keep replicas identical, at any model size: a sampled digest.
            out["replica_state_digests"] = dist.allgather_object(guards.replica_digest())
            drifted = len(set(out["replica_state_digests"])) > 1
        # Nothing model-parallel: every weight is replicated, so the full digests must be equal too
        # (the sampled check reads a few rows of each variable only).
        full = out.get("replica_weight_digests") if not s.local_ids and not s.de else None
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
        if dist.is_chief:          # only rank 0 writes the record: the others skip git and scontrol
            out["provenance"] = provenance.collect(nodes)
        self.log.summary(**out)
        if drifted:                     # recorded, then the run fails: its weights are not one model
            digests = out["replica_state_digests"]
            guards.diverged(out["step"], f"the replicas drifted apart (sampled digests per rank: "
                                         f"{', '.join(d[:8] for d in digests)})", advice=DRIFT_ADVICE)
        if full_drifted:
            guards.diverged(out["step"], f"the replicas drifted apart (full weight digests per rank: "
                                         f"{', '.join(d[:8] for d in full)}; the sampled check passed)",
                            advice=DRIFT_ADVICE)
        return out
