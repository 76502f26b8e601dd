"""The typed training configuration: built once from the parsed command line, checked there, then frozen.

:class:`TrainConfig` keeps the argparse destination names as field names (so
``config.batch_size`` reads as the flag ``--batch-size``). :meth:`TrainConfig.from_args`
fills flags left unset from the model's defaults (recsys.models.defaults),
checks everything that needs no TensorFlow, raising :class:`recsys.errors.EngineError`
with a one-line message naming the flag, and derives what the run needs from the
flags: the feature spec read, the start-up notes, the model's embedding groups and
the one embedding placement (recsys.embeddings). Nothing changes a config afterwards;
a later value (the synthetic dataset written at start) makes a new one with
``dataclasses.replace``. Pure Python: a typo costs no TensorFlow start-up.

A flag added to ``recsys.train.build_parser`` needs a field here too;
``from_args`` refuses a parsed namespace with an unknown destination.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, replace
from typing import List, Optional, Tuple

from recsys.configuration.checks import (check_creatable, fail, fitting_batch, flag_name, flag_text,
                                         memory_budget_gb)
from recsys.configuration.predictions import check_directory, check_flags
from recsys.models.defaults import (MODEL_DEFAULTS, REFERENCE_MIN_STEPS_PER_EPOCH, SMALL_DATA_DEFAULTS,
                                    is_small_data, resolved, small_data_batch)
from recsys.placement.decision import Placement
from recsys.runtime.distributed import launcher_world_size

# Share of the run before the synthetic DLRM schedule ends its warm-up / starts its decay
# (the reference's 8000 / 48000 of about 72000 steps).
# The run modes that restore a training run's checkpoint and read only its test mapping
CHECKPOINT_MODES = ("evaluate", "predict")
SYNTHETIC_WARMUP_SHARE = 0.11
SYNTHETIC_DECAY_START_SHARE = 2 / 3


@dataclass(frozen=True)
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
    device: Optional[str] = None     # --device: auto / cpu / gpu; None: $RECSYS_DEVICE, else auto
    xla: bool = False
    no_tf32: bool = False
    benchmark_warmup_steps: int = 20
    benchmark_steps: int = 100
    breakdown_steps: int = 0
    steps_per_call: int = 8          # --steps-per-call: training steps per compiled call (recsys.engine)
    hang_timeout: Optional[float] = None   # --hang-timeout: recsys.monitoring.watchdog's limit; None: its default
    embedding_placement: str = "auto"
    embedding_memory_gb: Optional[float] = None
    column_slice_threshold: Optional[int] = None
    data_parallel_threshold: Optional[int] = None
    embedding_implementation: str = "horovod-alltoall"   # the model-parallel layer (recsys.embeddings.group)
    sparse_as_dense: bool = False
    affinity: str = "off"
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    # TensorBoard and profiler (recsys.monitoring.tensorboard)
    tensorboard_dir: Optional[str] = None
    no_tensorboard: bool = False
    tensorboard_ranks: object = (0,)      # a tuple of ranks, or "all"
    profile_steps: Optional[Tuple[int, int]] = None
    profile_ranks: object = "all"
    # checkpoints
    checkpoint_dir: Optional[str] = None
    restore: bool = False
    keep_checkpoints: int = 3
    early_stop_patience: Optional[int] = None   # evaluations without a new best before the run stops (0: never)
    early_stop_min_delta: Optional[float] = None  # the gain over the best that restarts the count
    keep_best: Optional[bool] = None            # keep the best checkpoint by the watched metric (best.json)
    evaluate_checkpoint: str = "best"           # --run-mode evaluate/predict: best.json's checkpoint, or the latest
    predictions: Optional[str] = None           # --run-mode predict: the directory the scores go to
    # resolved, not flags
    embedding_optimizer: Optional[str] = None
    world_size: int = 1
    synthetic_schedule_scaled: bool = False
    # derived by from_args, before TensorFlow starts
    notes: list = dataclasses.field(default_factory=list)  # [(warning kind, one line)] the run logs at start
    embedding_groups: Tuple = ()    # the TableGroup of each embedding layer (recsys.models.embedding_tables)
    placement: Optional[Placement] = None  # where every group's tables live

    @classmethod
    def from_args(cls, namespace) -> "TrainConfig":
        """The checked configuration of a parsed ``recsys-train`` command line, with its derived values."""
        cfg = cls._resolved(namespace)
        cfg._check_values()
        given = {k for k, v in vars(namespace).items() if v is not None}
        cfg = cfg._with_data(given)
        cfg._check_paths()
        return cfg._with_placement()

    @classmethod
    def for_submission(cls, namespace, world_size, check_data=True, check_existence=True,
                       produced=()) -> "TrainConfig":
        """The checks a submit host can make before a job is queued (recsys-submit): flag values and
        batch divisibility over the job's `world_size` ranks; with `check_data`, that the data (and
        for evaluate the checkpoint dir) is named; with `check_existence` too, that it exists here,
        unless under one of the `produced` paths (which an earlier job of the chain writes). Nothing
        is read but directory listings: no feature spec is parsed, no TensorFlow or NumPy imported,
        no placement derived."""
        cfg = cls._resolved(namespace, world_size)
        cfg._check_values()
        if cfg.restore and not cfg.checkpoint_dir:
            fail("--restore needs --checkpoint-dir")
        if check_data:
            cfg._check_submitted_files([os.path.abspath(p) for p in produced], check_existence)
        return cfg

    def as_dict(self) -> dict:
        """The ``params`` log record: every flag and resolved value; the embedding groups as their
        table list and the placement as its mode and reason (the ``placement`` record has the plan)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("embedding_groups", "placement")}
        placement = self.placement
        out.update(embedding_tables=self.embedding_tables, placement_mode=placement and placement.mode,
                   placement_reason=placement and placement.reason)
        return out

    @property
    def from_checkpoint(self) -> bool:
        """The run mode restores a training run's checkpoint and reads only its test mapping."""
        return self.mode in CHECKPOINT_MODES

    @property
    def embedding_tables(self) -> list:
        """``[(name, rows, width)]`` of every embedding table, group after group."""
        from recsys.placement.tables import flat_tables
        return flat_tables(self.embedding_groups)

    @property
    def dense_parameters(self) -> int:
        """Replicated (non-embedding) parameters of the model: the memory check and the CPU-speed
        estimate (recsys.configuration.slow) count these."""
        from recsys.models.embedding_tables import dense_params
        sizes = {k: getattr(self, k) for k in ("bottom_mlp", "top_mlp", "deep_hidden_units", "layers", "factors")
                 if getattr(self, k) is not None}
        return dense_params(self.model, self.embedding_groups, **sizes)

    @property
    def synthetic_data(self) -> bool:
        """True when the run generates its own dataset (no --data-path / --feature-spec)."""
        return self.synthetic and not self.data_path and not self.feature_spec

    # --- resolution -----------------------------------------------------------
    @classmethod
    def _resolved(cls, namespace, world_size=None) -> "TrainConfig":
        """The flags of ``namespace``, those left unset filled from the model's defaults."""
        values = dict(vars(namespace))
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:  # a programming error, not a user one: say where to add it
            raise TypeError(f"recsys.configuration.train_config.TrainConfig has no field for flag destination(s) {unknown}")
        cfg = cls(**values)
        user_schedule = any(v is not None for v in (cfg.warmup_steps, cfg.decay_start_step, cfg.decay_steps))
        unset = {k: v for k, v in resolved(cfg.model, cfg.synthetic_data).items() if getattr(cfg, k) is None}
        cfg = replace(cfg, world_size=world_size or launcher_world_size(), **unset)
        if cfg.model == "dlrm" and cfg.synthetic_data and not user_schedule:
            cfg = replace(cfg, **cfg._scaled_schedule(cfg.synthetic_rows))
        return cfg

    def _scaled_schedule(self, rows) -> dict:
        """The synthetic (and small-data) DLRM schedule spans the run (warm-up, constant, decay to 0
        at the last step) instead of fixed step numbers that would end it early in a longer run."""
        assert self.batch_size is not None and self.epochs is not None, "the model's defaults fill them first"
        if self.batch_size < 1 or self.epochs < 1:
            return {}  # refused by _check_values
        per_epoch = max(1, rows // self.batch_size)
        total = per_epoch * self.epochs
        if self.max_steps:
            total = min(total, self.max_steps)
        warmup = max(1, round(total * SYNTHETIC_WARMUP_SHARE))
        decay_start = max(warmup, round(total * SYNTHETIC_DECAY_START_SHARE))
        return dict(warmup_steps=warmup, decay_start_step=decay_start, decay_steps=max(1, total - decay_start),
                    synthetic_schedule_scaled=True)

    def _with_placement(self) -> "TrainConfig":
        """The model's embedding groups and the run's one placement decision (recsys.embeddings):
        the plan every EmbeddingGroup layer will use, checked against the memory budget."""
        from recsys.models.embedding_tables import model_groups, spec_channels
        from recsys.placement.decision import PlacementError, choose_placement, slots
        if self.feature_spec:
            from recsys.features.spec import FeatureSpec
            spec = FeatureSpec.from_yaml(self.feature_spec)
        else:
            from recsys.data.synthetic import default_spec
            spec = default_spec(self.model)
        try:
            channels = spec_channels(self.model, spec)
        except ValueError as e:          # a model that needs ids, given numericals alone
            fail(str(e))
        cfg = replace(self, embedding_groups=model_groups(
            self.model, channels, embedding_dim=self.embedding_dim, factors=self.factors,
            layers=self.layers, combiner=self.combiner, optimizer=self.optimizer))
        budget = memory_budget_gb(self.embedding_memory_gb)
        assert self.batch_size is not None, "the model's defaults fill it first"
        try:
            placement = choose_placement(
                self.embedding_placement, self.world_size, cfg.embedding_groups, model=self.model,
                dense_params=cfg.dense_parameters, dense_slots=slots(self.optimizer),
                budget_bytes=None if budget is None else int(budget * 1e9),
                column_slice_threshold=self.column_slice_threshold,
                data_parallel_threshold=self.data_parallel_threshold,
                implementation=self.embedding_implementation, local_batch=self.batch_size // self.world_size,
                local_eval_batch=max(1, self.eval_batch_size // self.world_size) if self.eval_batch_size else None)
        except PlacementError as e:
            fail(str(e))
        return replace(cfg, placement=placement)

    # --- checks ------------------------------------------------------------------
    def _check_values(self):
        for flag in ("batch_size", "eval_batch_size", "epochs", "log_every", "keep_checkpoints", "steps_per_call"):
            if getattr(self, flag) < 1:
                fail(f"--{flag_name(flag)} must be >= 1, got {getattr(self, flag)}")
        for flag in ("max_steps", "benchmark_warmup_steps", "benchmark_steps", "breakdown_steps", "early_stop_patience"):
            if getattr(self, flag) < 0:
                fail(f"--{flag_name(flag)} must be >= 0")
        if self.hang_timeout is not None and not 0 <= self.hang_timeout < float("inf"):
            fail(f"--hang-timeout must be >= 0 seconds (0: off), got {self.hang_timeout}")
        if self.breakdown_steps and self.mode != "benchmark":
            fail(f"--breakdown-steps needs --run-mode benchmark (the run mode is {self.mode})")
        self._check_predict()
        if self.batch_size % self.world_size:
            fail(f"--batch-size {self.batch_size} is not divisible by the {self.world_size} ranks")
        if self.lr <= 0:
            fail(f"--lr must be > 0, got {self.lr}")
        if self.model == "dlrm" and self.interaction == "dot" and self.bottom_mlp[-1] != self.embedding_dim:
            fail(f"--bottom-mlp last width {self.bottom_mlp[-1]} must equal --embedding-dim {self.embedding_dim}")
        if self.model == "dlrm" and self.top_mlp[-1] != 1:
            fail(f"--top-mlp must end with 1, got {self.top_mlp}")
        if self.model == "ncf" and self.layers[0] % 2:
            fail(f"--layers first width must be even, got {self.layers[0]}")
        for flag in ("deep_dropout", "dropout"):
            v = getattr(self, flag)
            if v is not None and not 0 <= v < 1:
                fail(f"--{flag_name(flag)} must be in [0, 1), got {v}")
        if self.embedding_implementation == "distributed-embeddings" and self.xla:
            fail("--embedding-implementation distributed-embeddings cannot be used with --xla (its gradient tape "
                  "runs Horovod collectives, which are not XLA ops)")
        if self.embedding_placement == "model_parallel" and self.xla:
            fail("--embedding-placement model_parallel cannot be used with --xla (the alltoall is not an XLA op)")
        for flag in ("column_slice_threshold", "data_parallel_threshold"):
            if getattr(self, flag) is not None and getattr(self, flag) < 1:
                fail(f"--{flag_name(flag)} must be >= 1, got {getattr(self, flag)}")
        if self.early_stop_min_delta is not None and not self.early_stop_min_delta >= 0:
            fail(f"--early-stop-min-delta must be >= 0, got {self.early_stop_min_delta}")
        if self.embedding_memory_gb is not None and self.embedding_memory_gb <= 0:
            fail(f"--embedding-memory-gb must be > 0, got {self.embedding_memory_gb}")
        self._check_tensorboard()

    def _check_tensorboard(self):
        """--profile-steps traces training steps; the ranks named exist. (Its directory is checked with
        the paths: recsys-submit gives every job its --log-path.)"""
        if self.profile_steps:
            if self.mode not in ("train", "benchmark"):
                fail(f"--profile-steps needs --run-mode train or benchmark (the run mode is {self.mode})")
        for flag in ("tensorboard_ranks", "profile_ranks"):
            ranks = getattr(self, flag)
            if ranks != "all" and max(ranks) >= self.world_size:
                fail(f"--{flag_name(flag)} {','.join(map(str, ranks))}: the run has {self.world_size} rank(s), "
                      f"0 to {self.world_size - 1}")

    def _check_predict(self):
        check_flags(self.mode, self.model, self.predictions, fail)

    def _check_predictions_dir(self):
        """--predictions DIR: new or empty, and creatable (where the job runs, or is submitted)."""
        if self.mode == "predict":
            check_directory(self.predictions, fail)
            check_creatable("--predictions", self.predictions, self.predictions)

    def _check_submitted_files(self, produced, check_existence):
        """for_submission's file checks: the data and the checkpoint to evaluate are named, and
        exist unless a path in `produced` (written by an earlier job) holds them."""
        def pending(path):
            path = os.path.abspath(path)
            return not check_existence or any(path == p or path.startswith(p.rstrip(os.sep) + os.sep)
                                              for p in produced)

        if self.feature_spec:
            if not pending(self.feature_spec) and not os.path.isfile(self.feature_spec):
                fail(f"--feature-spec {self.feature_spec}: no such file")
        elif self.data_path:
            if not pending(self.data_path):
                if not os.path.isdir(self.data_path):
                    fail(f"--data-path {self.data_path}: no such directory")
                if not os.path.isfile(os.path.join(self.data_path, "feature_spec.yaml")):
                    fail(f"--data-path {self.data_path}: no feature_spec.yaml in it")
        elif not self.synthetic:
            fail("give --data-path DIR, --feature-spec FILE or --synthetic")
        if self.from_checkpoint:
            if not self.checkpoint_dir:
                fail(f"--run-mode {self.mode} needs --checkpoint-dir (the checkpoints of a training run)")
            if not pending(self.checkpoint_dir):
                from recsys.checkpoints.atomic import AtomicCheckpointer
                if AtomicCheckpointer(self.checkpoint_dir, None, writer=False).latest() is None:
                    fail(f"--run-mode {self.mode} needs a checkpoint in --checkpoint-dir {self.checkpoint_dir}")
        if check_existence:
            self._check_predictions_dir()

    def _with_data(self, given=None) -> "TrainConfig":
        """The dataset checked; the config reading it (``--data-path``'s feature_spec.yaml) with the
        small-data defaults (for the hyper-parameter flags not in ``given``) and the note of a
        short run."""
        feature_spec = self.feature_spec
        if feature_spec:
            if not os.path.isfile(feature_spec):
                fail(f"--feature-spec {feature_spec}: no such file")
        elif self.data_path:
            if not os.path.isdir(self.data_path):
                fail(f"--data-path {self.data_path}: no such directory")
            feature_spec = os.path.join(self.data_path, "feature_spec.yaml")
            if not os.path.isfile(feature_spec):
                fail(f"--data-path {self.data_path}: no feature_spec.yaml in it")
        elif not self.synthetic:
            fail("give --data-path DIR, --feature-spec FILE or --synthetic")
        note = None
        cfg, notes = self, []
        if feature_spec:
            from recsys.data.layout import model_kind
            from recsys.features.spec import FeatureSpec, FeatureSpecError
            try:
                spec = FeatureSpec.from_yaml(feature_spec)
                rows = spec.validate()
                kind = model_kind(spec)
            except (FeatureSpecError, OSError, ValueError) as e:
                fail(str(e))
            if kind != self.model:
                fail(f"{feature_spec}: a {kind} dataset, not for --model {self.model}")
            if self.mode == "evaluate" and spec.metadata.get("labels") is False:
                fail(f"{feature_spec}: has no labels (new rows without the label column): use --run-mode predict")
            if rows.get("train"):
                what = f"the {rows['train']} training rows of {feature_spec}"
                cfg, small = self._small_data(rows["train"], what, given)
                notes += [small] if small else []
                note = cfg._short_run_note(rows["train"], what)
        elif self.synthetic_rows:
            note = self._short_run_note(self.synthetic_rows, f"--synthetic-rows {self.synthetic_rows}")
        notes += [n for n in (note, cfg._keep_best_note()) if n]
        return replace(cfg, feature_spec=feature_spec, notes=notes)

    def _keep_best_note(self):
        """--keep-best (given, or a small-data default) keeps a checkpoint only where checkpoints
        are written: without --checkpoint-dir it keeps nothing, and says so."""
        if self.keep_best and self.mode == "train" and not self.checkpoint_dir:
            return ("keep_best_without_checkpoints", "warning: --keep-best keeps the best evaluation's checkpoint "
                    "in --checkpoint-dir, and none is given: nothing is kept (the summary still names the "
                    "best evaluation); give --checkpoint-dir to evaluate or predict with it later")
        return None

    def _samples(self, rows: int) -> int:
        """Training samples of an epoch of ``rows`` stored rows (NCF: the positives and their negatives)."""
        return rows * (1 + (self.negative_samples or 0)) if self.model == "ncf" else rows

    def _small_data(self, rows: int, what: str, given):
        """(config, note): the small-data defaults (recsys.models.defaults) for every hyper-parameter
        flag not ``given``, when the reference batch gives fewer than REFERENCE_MIN_STEPS_PER_EPOCH
        steps per epoch on the training data; the note names the values chosen and why."""
        if given is None or self.mode not in ("train", "benchmark") or self.synthetic_data:
            return self, None
        samples = self._samples(rows)
        if not is_small_data(self.model, samples):
            return self, None
        changes = {k: v for k, v in SMALL_DATA_DEFAULTS[self.model].items() if k not in given}
        if "batch_size" not in given:
            changes["batch_size"] = small_data_batch(samples, self.world_size)
        cfg = replace(self, **changes)
        schedule = ("warmup_steps", "decay_start_step", "decay_steps")
        if cfg.model == "dlrm" and not any(k in given for k in schedule):
            changes.update({k: v for k, v in cfg._scaled_schedule(rows).items() if k in schedule})
            cfg = replace(self, **changes)
        if not changes:
            return self, None
        ref = MODEL_DEFAULTS[self.model]["batch_size"]
        order = ("batch_size", "lr", "linear_lr", "beta1", "beta2", "epochs", "deep_warmup_epochs", *schedule,
                 "early_stop_patience", "early_stop_min_delta", "keep_best")
        chosen = " ".join(flag_text(k, changes[k]) for k in order if k in changes)
        extra = f" ({samples} samples with negatives)" if self.model == "ncf" else ""
        return cfg, ("small_data_defaults",
                     f"small-data defaults: {chosen}: the reference --batch-size {ref} gives "
                     f"{samples // ref} step(s) per epoch on {what}{extra}, fewer than "
                     f"{REFERENCE_MIN_STEPS_PER_EPOCH}; flags given keep their values")

    def _short_run_note(self, rows: int, what: str):
        """A global batch larger than one epoch trains a single short step (or none): refused,
        with the largest batch that gives at least one full step. NCF samples its negatives,
        so an epoch holds (1 + --negative-samples) samples per stored positive. Returns the
        ``short_run`` note of a run too short to time, else None."""
        if self.mode not in ("train", "benchmark"):
            return None
        samples = rows * (1 + (self.negative_samples or 0)) if self.model == "ncf" else rows
        assert self.batch_size is not None and self.epochs is not None, "the model's defaults fill them first"
        if self.batch_size > samples:
            extra = f" ({samples} samples with negatives)" if self.model == "ncf" else ""
            fail(f"--batch-size {self.batch_size} is larger than {what}{extra}: give --batch-size "
                  f"{fitting_batch(samples, self.world_size)} or less")
        steps = (samples // self.batch_size) * self.epochs
        if self.max_steps:
            steps = min(steps, self.max_steps)
        if self.mode == "train" and steps <= self.benchmark_warmup_steps:
            return ("short_run", f"warning: {steps} training step(s) ({what}, --batch-size {self.batch_size}, "
                    f"--epochs {self.epochs}): no more than the --benchmark-warmup-steps "
                    f"{self.benchmark_warmup_steps}, so no throughput is measured; a smaller "
                    f"--batch-size gives more steps")
        return None

    def _check_paths(self):
        if self.restore and not self.checkpoint_dir:
            fail("--restore needs --checkpoint-dir")
        if self.from_checkpoint:
            from recsys.checkpoints.atomic import AtomicCheckpointer
            if not self.checkpoint_dir or AtomicCheckpointer(self.checkpoint_dir, None, writer=False).latest() is None:
                fail(f"--run-mode {self.mode} needs a checkpoint in --checkpoint-dir "
                      f"({self.checkpoint_dir or 'not given'})")
        self._check_predictions_dir()
        # Missing directories are created when the run starts (as `mkdir -p`): the nearest
        # existing ancestor must be a writable directory.
        if self.checkpoint_dir:
            if os.path.exists(self.checkpoint_dir) and not os.path.isdir(self.checkpoint_dir):
                fail(f"--checkpoint-dir {self.checkpoint_dir}: exists and is not a directory")
            check_creatable("--checkpoint-dir", self.checkpoint_dir, self.checkpoint_dir)
        if self.log_path:
            if os.path.isdir(self.log_path):
                fail(f"--log-path {self.log_path}: is a directory")
            check_creatable("--log-path", self.log_path, os.path.dirname(os.path.abspath(self.log_path)))
        if self.profile_steps and not (self.tensorboard_dir or self.log_path):
            fail("--profile-steps needs --tensorboard-dir or --log-path (the trace goes next to the run's log)")
        if self.tensorboard_dir:
            if os.path.exists(self.tensorboard_dir) and not os.path.isdir(self.tensorboard_dir):
                fail(f"--tensorboard-dir {self.tensorboard_dir}: exists and is not a directory")
            check_creatable("--tensorboard-dir", self.tensorboard_dir, self.tensorboard_dir)
