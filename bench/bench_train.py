"""Training-step throughput of the engine vs plain Keras ``model.fit``, and DLRM's MLP FLOP/s vs a matmul peak.

For each model, at a stated small CPU configuration, in one process:

* engine: ``recsys.engine.Engine`` train steps fed by the real input pipeline
  (synthetic files on disk -> recsys.data reader -> tf.data, prefetching);
* engine on in-memory batches: the same step fed the baseline's numpy batches
  (isolates the step from the reader, which shares the CPU cores with it);
* baseline: the same Keras model class, compiled with the same loss and
  optimizer (W&D: one RMSprop for both parts, as fit takes one optimizer),
  ``model.fit`` on in-memory numpy tensors of the same batches and batch size.

Both exclude ``--warmup`` steps (tracing). DLRM's achieved MLP FLOP/s
(3 x forward multiply-adds x 2 of the bottom+top MLPs per sample x samples/s)
is reported as a fraction of a float32 ``tf.matmul`` peak measured in the same
run (n x n by n x n, best of a few). Prints a table and the reproduce command.

    python bench/bench_train.py [--models dlrm,wide_deep,ncf] [--steps 60] [--warmup 10] [--threads 0]
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Stated configuration (global batch; small model sizes fit for 2 CPU cores).
CONFIG = {
    "dlrm": ["--batch-size", "2048", "--embedding-dim", "32", "--bottom-mlp", "128,64,32",
             "--top-mlp", "256,128,1", "--lr", "0.5", "--warmup-steps", "10", "--decay-steps", "0"],
    "wide_deep": ["--batch-size", "2048", "--embedding-dim", "16", "--deep-hidden-units", "256,256,256",
                  "--lr", "0.001"],
    "ncf": ["--batch-size", "8192", "--factors", "16", "--layers", "64,32,16", "--lr", "0.002"],
}
ROWS = {"dlrm": 65536, "wide_deep": 65536, "ncf": 60000}


def _setup(model, data_dir, threads):
    from recsys.data import synthetic
    from recsys.train import build_parser, resolve
    spec_path = os.path.join(data_dir, "feature_spec.yaml")
    if not os.path.exists(spec_path):
        rows = {"train": ROWS[model], "test": 8192} if model != "ncf" else {"train": ROWS[model]}
        synthetic.generate(synthetic.default_spec(model, num_files=2), data_dir, rows, seed=1)
    return resolve(build_parser().parse_args(
        ["--model", model, "--data-path", data_dir, *CONFIG[model], "--eval-batch-size", "8192",
         "--intra-op-threads", str(threads)]))


def _engine(config):
    import tensorflow as tf
    from recsys.distributed import Distributed
    from recsys.engine import Engine
    from recsys.feature_spec import FeatureSpec
    from recsys.logger import RunLogger
    from recsys.models.tasks import TASKS
    tf.keras.utils.set_random_seed(0)
    dist, log = Distributed(use_horovod=False), RunLogger(None, enabled=False)
    task = TASKS[config.model](config, FeatureSpec.from_yaml(config.feature_spec), dist, log)
    return Engine(config, task, dist, log), task


def _engine_throughput(engine, task, config, steps, warmup, dataset=None):
    it = iter(dataset if dataset is not None else task.benchmark_dataset())
    for _ in range(warmup):
        engine._train_step(*next(it))[0].numpy()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss, _ = engine._train_step(*next(it))
    loss.numpy()
    return steps * config.batch_size / (time.perf_counter() - t0)


def _fit_model(config, task, steps, warmup):
    """The same model class compiled for fit, and in-memory numpy copies of the same batches."""
    import numpy as np
    import tensorflow as tf
    tf.keras.utils.set_random_seed(0)
    model = task.build_model()
    batches = list(task.benchmark_dataset().take(min(steps + warmup, 64)).as_numpy_iterator())
    while len(batches) < steps + warmup:
        batches += batches[:steps + warmup - len(batches)]

    def stack(items):
        if isinstance(items[0], dict):
            return {k: stack([b[k] for b in items]) for k in items[0]}
        return np.concatenate(items)
    x = stack([b[0] for b in batches])
    y = stack([b[1] for b in batches])
    opt = {"dlrm": lambda: tf.keras.optimizers.SGD(config.lr),
           "wide_deep": lambda: tf.keras.optimizers.RMSprop(config.lr, rho=0.5),
           "ncf": lambda: tf.keras.optimizers.Adam(config.lr)}[config.model]()
    model.compile(optimizer=opt, loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
    # The same in-memory batches for the engine (isolates the step from the file reader).
    in_memory = tf.data.Dataset.from_tensor_slices(
        (tf.nest.map_structure(lambda a: a.reshape((-1, config.batch_size) + a.shape[1:]), x),
         y.reshape(-1, config.batch_size, 1))).cache().repeat()
    return model, x, y, in_memory


def _fit_throughput(fitted, config, steps, warmup):
    import tensorflow as tf
    model, x, y, _ = fitted

    class Timer(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == warmup:
                self.t0 = time.perf_counter()

        def on_train_end(self, logs=None):
            self.t1 = time.perf_counter()
    timer = Timer()
    model.fit(x, y, batch_size=config.batch_size, epochs=1, shuffle=False, verbose=0, callbacks=[timer])
    return steps * config.batch_size / (timer.t1 - timer.t0)


def _matmul_peak(n=1024, reps=10):
    import tensorflow as tf
    a = tf.random.normal([n, n])
    b = tf.random.normal([n, n])
    f = tf.function(lambda a, b: tf.matmul(a, b))
    f(a, b).numpy()
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            c = f(a, b)
        c.numpy()
        best = max(best, 2 * n ** 3 * reps / (time.perf_counter() - t0))
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="dlrm,wide_deep,ncf")
    p.add_argument("--steps", type=int, default=60, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before timing")
    p.add_argument("--repeats", type=int, default=2, help="alternating measurements; the best of each is kept")
    p.add_argument("--threads", type=int, default=0, help="TF intra-op threads (0: TF default)")
    p.add_argument("--data-dir", default=None, help="where the synthetic datasets are kept (default: a temp dir)")
    a = p.parse_args(argv)
    import tensorflow as tf
    if a.threads:
        tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    base = a.data_dir or tempfile.mkdtemp(prefix="bench-train-")
    rows = []
    flops_line = None
    for model in a.models.split(","):
        config = _setup(model, os.path.join(base, model), a.threads)
        engine, task = _engine(config)
        fitted = _fit_model(config, task, a.steps, a.warmup)
        # Alternate the two and keep the best of each: the machine may be shared.
        eng, mem, fit = 0.0, 0.0, 0.0
        for _ in range(a.repeats):
            eng = max(eng, _engine_throughput(engine, task, config, a.steps, a.warmup))
            mem = max(mem, _engine_throughput(engine, task, config, a.steps, a.warmup, fitted[3]))
            fit = max(fit, _fit_throughput(fitted, config, a.steps, a.warmup))
        rows.append((model, " ".join(CONFIG[model]), eng, mem, fit))
        if model == "dlrm":
            peak = _matmul_peak()
            mlp = 3 * engine.model.mlp_flops_per_sample() * eng
            flops_line = (mlp, peak)
    print(f"\nCPU cores available: {len(os.sched_getaffinity(0))}; TF {tf.__version__}; "
          f"best of {a.repeats} alternating runs of {a.steps} timed steps after {a.warmup} warm-up steps\n")
    print("| model | configuration | engine, reader from disk | engine, in-memory batches | model.fit, in-memory "
          "| engine / fit (disk) | engine / fit (in-memory) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for model, cfg, eng, mem, fit in rows:
        print(f"| {model} | `{cfg}` | {eng:,.0f} | {mem:,.0f} | {fit:,.0f} | {eng / fit:.2f}x | {mem / fit:.2f}x |")
    print("(samples/s, global batch as configured)")
    if flops_line:
        mlp, peak = flops_line
        print(f"\nDLRM MLP achieved {mlp / 1e9:.2f} GFLOP/s = {mlp / peak:.1%} of the tf.matmul peak "
              f"{peak / 1e9:.1f} GFLOP/s (1024^3 fp32, same run)")
    print("\nreproduce: python " + " ".join(shlex.quote(x) for x in [sys.argv[0]] + (argv or sys.argv[1:])))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    sys.exit(main())
