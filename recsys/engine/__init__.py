"""The training engine shared by all models: a thin :class:`Engine` over collaborators, one module each.

``state`` (the built model, optimizer groups, counters, which weights are what; the initial
broadcast), ``step`` (loss, gradients, the exchange across ranks, --amp's loss scaling, apply),
``guards`` (explosion, non-finite loss and weights, replica digests), ``checkpoints``, ``best``
(best model and early stop), ``loops`` (train and evaluate), ``summary`` (the run's last record),
``benchmark`` and ``breakdown`` (timed steps, the split step), and ``coordinator`` (``Engine``,
which builds them and forwards the run modes). docs/architecture.md draws the order.
"""
from recsys.engine.breakdown import BREAKDOWN_METHOD, BREAKDOWN_PHASES, BREAKDOWN_VERSION
from recsys.engine.coordinator import Engine
from recsys.engine.guards import (AMP_LOSS_SCALE_FLOOR, AMP_MAX_SKIPPED_STEPS, DRIFT_ADVICE, DRIFT_HOOK_ENV,
                                  EXPLOSION_LOSS_FACTOR, EXPLOSION_MIN_LOSS, REPLICA_SAMPLE_ROWS)
from recsys.engine.loops import StopTraining
from recsys.engine.step import NONFINITE_HOOK_ENV
from recsys.engine.summary import DIGEST_MAX_PARAMS, SUMMARY_VERSION

__all__ = ["Engine", "StopTraining", "REPLICA_SAMPLE_ROWS", "DIGEST_MAX_PARAMS", "SUMMARY_VERSION",
           "NONFINITE_HOOK_ENV", "DRIFT_HOOK_ENV", "DRIFT_ADVICE", "AMP_MAX_SKIPPED_STEPS", "AMP_LOSS_SCALE_FLOOR",
           "EXPLOSION_LOSS_FACTOR", "EXPLOSION_MIN_LOSS", "BREAKDOWN_PHASES", "BREAKDOWN_VERSION", "BREAKDOWN_METHOD"]
