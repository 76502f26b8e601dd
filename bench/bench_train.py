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
run (n x n by n x n, n = 1024 and 2048, best of readings before and after), and so
is a training step of DLRM's MLPs alone at the reference sizes. Prints a table and the reproduce command.

    python bench/bench_train.py [--models dlrm,wide_deep,ncf] [--steps 60] [--warmup 10] [--threads 0]

It prints the 1-minute load average over the run and the core count; above the core count it
prints the figures but no verdict (exit 3). Verdict: engine / fit >= 1.2x for every model with the
reader from disk (exit 0 met, 1 not met).
"""
from __future__ import annotations

import argparse
import dataclasses
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


def _engine_throughput(engine, task, config, steps, warmup, dataset=None, steps_per_call=None):
    """Samples/s of the engine's training calls (``Engine._train_call``, what ``train`` runs, with
    ``steps_per_call`` steps per call; default: the engine's), warm-up calls excluded."""
    spc = steps_per_call or config.steps_per_call
    saved, engine._steps_per_call = engine._steps_per_call, spc
    try:
        it = iter(dataset if dataset is not None else task.benchmark_dataset())

        def run(n):
            done = 0
            while done < n:
                done += len(engine._train_call(it, min(spc, n - done))[0])
        run(warmup)
        t0 = time.perf_counter()
        run(steps)
        return steps * config.batch_size / (time.perf_counter() - t0)
    finally:
        engine._steps_per_call = saved


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


def _reference_mlp_flops(batch=2048, steps=10):
    """FLOP/s of a training step (forward, backward, SGD update) of DLRM's MLPs alone at the
    reference sizes (bottom 512-256-128 over 13 numericals, top 1024-1024-512-256-1 over the dot
    interaction of 27 128-wide vectors: 128 + 351 inputs), counted as 3 x forward multiply-adds x 2;
    best of 3 runs of ``steps`` steps."""
    import tensorflow as tf
    from recsys.models.mlp import mlp
    bottom, top = mlp([512, 256, 128], "bottom"), mlp([1024, 1024, 512, 256, 1], "top", last_linear=True)
    xb, xt = tf.random.normal([batch, 13]), tf.random.normal([batch, 128 + 27 * 26 // 2])
    y = tf.cast(tf.random.uniform([batch, 1]) < 0.25, tf.float32)
    opt = tf.keras.optimizers.SGD(0.01)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            logits = top(xt) + tf.reduce_sum(bottom(xb), axis=1, keepdims=True)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))
        variables = bottom.trainable_variables + top.trainable_variables
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss
    step().numpy()
    flops = 0
    for seq in (bottom, top):
        for layer in seq.layers:
            k = layer.kernel.shape
            flops += 2 * int(k[0]) * int(k[1])
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = step()
        loss.numpy()
        best = max(best, 3 * flops * batch * steps / (time.perf_counter() - t0))
    return best


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


GOAL = 1.2   # engine / model.fit with the reader from disk, every model (issue 25)


def _load():
    """(1-minute load average, cores): a verdict needs the load at or below the core count."""
    return os.getloadavg()[0], os.cpu_count()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="dlrm,wide_deep,ncf")
    p.add_argument("--steps", type=int, default=60, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps before timing")
    p.add_argument("--repeats", type=int, default=2, help="alternating measurements; the median of each is kept")
    p.add_argument("--steps-per-call", type=int, default=None,
                   help="engine training steps per compiled call (default: the engine's default, "
                        "recsys.config.TrainConfig.steps_per_call); one step per call is measured alongside")
    p.add_argument("--threads", type=int, default=0, help="TF intra-op threads (0: TF default)")
    p.add_argument("--data-dir", default=None, help="where the synthetic datasets are kept (default: a temp dir)")
    a = p.parse_args(argv)
    import statistics
    import tensorflow as tf
    if a.threads:
        tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    base = a.data_dir or tempfile.mkdtemp(prefix="bench-train-")
    loads = [_load()[0]]
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    flops_line = None
    for model in a.models.split(","):
        config = _setup(model, os.path.join(base, model), a.threads)
        if a.steps_per_call:
            config = dataclasses.replace(config, steps_per_call=a.steps_per_call)
        engine, task = _engine(config)
        fitted = _fit_model(config, task, a.steps, a.warmup)
        # Alternate the four and keep the median of each: the machine may be shared.
        eng, one, mem, fit = [], [], [], []
        for _ in range(a.repeats):
            eng.append(_engine_throughput(engine, task, config, a.steps, a.warmup))
            fit.append(_fit_throughput(fitted, config, a.steps, a.warmup))
            one.append(_engine_throughput(engine, task, config, a.steps, a.warmup, steps_per_call=1))
            mem.append(_engine_throughput(engine, task, config, a.steps, a.warmup, fitted[3]))
            loads.append(_load()[0])
        eng, one, mem, fit = (statistics.median(v) for v in (eng, one, mem, fit))
        rows.append((model, " ".join(CONFIG[model]), eng, one, mem, fit))
        if model == "dlrm":
            # The peak is read before and after the reference MLPs (the best reading): on a shared
            # machine a single reading can land in a busier moment than the MLP step it is compared with.
            peak = _matmul_peak()
            ref = _reference_mlp_flops()
            peak = max(peak, _matmul_peak(), _matmul_peak(2048, 3))
            flops_line = (3 * engine.model.mlp_flops_per_sample() * eng, ref, peak)
    load, cores = max(loads), _load()[1]
    from recsys.config import TrainConfig
    spc = a.steps_per_call or TrainConfig.steps_per_call
    print(f"\n{started}; CPU cores available: {len(os.sched_getaffinity(0))} (os.cpu_count {cores}); "
          f"1-minute load average {min(loads):.2f}-{load:.2f} during the run; TF {tf.__version__}; "
          f"median of {a.repeats} alternating runs of {a.steps} timed steps after {a.warmup} warm-up steps; "
          f"engine at {spc} steps per call\n")
    print("| model | configuration | engine, reader from disk | engine, 1 step per call, disk "
          "| engine, in-memory batches | model.fit, in-memory | engine / fit (disk) | engine / fit (in-memory) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for model, cfg, eng, one, mem, fit in rows:
        print(f"| {model} | `{cfg}` | {eng:,.0f} | {one:,.0f} | {mem:,.0f} | {fit:,.0f} | {eng / fit:.2f}x "
              f"| {mem / fit:.2f}x |")
    print("(samples/s, global batch as configured)")
    if flops_line:
        mlp, ref, peak = flops_line
        print(f"\nDLRM MLPs (this configuration, in the engine's step, reader from disk): {mlp / 1e9:.2f} GFLOP/s = "
              f"{mlp / peak:.1%} of the tf.matmul peak {peak / 1e9:.1f} GFLOP/s (1024^3 and 2048^3 fp32, "
              f"best reading of the run)")
        print(f"DLRM MLPs at the reference sizes (512-256-128 / 1024-1024-512-256-1, batch 2048, training step "
              f"of the MLPs alone): {ref / 1e9:.2f} GFLOP/s = {ref / peak:.1%} of that peak (goal >= 50 %)")
    print("\nreproduce: python " + " ".join(shlex.quote(x) for x in [sys.argv[0]] + (argv or sys.argv[1:])))
    if load > cores:
        print(f"no verdict: load {load:.2f} above {cores} cores (figures printed, not judged)")
        return 3
    worst = min(eng / fit for _, _, eng, _, _, fit in rows)
    ok = worst >= GOAL
    print(f"verdict: engine / model.fit (reader from disk) is at least {worst:.2f}x for every model: "
          f"goal {GOAL}x {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    sys.exit(main())
