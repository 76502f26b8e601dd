"""Issue 37 item 7 in the engine: the early stop's count goes on across a --restore (a requeue) as in
a run that was never stopped, the best checkpoint outlives --keep-checkpoints, and two ranks stop at
the same evaluation (the restored run has two: one run checks both, CI time being scarce). The pure rules are
tests/recsys/test_early_stop.py's.

``--early-stop-min-delta 1`` makes every evaluation after the first one count against the patience
(no AUC gains 1), so where the run stops does not depend on what it learns."""
from __future__ import annotations

import json
import subprocess

from conftest import REPO, SMALL, base_env, in_process_task, mpirun_cmd, read_log, records, summary, train_cmd

# tiny DLRM: 8192 training rows, batch 1024 -> 8 steps per epoch
FLAGS = [*SMALL["dlrm"], "--batch-size", "1024", "--early-stop-patience", "2", "--early-stop-min-delta", "1",
         "--keep-best", "--keep-checkpoints", "1"]


def test_restore_goes_on_counting_two_ranks_stop_together_and_the_best_checkpoint_is_kept(tiny_data, tmp_path):
    data, ck = tiny_data("dlrm"), tmp_path / "ck"
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    # epochs 1 and 2, in this process (TensorFlow is loaded once for the session's in-process tests):
    # one evaluation counted against the best since epoch 1
    import tensorflow as tf
    from recsys.engine import Engine
    config, task, dist, run_log = in_process_task(["--model", "dlrm", "--data-path", data, *FLAGS, "--epochs", "2",
                                                   "--checkpoint-dir", ck], log_path=first)
    tf.keras.utils.set_random_seed(config.seed)
    Engine(config, task, dist, run_log).train()
    run_log.close()
    log = read_log(first)
    s, aucs = summary(log), {e["step"]: e["auc"] for e in records(log, "eval")}
    assert s["early_stopped"] is None and s["best_eval"]["step"] == max(aucs, key=aucs.get)
    # epoch 2's checkpoint was saved before its evaluation: it holds the count of epoch 1's
    meta = json.loads((ck / "ckpt-0000000016" / "meta.json").read_text())
    assert meta["early_stop"]["last_step"] == 8 and meta["early_stop"]["since_best"] == 0
    # the restored run, on two ranks (the same global batch: 8 steps per epoch), evaluates epoch 2
    # again, trains epoch 3 and stops there, as a straight run would have (without the count it would
    # stop at epoch 4, without the re-evaluation too). Rank 0's metric decides for both: a rank that
    # went on alone would wait in its next allreduce until the timeout.
    res = subprocess.run(mpirun_cmd(2, train_cmd("--model", "dlrm", "--data-path", data, *FLAGS, "--epochs", "10",
                                                 "--checkpoint-dir", ck, "--restore", "--log-path", second)),
                         env=base_env(), cwd=REPO, text=True, capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    log = read_log(second)
    s = summary(log)
    assert [e["step"] for e in records(log, "eval")] == [16, 24]
    assert records(log, "eval")[0]["auc"] == aucs[16]          # the same weights evaluated again
    aucs.update({e["step"]: e["auc"] for e in records(log, "eval")})
    best = max(aucs, key=aucs.get)
    assert s["early_stopped"] == {"step": 24, "epoch": 3, "patience": 2} and s["step"] == 24
    assert "early stop at epoch 3 step 24" in res.stderr
    assert s["world_size"] == 2 and len(set(s["replica_state_digests"])) == 1
    # --keep-checkpoints 1 keeps the newest, and the best besides
    kept = str(ck / f"ckpt-{best:010d}")
    assert s["best_eval"]["step"] == best and s["best_eval"]["checkpoint"] == kept
    assert sorted(p.name for p in ck.glob("ckpt-*")) == sorted({f"ckpt-{best:010d}", "ckpt-0000000024"})
    assert json.loads((ck / "best.json").read_text())["checkpoint"] == kept

