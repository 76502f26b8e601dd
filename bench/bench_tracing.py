"""What tracing the training step costs a process, with AutoGraph and as written (recsys.runtime.tracing).

Every engine process traces its step once: the test suite starts hundreds of them, a study one
per point and rank. For each model, two fresh processes per round (AutoGraph caches what it
converted, so a variant never follows the other in one process) build the engine on the same
synthetic data and seed, then call the training step, and the prediction, twice:

* ``autograph``: ``tf.function(fn)``, as the engine did before: AutoGraph converts the step and
  every function and Keras layer it calls;
* ``as-written``: ``recsys.runtime.tracing.graph_function(fn)``, what the engine does now.

The first call's CPU time less the second's is the trace. The first step's loss must be the same
in both (same graph, same numbers), else exit 1. Prints the median of the rounds, the ratio and
the command.

    python bench/bench_tracing.py [--models dlrm,wide_deep,ncf] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
VARIANTS = ("autograph", "as-written")
ROWS = {"dlrm": {"train": 4096, "test": 1024}, "wide_deep": {"train": 4096, "test": 1024}, "ncf": {"train": 4096}}


def _child(model: str, variant: str, data_dir: str) -> dict:
    """In a fresh process: the two calls of the step and of the prediction, in CPU seconds."""
    import tensorflow as tf

    from recsys.data import synthetic
    from recsys.engine import Engine
    from recsys.features.spec import FeatureSpec
    from recsys.models.tasks import TASKS
    from recsys.monitoring.logger import RunLogger
    from recsys.runtime.distributed import Distributed
    from recsys.runtime.tracing import graph_function
    from recsys.train import build_parser, resolve

    if not os.path.exists(os.path.join(data_dir, "feature_spec.yaml")):
        synthetic.generate(synthetic.default_spec(model, num_files=1), data_dir, ROWS[model], seed=1)
    config = resolve(build_parser().parse_args(["--model", model, "--data-path", data_dir]))
    tf.keras.utils.set_random_seed(0)
    dist, log = Distributed(use_horovod=False), RunLogger(None, enabled=False)
    task = TASKS[model](config, FeatureSpec.from_yaml(config.feature_spec), dist, log)
    engine = Engine(config, task, dist, log)
    wrap = (lambda fn: tf.function(fn, reduce_retracing=True)) if variant == "autograph" else \
        (lambda fn: graph_function(fn, reduce_retracing=True))
    inputs, labels = task.sample_batch()
    out = {}
    for name, fn, args in (("step", wrap(engine.step._train_step_impl), (inputs, labels)),
                           ("predict", wrap(engine.step._predict_impl), (inputs,))):
        c0 = time.process_time()
        first = fn(*args)
        c1 = time.process_time()
        fn(*args)
        c2 = time.process_time()
        out[f"{name}_trace_s"] = (c1 - c0) - (c2 - c1)
        if name == "step":
            out["first_loss"] = float(first[0])
    return out


def _run(model: str, variant: str, data_dir: str) -> dict:
    res = subprocess.run([sys.executable, __file__, "--child", model, variant, data_dir],
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        raise SystemExit(f"bench_tracing: {model} {variant} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="dlrm,wide_deep,ncf")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        print(json.dumps(_child(*a.child)))
        return 0
    print(f"load average (1 min) at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("| model | step trace, AutoGraph | step trace, as written | ratio | prediction trace, "
          "AutoGraph | as written | first loss equal |")
    print("|---|---|---|---|---|---|---|")
    same_everywhere = True
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models.split(","):
            data_dir = os.path.join(tmp, model)
            runs = {v: [] for v in VARIANTS}
            for _ in range(a.rounds):
                for variant in VARIANTS:
                    runs[variant].append(_run(model, variant, data_dir))
            med = {v: {k: statistics.median(r[k] for r in runs[v]) for k in ("step_trace_s", "predict_trace_s")}
                   for v in VARIANTS}
            losses = {r["first_loss"] for v in VARIANTS for r in runs[v]}
            same = len(losses) == 1
            same_everywhere &= same
            ag, aw = med["autograph"], med["as-written"]
            print(f"| {model} | {ag['step_trace_s']:.2f} s | {aw['step_trace_s']:.2f} s | "
                  f"{ag['step_trace_s'] / aw['step_trace_s']:.2f}x | {ag['predict_trace_s']:.2f} s | "
                  f"{aw['predict_trace_s']:.2f} s | {'yes' if same else f'no: {sorted(losses)}'} |")
    print(f"\ncommand: python bench/bench_tracing.py --models {a.models} --rounds {a.rounds}")
    return 0 if same_everywhere else 1


if __name__ == "__main__":
    sys.exit(main())
