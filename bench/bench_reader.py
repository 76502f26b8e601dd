"""Reader throughput vs the training step's consumption (goal: reader >= 5x the step).

For DLRM on split-binary and Wide & Deep on parquet, at a stated size:

* reader: samples/s of ``recsys.data.make_dataset`` (train mapping, shuffle,
  repeat, prefetch) iterated on its own, plus the numpy side alone;
* step: samples/s of one training step (forward, backward, optimizer) of the
  engine's model (``recsys.models``) on an in-memory batch of the same size,
  single process. If the engine's models cannot be imported, a comparable
  plain Keras MLP over the same inputs is timed instead, and the table says so.

Reader and step are timed alternately ``--rounds`` times and the best of each
is kept, so that load from other processes on a shared machine distorts the
ratio less. The data is generated first (synthetic, deterministic) and then read from the
page cache: the figure is the pipeline's decode/pack capacity, not disk
bandwidth. Run by hand; prints a table and the command that reproduces it.

    python bench/bench_reader.py [--rows 1048576] [--batch-size 16384] [--config small|reference]
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile
import time


sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIGS = {  # model sizes; "small" = the engine's --synthetic defaults, "reference" = the papers' MLPs
    "small": {"dlrm": dict(embedding_dim=16, bottom_mlp=[32, 16], top_mlp=[64, 32, 1]),
              "wide_deep": dict(embedding_dim=16, deep_hidden_units=[64, 64, 64])},
    "reference": {"dlrm": dict(embedding_dim=128, bottom_mlp=[512, 256, 128], top_mlp=[1024, 1024, 512, 256, 1]),
                  "wide_deep": dict(embedding_dim=64, deep_hidden_units=[1024] * 5)},
}


def time_reader(ds, batches, warmup=3):
    it = iter(ds)
    for _ in range(warmup):
        next(it)
    t0 = time.perf_counter()
    n = 0
    for _ in range(batches):
        _, labels = next(it)
        n += int(labels.shape[0])
    return n / (time.perf_counter() - t0)


def time_numpy_reader(reader, batches):
    t0 = time.perf_counter()
    n = 0
    while n < batches * reader.batch_size:
        for _, labels in reader.numpy_batches(shuffle=True):
            n += len(labels)
            if n >= batches * reader.batch_size:
                break
    return n / (time.perf_counter() - t0)


def build_model(model, spec, cfg):
    """The engine's model when importable, else a comparable Keras MLP; returns (model, description)."""
    import tensorflow as tf
    from recsys.models.embedding_tables import model_groups, spec_channels
    groups = model_groups(model, spec_channels(model, spec), embedding_dim=cfg["embedding_dim"])
    try:
        if model == "dlrm":
            from recsys.models.dlrm import DLRM
            return DLRM(groups, bottom_mlp=cfg["bottom_mlp"], top_mlp=cfg["top_mlp"]), "recsys.models.dlrm.DLRM"
        from recsys.models.wide_deep import WideDeep
        return WideDeep(groups=groups, deep_hidden_units=cfg["deep_hidden_units"]), "recsys.models.wide_deep.WideDeep"
    except ImportError as e:
        print(f"note: engine model not importable ({e}); timing a comparable Keras MLP instead")

    class Fallback(tf.keras.Model):
        def __init__(self):
            super().__init__()
            dim = cfg["embedding_dim"]
            self.cards = {f: spec.cardinality(f) for ch in ("categorical", "onehot_categorical",
                                                            "multihot_categorical") for f in spec.features(ch)}
            self.emb = {f: tf.keras.layers.Embedding(k, dim) for f, k in self.cards.items()}
            units = cfg.get("top_mlp") or cfg["deep_hidden_units"] + [1]
            self.mlp = tf.keras.Sequential([tf.keras.layers.Dense(u, "relu") for u in units[:-1]]
                                           + [tf.keras.layers.Dense(1)])

        def call(self, x, training=False):
            parts = [x["numerical"]]
            if "categorical" in x:
                parts += [self.emb[f](x["categorical"][:, i]) for i, f in enumerate(spec.features("categorical"))]
            for ch in ("onehot_categorical", "multihot_categorical"):
                for f, ids in x.get(ch, {}).items():
                    e = self.emb[f](tf.maximum(ids, 0))
                    parts.append(e if e.shape.rank == 2 else tf.reduce_sum(e, axis=1))
            return self.mlp(tf.concat(parts, axis=1))

    return Fallback(), "Keras MLP fallback (engine model not importable)"


_STEPS = {}


def time_step(model, inputs, labels, steps, warmup=3):
    import tensorflow as tf
    if id(model) not in _STEPS:
        opt = tf.keras.optimizers.SGD(0.01)

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=model(x, training=True)))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss
        _STEPS[id(model)] = step
    step = _STEPS[id(model)]
    for _ in range(warmup):
        step(inputs, labels).numpy()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step(inputs, labels)
    loss.numpy()
    return steps * int(labels.shape[0]) / (time.perf_counter() - t0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1 << 20, help="train rows generated per dataset")
    p.add_argument("--batch-size", type=int, default=16384)
    p.add_argument("--reader-batches", type=int, default=60)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3, help="alternating reader/step measurements (best of each)")
    p.add_argument("--config", choices=sorted(CONFIGS), default="small")
    p.add_argument("--models", default="dlrm,wide_deep")
    p.add_argument("--workdir", default=None, help="where to generate the data (default: a temp dir, removed)")
    a = p.parse_args(argv)

    import tensorflow as tf
    from recsys.data import make_dataset, make_reader, synthetic

    workdir = a.workdir or tempfile.mkdtemp(prefix="bench_reader_")
    rows = []
    try:
        for model in a.models.split(","):
            fmt = "split_binary" if model == "dlrm" else "parquet"
            out = os.path.join(workdir, model)
            t0 = time.perf_counter()
            spec = synthetic.generate(synthetic.default_spec(model, num_files=2), out,
                                      {"train": a.rows, "test": 1024}, seed=0)
            gen_rate = a.rows / (time.perf_counter() - t0)
            size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
            ds = make_dataset(spec, "train", a.batch_size, shuffle=True, seed=0, repeat=True)
            inputs, labels = next(iter(make_dataset(spec, "train", a.batch_size)))
            net, what = build_model(model, spec, CONFIGS[a.config][model])
            reader_rate = numpy_rate = step_rate = 0.0
            for _ in range(a.rounds):  # alternate, keep the best of each: other load on the machine comes and goes
                reader_rate = max(reader_rate, time_reader(ds, a.reader_batches))
                numpy_rate = max(numpy_rate, time_numpy_reader(make_reader(spec, "train", a.batch_size),
                                                               a.reader_batches // 2))
                step_rate = max(step_rate, time_step(net, inputs, labels, a.steps))
            rows.append((model, fmt, a.rows, size / 2 ** 20, gen_rate, reader_rate, numpy_rate, step_rate, what))
    finally:
        if not a.workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    print(f"\nreader vs train step, batch {a.batch_size}, config {a.config}, TF {tf.__version__}, "
          f"{os.cpu_count()} CPU(s), data in page cache")
    head = ("model", "format", "rows", "MiB", "gen rows/s", "tf.data samples/s", "numpy samples/s",
            "train step samples/s", "ratio reader/step")
    print(" | ".join(head))
    for model, fmt, n, mib, gen, rd, npr, st, what in rows:
        print(f"{model} | {fmt} | {n} | {mib:.0f} | {gen:,.0f} | {rd:,.0f} | {npr:,.0f} | {st:,.0f} | "
              f"{rd / st:.1f}x {'OK' if rd / st >= 5 else 'BELOW 5x'}")
    for model, *_, what in rows:
        print(f"step model for {model}: {what}")
    print("reproduce: python " + " ".join(shlex.quote(x) for x in ["bench/bench_reader.py"] + (argv or sys.argv[1:])))


if __name__ == "__main__":
    main()
