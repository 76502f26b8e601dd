"""A rank that trains a small Keras model and checkpoints after every step, to be killed mid-write.

    python -m tests.faults.ckpt_writer DIR PROGRESS {replicated|sharded} [--once]

Uses the engine's own checkpointers (recsys.checkpoints.atomic.AtomicCheckpointer, or
recsys.checkpoints.sharded.ShardedCheckpointer on one rank). On start it reports, as one JSON
line in PROGRESS, what a killed predecessor left: every listed checkpoint and whether it is
complete (its weights digest matches the one its meta.json was saved with), the leftovers it
clears, and what it restores. Then it trains one step and saves, forever, appending
"saved <step>" to PROGRESS after each save returns, until it is killed (--once: report, then exit).
"""
from __future__ import annotations

import hashlib
import json
import os
import sys


def digest(variables):
    h = hashlib.sha1()
    for v in variables:
        h.update(v.numpy().tobytes())
    return h.hexdigest()


def main(directory, progress, layout, once=False):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    from recsys.checkpoints.atomic import AtomicCheckpointer, CheckpointError
    from recsys.checkpoints.sharded import ShardedCheckpointer, is_sharded, rank_dir
    from recsys.runtime.distributed import Distributed

    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,), dtype="int64"), tf.keras.layers.Embedding(4000, 32), tf.keras.layers.Flatten(),
                                 tf.keras.layers.Dense(64, activation="relu"), tf.keras.layers.Dense(1)])
    opt = tf.keras.optimizers.Adam(0.01)
    opt.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt, global_step=step)

    def check(path):
        """Complete: meta.json there and the saved weights are the ones it was written with."""
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
        probe = tf.keras.models.clone_model(model)
        probe.build((None, 4))
        prefix = os.path.join(rank_dir(path, 0) if is_sharded(path) else path, "ckpt")
        tf.train.Checkpoint(model=probe).read(prefix).expect_partial()
        return digest(probe.weights) == meta["weights"]

    before = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    reader = AtomicCheckpointer(directory, None, writer=False)
    listed = []
    for s, path in reader.list():
        try:
            ok = check(path)
        except Exception:          # unreadable, missing files: a partial checkpoint was listed
            ok = False
        listed.append({"step": s, "name": os.path.basename(path), "complete": ok})
    dist = Distributed(use_horovod=False)
    if layout == "sharded":
        cp = ShardedCheckpointer(directory, ckpt, model, dist, {"global_step": step}, keep=2)
    else:
        cp = AtomicCheckpointer(directory, ckpt, keep=2)
    restored = None
    if cp.latest() is not None:
        try:
            meta = cp.restore()
            restored = {"step": int(step.numpy()), "meta_step": meta["step"],
                        "weights_ok": digest(model.weights) == meta["weights"]}
        except (CheckpointError, tf.errors.OpError, AssertionError) as exc:
            restored = {"error": str(exc).splitlines()[0]}
    report = {"job": os.environ.get("SLURM_JOB_ID"), "listed": listed, "before": before, "after_recover": sorted(os.listdir(directory)),
              "restored": restored}
    with open(progress, "a") as f:
        f.write(json.dumps(report) + "\n")
        f.flush()
    if once:
        return
    rng = np.random.default_rng(int(step.numpy()))
    while True:
        x = rng.integers(0, 4000, size=(64, 4))
        y = rng.random((64, 1)).astype("float32")
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        step.assign_add(1)
        cp.save(int(step.numpy()), weights=digest(model.weights))
        with open(progress, "a") as f:
            f.write(f"saved {int(step.numpy())}\n")
            f.flush()


if __name__ == "__main__":
    main(*sys.argv[1:4], once="--once" in sys.argv[4:])
