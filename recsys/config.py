"""The typed training configuration: built once from the parsed command line, checked there.

:class:`TrainConfig` keeps the argparse destination names as field names (so
``cfg.batch_size`` reads as the flag ``--batch-size``). :meth:`TrainConfig.from_args`
fills flags left unset from the model's defaults (recsys.models.defaults),
checks everything that needs no TensorFlow and raises
:class:`recsys.errors.EngineError` with a one-line message naming the flag.
Pure Python: a typo costs no TensorFlow start-up.

A flag added to ``recsys.train.build_parser`` needs a field here too;
``from_args`` refuses a parsed namespace with an unknown destination.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import List, Optional

from recsys.distributed import launcher_world_size
from recsys.errors import EngineError
from recsys.models.defaults import resolved

# Share of the run before the synthetic DLRM schedule ends its warm-up / starts its decay
# (the reference's 8000 / 48000 of about 72000 steps).
SYNTHETIC_WARMUP_SHARE = 0.11
SYNTHETIC_DECAY_START_SHARE = 2 / 3


@dataclass
class TrainConfig:
    # run
    model: str
    mode: str = "train"
    seed: int = 12345
    log_path: Optional[str] = None
    log_every: int = 10
    # data
    data_path: Optional[str] = None
    feature_spec: Optional[str] = None
    synthetic: bool = False
    synthetic_rows: Optional[int] = None
    reader: str = "tfdata"
    # training
    batch_size: Optional[int] = None
    eval_batch_size: Optional[int] = None
    epochs: Optional[int] = None
    max_steps: int = 0
    lr: Optional[float] = None
    warmup_steps: Optional[int] = None
    optimizer: Optional[str] = None
    # DLRM
    embedding_dim: Optional[int] = None
    bottom_mlp: Optional[List[int]] = None
    top_mlp: Optional[List[int]] = None
    interaction: str = "dot"
    decay_start_step: Optional[int] = None
    decay_steps: Optional[int] = None
    decay_power: Optional[float] = None
    # Wide & Deep
    linear_lr: Optional[float] = None
    deep_hidden_units: Optional[List[int]] = None
    deep_dropout: Optional[float] = None
    deep_warmup_epochs: Optional[float] = None
    combiner: Optional[str] = None
    # NCF
    factors: Optional[int] = None
    layers: Optional[List[int]] = None
    dropout: Optional[float] = None
    negative_samples: Optional[int] = None
    valid_negative: Optional[int] = None
    topk: Optional[int] = None
    beta1: Optional[float] = None
    beta2: Optional[float] = None
    adam_eps: Optional[float] = None
    # performance and parallelism
    amp: bool = False
    xla: bool = False
    no_tf32: bool = False
    benchmark_warmup_steps: int = 20
    benchmark_steps: int = 100
    embedding_placement: str = "auto"
    embedding_memory_gb: Optional[float] = None
    column_slice_threshold: Optional[int] = None
    data_parallel_threshold: Optional[int] = None
    sparse_as_dense: bool = False
    affinity: str = "off"
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    # checkpoints
    checkpoint_dir: Optional[str] = None
    restore: bool = False
    keep_checkpoints: int = 3
    # resolved, not flags
    embedding_optimizer: Optional[str] = None
    world_size: int = 1
    synthetic_schedule_scaled: bool = False
    embedding_tables: Optional[list] = None     # [(feature, rows, width)] the placement plans
    placement_mode: Optional[str] = None        # replicated | model_parallel (from --embedding-placement)
    placement_reason: Optional[str] = None

    @classmethod
    def from_args(cls, namespace) -> "TrainConfig":
        """The checked configuration of a parsed ``recsys-train`` command line."""
        values = dict(vars(namespace))
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:  # a programming error, not a user one: say where to add it
            raise TypeError(f"recsys.config.TrainConfig has no field for flag destination(s) {unknown}")
        cfg = cls(**values)
        cfg._fill_defaults()
        cfg._check()
        return cfg

    def as_dict(self) -> dict:
        """Plain dict of every field (the ``params`` log record)."""
        return dataclasses.asdict(self)

    @property
    def synthetic_data(self) -> bool:
        """True when the run generates its own dataset (no --data-path / --feature-spec)."""
        return self.synthetic and not self.data_path and not self.feature_spec

    # --- resolution -----------------------------------------------------------
    def _fill_defaults(self):
        user_schedule = any(v is not None for v in (self.warmup_steps, self.decay_start_step, self.decay_steps))
        for key, value in resolved(self.model, self.synthetic_data).items():
            if getattr(self, key, None) is None:
                setattr(self, key, value)
        self.world_size = launcher_world_size()
        if self.model == "dlrm" and self.synthetic_data and not user_schedule:
            self._scale_synthetic_schedule()

    def _scale_synthetic_schedule(self):
        """The synthetic DLRM schedule spans the run (warm-up, constant, decay to 0 at the last step)
        instead of fixed step numbers that would end it early in a longer run."""
        if self.batch_size < 1 or self.epochs < 1:
            return  # refused by _check
        per_epoch = max(1, self.synthetic_rows // self.batch_size)
        total = per_epoch * self.epochs
        if self.max_steps:
            total = min(total, self.max_steps)
        self.warmup_steps = max(1, round(total * SYNTHETIC_WARMUP_SHARE))
        self.decay_start_step = max(self.warmup_steps, round(total * SYNTHETIC_DECAY_START_SHARE))
        self.decay_steps = max(1, total - self.decay_start_step)
        self.synthetic_schedule_scaled = True

    def _check(self):
        for flag in ("batch_size", "eval_batch_size", "epochs", "log_every", "keep_checkpoints"):
            if getattr(self, flag) < 1:
                _fail(f"--{_flag(flag)} must be >= 1, got {getattr(self, flag)}")
        for flag in ("max_steps", "benchmark_warmup_steps", "benchmark_steps"):
            if getattr(self, flag) < 0:
                _fail(f"--{_flag(flag)} must be >= 0")
        if self.batch_size % self.world_size:
            _fail(f"--batch-size {self.batch_size} is not divisible by the {self.world_size} ranks")
        if self.lr <= 0:
            _fail(f"--lr must be > 0, got {self.lr}")
        if self.model == "dlrm" and self.interaction == "dot" and self.bottom_mlp[-1] != self.embedding_dim:
            _fail(f"--bottom-mlp last width {self.bottom_mlp[-1]} must equal --embedding-dim {self.embedding_dim}")
        if self.model == "dlrm" and self.top_mlp[-1] != 1:
            _fail(f"--top-mlp must end with 1, got {self.top_mlp}")
        if self.model == "ncf" and self.layers[0] % 2:
            _fail(f"--layers first width must be even, got {self.layers[0]}")
        for flag in ("deep_dropout", "dropout"):
            v = getattr(self, flag)
            if v is not None and not 0 <= v < 1:
                _fail(f"--{_flag(flag)} must be in [0, 1), got {v}")
        self._check_data()
        self._check_paths()

    def _check_data(self):
        if self.feature_spec:
            if not os.path.isfile(self.feature_spec):
                _fail(f"--feature-spec {self.feature_spec}: no such file")
        elif self.data_path:
            if not os.path.isdir(self.data_path):
                _fail(f"--data-path {self.data_path}: no such directory")
            self.feature_spec = os.path.join(self.data_path, "feature_spec.yaml")
            if not os.path.isfile(self.feature_spec):
                _fail(f"--data-path {self.data_path}: no feature_spec.yaml in it")
        elif not self.synthetic:
            _fail("give --data-path DIR, --feature-spec FILE or --synthetic")
        if self.feature_spec:
            from recsys.data.layout import model_kind
            from recsys.feature_spec import FeatureSpec, FeatureSpecError
            try:
                spec = FeatureSpec.from_yaml(self.feature_spec)
                spec.validate()
                kind = model_kind(spec)
            except (FeatureSpecError, OSError, ValueError) as e:
                _fail(str(e))
            if kind != self.model:
                _fail(f"{self.feature_spec}: a {kind} dataset, not for --model {self.model}")

    def _check_paths(self):
        if self.restore and not self.checkpoint_dir:
            _fail("--restore needs --checkpoint-dir")
        if self.mode == "evaluate":
            from recsys.checkpoint import AtomicCheckpointer
            if not self.checkpoint_dir or AtomicCheckpointer(self.checkpoint_dir, None, writer=False).latest() is None:
                _fail(f"--mode evaluate needs a checkpoint in --checkpoint-dir ({self.checkpoint_dir or 'not given'})")
        if self.checkpoint_dir:
            parent = os.path.dirname(os.path.abspath(self.checkpoint_dir))
            if os.path.exists(self.checkpoint_dir) and not os.path.isdir(self.checkpoint_dir):
                _fail(f"--checkpoint-dir {self.checkpoint_dir}: exists and is not a directory")
            if not os.path.isdir(self.checkpoint_dir) and not os.access(parent, os.W_OK):
                _fail(f"--checkpoint-dir {self.checkpoint_dir}: parent directory missing or not writable")
        if self.log_path:
            parent = os.path.dirname(os.path.abspath(self.log_path))
            if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
                _fail(f"--log-path {self.log_path}: directory {parent} missing or not writable")


def _flag(dest: str) -> str:
    return dest.replace("_", "-")


def _fail(message: str):
    raise EngineError(message)
