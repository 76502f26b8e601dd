"""Checkpoints: atomic layout, exact resume (same weights as an uninterrupted run), USR2 -> save + exit 0,
evaluate-only from a checkpoint, identical predictions after restore."""
import json
import os
import signal
import subprocess
import time

import numpy as np
import pytest

from conftest import REPO, SMALL, base_env, read_log, records, run_train, summary, train_cmd


def _dlrm(data, *extra):
    return ["--model", "dlrm", "--data-path", data, *SMALL["dlrm"], *extra]


def test_resume_continues_exact_step_and_weights(tiny_data, tmp_path):
    data = tiny_data("dlrm")
    # uninterrupted: 20 steps (epoch 0 has 32)
    straight = tmp_path / "straight.jsonl"
    res = run_train(_dlrm(data, "--epochs", "1", "--max-steps", "20", "--log-path", straight, "--log-every", "1"))
    assert res.returncode == 0, res.stderr[-3000:]
    # interrupted at step 8, resumed to 20
    ck = tmp_path / "ck"
    first = tmp_path / "first.jsonl"
    res = run_train(_dlrm(data, "--epochs", "1", "--max-steps", "8", "--checkpoint-dir", ck, "--log-path", first))
    assert res.returncode == 0, res.stderr[-3000:]
    meta = json.loads((ck / "ckpt-0000000008" / "meta.json").read_text())
    assert (meta["step"], meta["epoch"], meta["step_in_epoch"]) == (8, 0, 8)
    assert not [p for p in os.listdir(ck) if p.startswith(".tmp")]          # nothing half-written left
    second = tmp_path / "second.jsonl"
    res = run_train(_dlrm(data, "--epochs", "1", "--max-steps", "20", "--checkpoint-dir", ck, "--restore",
                          "--log-path", second, "--log-every", "1"))
    assert res.returncode == 0, res.stderr[-3000:]
    log2 = read_log(second)
    steps = [r["step"] for r in records(log2, "step")]
    assert steps[0] == 9 and steps[-1] == 20
    a, b = summary(read_log(straight)), summary(log2)
    assert b["step"] == 20
    assert a["weights_digest"] == b["weights_digest"]     # bitwise the same model as without interruption
    assert a["auc"] == pytest.approx(b["auc"], abs=1e-9)
    # evaluate-only from the checkpoint gives the metrics of the end of training
    ev = tmp_path / "eval.jsonl"
    res = run_train(_dlrm(data, "--run-mode", "evaluate", "--checkpoint-dir", ck, "--log-path", ev))
    assert res.returncode == 0, res.stderr[-3000:]
    se = summary(read_log(ev))
    assert se["mode"] == "evaluate" and se["step"] == 20
    assert se["auc"] == pytest.approx(b["auc"], abs=1e-9)


def test_usr2_saves_checkpoint_and_exits_zero(tiny_data, tmp_path):
    data = tiny_data("dlrm")
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    proc = subprocess.Popen(train_cmd(*_dlrm(data, "--epochs", "1000", "--checkpoint-dir", ck, "--log-path", log,
                                             "--log-every", "1")),
                            env=base_env(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while not (log.exists() and records(read_log(log), "step")):
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "training never logged a step"
            time.sleep(0.2)
        proc.send_signal(signal.SIGUSR2)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    assert "checkpoint saved on signal" in err
    s = summary(read_log(log))
    assert s["interrupted"] is True
    meta = json.loads((ck / f"ckpt-{s['step']:010d}" / "meta.json").read_text())
    assert meta["reason"] == "signal" and meta["step"] == s["step"]


def test_restore_gives_identical_predictions(tiny_data, tmp_path):
    """In-process: train a few steps, save, rebuild everything, restore: same predictions, same counters."""
    import tensorflow as tf
    from recsys.engine import Engine
    from recsys.features.spec import FeatureSpec
    from recsys.models.tasks import TASKS
    from recsys.monitoring.logger import RunLogger
    from recsys.runtime.distributed import Distributed
    from recsys.train import build_parser, resolve

    data = tiny_data("wide_deep")      # two optimizers (FTRL + RMSprop) to restore
    args = resolve(build_parser().parse_args(
        ["--model", "wide_deep", "--data-path", str(data), *SMALL["wide_deep"], "--deep-dropout", "0",
         "--checkpoint-dir", str(tmp_path / "ck")]))
    spec = FeatureSpec.from_yaml(args.feature_spec)
    dist, log = Distributed(use_horovod=False), RunLogger(None)

    def engine():
        tf.keras.utils.set_random_seed(args.seed + len(engines))  # different init: restore must overwrite it
        e = Engine(args, TASKS["wide_deep"](args, spec, dist, log), dist, log)
        engines.append(e)
        return e
    engines = []
    e1 = engine()
    batches = list(e1.task.train_dataset(0).take(3))
    for x, y in batches:
        e1.step.train_step(x, y)
    e1.save("test")
    x_eval, _ = next(iter(e1.task.eval_dataset()))
    p1 = e1.predict(x_eval).numpy()
    e2 = engine()
    assert not np.array_equal(e2.predict(x_eval).numpy(), p1)
    e2.restore()
    assert int(e2.global_step.numpy()) == 3 and int(e2.step_in_epoch.numpy()) == 3
    np.testing.assert_array_equal(e2.predict(x_eval).numpy(), p1)
    # optimizer state restored too: one more identical step keeps them identical
    for e in (e1, e2):
        e.step.train_step(*batches[0])
    np.testing.assert_array_equal(e2.predict(x_eval).numpy(), e1.predict(x_eval).numpy())
