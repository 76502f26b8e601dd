"""Per-model glue between a feature spec, a Keras model, its optimizers, its data and its metric.

A Task gives the engine: the model, optimizer groups ``[(name, optimizer,
variables_fn)]``, this rank's training dataset for an epoch (per-rank batch =
global batch / world size), and ``evaluate(engine)`` returning metrics that
are the same whatever the number of ranks (sums from recsys.models.metrics,
allreduced). It builds the model from its ``config`` (a checked
recsys.configuration.train_config.TrainConfig): the embedding groups and the placement in it.

``eval_mapping`` is the mapping ``evaluate`` reads: a training run on a spec with a ``validation``
mapping judges its epochs on it (the test rows are evaluated once, by the loops, at the end);
anything else reads ``test``.
"""
from __future__ import annotations

import contextlib

import numpy as np
import tensorflow as tf

from recsys.data import make_dataset, make_reader
from recsys.errors import EngineError
from recsys.models import metrics as M
from recsys.models.embedding_tables import WIDE_OPTIMIZER
from recsys.models.optim import WarmupPolyDecay, make_optimizer


class Task:
    """Raises :class:`recsys.errors.EngineError` for a configuration it cannot run."""
    name = None
    # The metric the best checkpoint and the early stop go by (higher is better).
    watched_metric = "auc"

    def __init__(self, config, spec, dist, logger):
        self.config, self.spec, self.dist, self.log = config, spec, dist, logger
        self.global_batch = config.batch_size
        self.local_batch = config.batch_size // dist.size
        self.global_eval_batch = config.eval_batch_size
        self.local_eval_batch = max(1, config.eval_batch_size // dist.size)
        self.groups = config.embedding_groups
        self.placement = self._model_parallel_placement()
        self._steps = None
        self.eval_mapping = validation_mapping(config, spec) or "test"

    # --- embeddings placement ------------------------------------------------
    def _model_parallel_placement(self):
        """The run's placement when its tables are spread over ranks (decided, and logged, by
        recsys.train before TensorFlow started), else None (replicated)."""
        placement = self.config.placement
        if placement is None or not placement.model_parallel:
            return None
        if placement.world_size != self.dist.size:
            raise EngineError(f"the embedding placement was planned for {placement.world_size} ranks, "
                              f"this job has {self.dist.size}")
        return placement

    def local_variable_ids(self, model):
        """ids of the variables that live on this rank only (model-parallel embedding shards);
        they are neither broadcast nor allreduced."""
        from recsys.embeddings.group import EmbeddingGroup
        if self.placement is None:
            return set()
        return {id(v) for layer in model.submodules if isinstance(layer, EmbeddingGroup)
                for v in layer.local_variables()}

    def seeded_tables(self, model):
        """(ids of the tables every rank initialises identically from its group's seed, the seeds of
        the groups in model order); the engine does not broadcast these tables when the seeds agree."""
        from recsys.embeddings.group import EmbeddingGroup
        groups = [layer for layer in model.submodules if isinstance(layer, EmbeddingGroup)]
        return {id(v) for g in groups for v in g.seeded_variables()}, [g.seed for g in groups]

    # --- data -------------------------------------------------------------------
    def train_dataset(self, epoch):
        return make_dataset(self.spec, "train", self.local_batch, self.dist.rank, self.dist.size,
                            shuffle=True, seed=self.config.seed * 1000 + epoch, reader=self.config.reader)

    def benchmark_dataset(self):
        return make_dataset(self.spec, "train", self.local_batch, self.dist.rank, self.dist.size,
                            shuffle=False, repeat=True, reader=self.config.reader)

    def eval_dataset(self):
        ds = make_dataset(self.spec, self.eval_mapping, self.local_eval_batch, self.dist.rank, self.dist.size,
                          drop_remainder=False, reader=self.config.reader)
        if self.placement is not None:      # every batch is an alltoall: ranks step together
            from recsys.embeddings.lockstep import lockstep
            return lockstep(ds, self.dist)
        return ds

    @contextlib.contextmanager
    def evaluating(self, mapping: str):
        """``evaluate`` reads ``mapping`` inside the block (the one test evaluation after validation)."""
        before, self.eval_mapping = self.eval_mapping, mapping
        try:
            yield
        finally:
            self.eval_mapping = before

    def check_data(self):
        """Checks that are cheap before training: every categorical id and numerical of small
        split-binary files (larger ones are checked batch by batch as they are read), and the scale
        of the numericals (a warning naming the columns far off unit scale)."""
        from recsys.data import off_scale_warning
        from recsys.data.split_binary import CHECK_IDS_MAX_BYTES, SplitBinaryReader
        for mapping in self.spec.mappings():
            if self.spec.chunk_type(mapping) != "split_binary":
                continue
            reader = SplitBinaryReader(self.spec, mapping, 1, drop_remainder=False)
            if reader.id_bytes <= CHECK_IDS_MAX_BYTES:
                reader.check_ids()
        if "train" in self.spec.mappings():
            line = off_scale_warning(self.spec, "train")
            if line:
                self.log.info(line, warning="numerical_scale")

    def _train_reader(self):
        """This rank's numpy-side training reader, the ``--reader`` one: it counts the epoch's steps and
        reads the sample batch (the Merlin reader counts as the tf.data one does: it wraps it)."""
        return make_reader(self.spec, "train", self.local_batch, self.dist.rank, self.dist.size,
                           reader=self.config.reader)

    def warmup_steps(self) -> int:
        """The last step of the learning rate's warm-up (0: none): evaluations up to it are judged for
        the best but not counted by the early stop, which would otherwise stop a run still warming up."""
        return int(self.config.warmup_steps or 0)

    def steps_per_epoch(self):
        """Training steps in an epoch; under ``--run-mode evaluate`` 1, without reading the training
        files: evaluation steps no schedule, and its dataset may have no training mapping (or none
        that holds a batch of the reference --batch-size)."""
        if self._steps is None:
            self._steps = 1 if self.config.from_checkpoint else self._train_reader().num_batches
        return self._steps

    def sample_batch(self):
        """One batch of this rank's training data (to build the model), read by the reader's numpy side.

        Not through a tf.data iterator: an iterator of the repeating dataset dropped after one batch is
        destroyed while its reader threads still run Python (the parquet and Merlin generators, the
        split-binary reads), and the destructor holds the GIL they wait for. A Wide & Deep engine hung
        there once (2026-11-26: the main thread in the prefetch iterator's destructor, two generator
        threads in GeneratorDataset waiting)."""
        batch = next(iter(self._sample_reader().numpy_batches()), None)
        if batch is None:                       # this rank's share of a small test mapping is empty
            batch = next(iter(self._train_reader().numpy_batches()))
        return tf.nest.map_structure(tf.convert_to_tensor, batch)

    def _sample_reader(self):
        """The reader of the batch that builds the model: the training data's, or under ``--run-mode
        evaluate`` the test data's at the evaluation batch, the only mapping evaluation reads (a
        `tabular apply` dataset has no other, and a small table's training files hold no batch of
        the reference --batch-size, which evaluation does not use)."""
        if not self.config.from_checkpoint or "test" not in self.spec.mappings():
            return self._train_reader()
        return make_reader(self.spec, "test", self.local_eval_batch, self.dist.rank, self.dist.size,
                           reader=self.config.reader)

    def _sum(self, arr):
        return self.dist.allreduce_sum(np.asarray(arr, dtype=np.float64))

    def _bce(self, labels, probs):
        total, n = M.binary_cross_entropy_sums(labels, probs)
        total, n = self._sum([total, n])
        return total / max(n, 1)


class DLRMTask(Task):
    name = "dlrm"

    def build_model(self):
        from recsys.models.dlrm import DLRM
        c = self.config
        return DLRM(self.groups, bottom_mlp=c.bottom_mlp, top_mlp=c.top_mlp, interaction=c.interaction,
                    placement=self.placement)

    def optimizer_groups(self, model):
        c = self.config
        schedule = WarmupPolyDecay(c.lr, c.warmup_steps, c.decay_start_step, c.decay_steps, c.decay_power)
        opt = make_optimizer(c.optimizer, schedule)
        return [("main", opt, lambda: model.trainable_variables)]

    def evaluate(self, engine):
        hist = M.AucHistogram()
        bce = 0.0
        n = 0
        for inputs, labels in self.eval_dataset():
            probs = engine.predict(inputs).numpy()
            y = labels.numpy()
            hist.update(y, probs)
            s, k = M.binary_cross_entropy_sums(y, probs)
            bce += s
            n += k
        sums = self.dist.allreduce_sum(hist.sums())
        bce, n = self._sum([bce, n])
        return {"auc": M.auc_from_histograms(sums[0], sums[1]), "bce": bce / max(n, 1)}


class WideDeepTask(Task):
    name = "wide_deep"

    def build_model(self):
        from recsys.models.wide_deep import WideDeep
        c = self.config
        return WideDeep(groups=self.groups, deep_hidden_units=c.deep_hidden_units, deep_dropout=c.deep_dropout,
                        placement=self.placement, seed=c.seed)

    def warmup_steps(self) -> int:
        """The deep part's warm-up: --warmup-steps, else --deep-warmup-epochs of this run's epochs."""
        c = self.config
        return int(c.warmup_steps if c.warmup_steps is not None else int(c.deep_warmup_epochs * self.steps_per_epoch()))

    def optimizer_groups(self, model):
        c = self.config
        deep = make_optimizer(c.optimizer, WarmupPolyDecay(c.lr, self.warmup_steps()))
        wide = make_optimizer(WIDE_OPTIMIZER, c.linear_lr)
        return [("deep", deep, lambda: model.deep_variables), ("wide", wide, lambda: model.wide_variables)]

    def has_map(self):
        """True when the evaluated mapping stores the display id (``map`` channel): MAP@12 needs it."""
        return any(self.spec.chunk_of(self.eval_mapping, f) is not None for f in self.spec.features("map"))

    def check_data(self):
        super().check_data()
        if not self.has_map():
            self.log.info(f"{self.spec.origin}: no map channel (display id) in the test mapping: "
                          f"MAP@12 is left out, AUC and BCE are reported", warning="no_map_channel")

    def evaluate(self, engine):
        probs, labels, groups = [], [], []
        with_map = self.has_map()
        for inputs, y in self.eval_dataset():
            probs.append(engine.predict(inputs).numpy().reshape(-1))
            labels.append(y.numpy().reshape(-1))
            if with_map:
                groups.append(inputs["map"].numpy().reshape(-1))
        probs = np.concatenate(probs) if probs else np.zeros(0)
        labels = np.concatenate(labels) if labels else np.zeros(0)
        out = {}
        if with_map:
            groups = np.concatenate(groups) if groups else np.zeros(0, np.int64)
            # A display id lives in one file, files are split by rank: per-rank sums add up exactly.
            ap, count = M.map_at_k_sums(probs, labels, groups, k=12)
            ap, count = self._sum([ap, count])
            out["map_at_12"] = ap / max(count, 1)
        hist = M.AucHistogram()
        hist.update(labels, probs)
        sums = self.dist.allreduce_sum(hist.sums())
        return {**out, "auc": M.auc_from_histograms(sums[0], sums[1]), "bce": self._bce(labels, probs)}


class NCFTask(Task):
    """NeuMF on positives-only data: 4 negatives per positive resampled each epoch; eval vs 100 negatives."""
    name = "ncf"

    @property
    def watched_metric(self):
        return f"hr_at_{self.config.topk}"

    def __init__(self, config, spec, dist, logger):
        super().__init__(config, spec, dist, logger)
        from recsys.data import ncf
        self.ncf = ncf
        self.num_users = spec.cardinality(spec.features("user_ch")[0])
        self.num_items = spec.cardinality(spec.features("item_ch")[0])
        users, items = ncf.load_pairs(spec, "train")
        # Every rank knows every positive (to reject false negatives), trains on its slice.
        self.sampler = ncf.TrainSampler(users, items, self.num_items, config.negative_samples, seed=config.seed)
        self._train_users, self._train_items = users, items
        self._eval = {}                      # mapping -> this rank's (users, items) evaluation arrays

    def build_model(self):
        from recsys.models.ncf import NeuMF
        c = self.config
        return NeuMF(self.groups, layers=c.layers, dropout=c.dropout, seed=c.seed)

    def optimizer_groups(self, model):
        c = self.config
        opt = make_optimizer(c.optimizer, WarmupPolyDecay(c.lr, c.warmup_steps or 0), beta1=c.beta1,
                             beta2=c.beta2, eps=c.adam_eps)
        return [("main", opt, lambda: model.trainable_variables)]

    def _epoch_batches(self, epoch):
        """This rank's [steps, local batch] arrays: global batch g is rows [g*B, (g+1)*B) of the
        shuffled epoch and rank r takes the r-th 1/size slice of it (same rows per global step
        whatever the number of ranks)."""
        users, items, labels = self.sampler.epoch(epoch)
        steps = len(users) // self.global_batch
        n = steps * self.global_batch

        def mine(a):
            return a[:n].reshape(steps, self.dist.size, self.local_batch)[:, self.dist.rank]
        return mine(users), mine(items), mine(labels)

    def train_dataset(self, epoch):
        u, i, y = self._epoch_batches(epoch)
        # Whole batches as dataset elements: no per-sample slicing on the host.
        ds = tf.data.Dataset.from_tensor_slices(({"user": u, "item": i}, y[..., None]))
        return ds.prefetch(tf.data.AUTOTUNE)

    def benchmark_dataset(self):
        return self.train_dataset(0).repeat()

    def sample_batch(self):
        # NCF's batches come from the sampler (tensor slices: no Python in tf.data's threads).
        return next(iter(self.benchmark_dataset().take(1)))

    def steps_per_epoch(self):
        if len(self.sampler) < self.global_batch:
            raise EngineError(f"--batch-size {self.global_batch} is larger than an NCF "
                              f"epoch ({len(self.sampler)} samples with negatives)")
        return len(self.sampler) // self.global_batch

    def check_data(self):
        """Also builds the evaluation sets now (validation's and test's): too few unseen items for the
        negatives fails before training."""
        super().check_data()
        for mapping in dict.fromkeys((self.eval_mapping, "test")):
            with self.evaluating(mapping):
                self._eval_arrays()

    def _eval_arrays(self):
        mapping = self.eval_mapping
        if mapping not in self._eval:
            stored = self.ncf.stored_eval_set(self.spec) if mapping == "test" else None
            if stored is not None:  # `preproc movielens --test-negatives N` wrote them: use those
                users, items, _ = stored
                self.log.info(f"NCF evaluation: the {items.shape[1] - 1} stored negatives per user of the test set")
            else:
                tu, ti = self.ncf.load_pairs(self.spec, mapping)
                try:
                    users, items, _ = self.ncf.eval_set(tu, ti, self._train_users, self._train_items,
                                                        self.num_items, self.config.valid_negative, seed=self.config.seed)
                except ValueError as e:
                    raise EngineError(f"{self.spec.origin}: {e}") from None
            # Uneven shards are fine: only sums are reduced.
            self._eval[mapping] = self.ncf.shard((users, items), self.dist.rank, self.dist.size, equal=False)
        return self._eval[mapping]

    def eval_dataset(self):
        users, items = self._eval_arrays()
        per_user = items.shape[1]
        u = np.repeat(users, per_user)
        ds = tf.data.Dataset.from_tensor_slices(({"user": u, "item": items.reshape(-1)},
                                                 np.zeros((u.size, 1), np.float32)))
        return ds.batch(self.local_eval_batch).prefetch(tf.data.AUTOTUNE)

    def evaluate(self, engine):
        users, items = self._eval_arrays()
        scores = [engine.predict(x).numpy().reshape(-1) for x, _ in self.eval_dataset()]
        scores = np.concatenate(scores).reshape(items.shape) if scores else np.zeros(items.shape)
        hits, ndcg, n = M.hit_rate_and_ndcg_sums(scores[:, 0], scores[:, 1:], k=self.config.topk)
        labels = np.zeros(scores.shape, np.float32)
        labels[:, 0] = 1.0
        hits, ndcg, n = self._sum([hits, ndcg, n])
        return {f"hr_at_{self.config.topk}": hits / max(n, 1), f"ndcg_at_{self.config.topk}": ndcg / max(n, 1),
                "bce": self._bce(labels, scores)}


def validation_mapping(config, spec) -> str | None:
    """``validation`` when a training run's spec has that mapping (its evaluations judge the epochs
    there), else None: evaluation, benchmarks and specs without one read ``test`` as before."""
    return "validation" if config.mode == "train" and "validation" in spec.mappings() else None


TASKS = {"dlrm": DLRMTask, "wide_deep": WideDeepTask, "ncf": NCFTask}
