"""--amp with model-parallel tables: the "skip this step, halve the loss scale" decision is one for all ranks.

A model-parallel shard's gradient lives on its owner only, so an fp16 overflow there is seen by one
rank. Keras's LossScaleOptimizer decides from the gradients it is given; the engine feeds it (and the
other optimizer groups) the decision of all ranks, carried in the step's allreduce. Here the
overflow is made on purpose (the engine's test hook, RECSYS_TEST_NONFINITE_SHARD_GRAD=RANK:STEP)
on rank 1's first shard at step 2 of a 2-rank DLRM run under mpirun: both ranks must skip it (the
loss scale halves once on both) and end with the same replicated state, compared value by value in
their own checkpoints, not only through the losses. Before the change rank 1 skipped while rank 0
applied: loss scales 16384 / 32768 and different dense weights, exit 0.

Measured on the shared 2-core test VM: the 2-rank test 65 to 92 s wall (26 s of CPU: two AMP ranks
importing TensorFlow and Horovod, 3 steps, a tiny model); the in-process one under 1 s after
TensorFlow is imported (15 s alone).
"""
import shutil
import subprocess

import numpy as np
import pytest

from conftest import REPO, SMALL, base_env, mpirun_cmd, read_log, summary, train_cmd

pytestmark = [pytest.mark.horovod,
              pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")]

HOOK = "RECSYS_TEST_NONFINITE_SHARD_GRAD"
SCALE = "optimizer_main/loss_scale/current_loss_scale/.ATTRIBUTES/VARIABLE_VALUE"
GOOD_STEPS = "optimizer_main/loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE"


def _rank_state(path):
    """{checkpoint key: value} of one rank's TF checkpoint."""
    import tensorflow as tf
    reader = tf.train.load_checkpoint(str(path / "ckpt"))
    return {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k != "_CHECKPOINTABLE_OBJECT_GRAPH"}


def test_a_shard_overflow_on_one_rank_is_skipped_by_every_rank(tiny_data, tmp_path):
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    args = ["--model", "dlrm", "--data-path", tiny_data("dlrm"), *SMALL["dlrm"], "--epochs", "1", "--max-steps", "3",
            "--log-every", "1", "--amp", "--embedding-placement", "model_parallel", "--eval-batch-size", "4096",
            "--checkpoint-dir", ck, "--log-path", log]
    env = base_env()
    env[HOOK] = "1:2"
    cmd = mpirun_cmd(2, train_cmd(*args))
    cmd[cmd.index("-x"):cmd.index("-x")] = ["-x", HOOK]
    res = subprocess.run(cmd, env=env, cwd=REPO, text=True, capture_output=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]

    final = sorted(p for p in ck.iterdir() if p.name.startswith("ckpt-"))[-1]
    rank0, rank1 = _rank_state(final / "rank-00000"), _rank_state(final / "rank-00001")
    # Both ranks took the skip: Keras's rule halved the scale once (2**15 -> 2**14) and step 3 counted
    # one good step since; neither rank applied step 2 while the other skipped it.
    assert float(rank0[SCALE]) == float(rank1[SCALE]) == 2.0 ** 14
    assert int(rank0[GOOD_STEPS]) == int(rank1[GOOD_STEPS]) == 1
    # Every replicated value (dense weights, counters, the loss scale) equal on both ranks, bitwise;
    # the shards (keys of one rank only) differ by design.
    shared = sorted(set(rank0) & set(rank1))
    assert sum(k.startswith(("model/bottom/", "model/top/")) for k in shared) == 10
    for key in shared:
        np.testing.assert_array_equal(rank0[key], rank1[key], err_msg=key)
    s = summary(read_log(log))
    assert s["step"] == 3 and len(set(s["replica_state_digests"])) == 1
    assert np.isfinite(s["final_loss"])


def test_the_replica_check_samples_every_variable_at_any_size_and_stops_a_drifted_run(tiny_data):
    """The replica digest reads fixed rows of every replicated variable (tables too) and the loss scale,
    never a whole variable, so it runs at any model size; digests that differ between ranks stop the
    run (exit 1). One rank in this process; the second rank's digest is given."""
    import tensorflow as tf

    from conftest import in_process_task
    from recsys.engine import REPLICA_SAMPLE_ROWS, Engine
    from recsys.errors import DivergedError
    from recsys.runtime.distributed import Distributed
    config, task, dist, log = in_process_task(["--model", "dlrm", "--data-path", tiny_data("dlrm"), *SMALL["dlrm"],
                                               "--amp"])
    engine = Engine(config, task, dist, log)
    first = engine.replica_digest()
    assert engine.replica_digest() == first
    table = max(engine.state.replicated_weights, key=lambda v: int(v.shape[0]))
    rows = int(table.shape[0])
    assert rows > 2 * REPLICA_SAMPLE_ROWS        # so the sampled rows are more than one apart
    table.scatter_add(tf.IndexedSlices(tf.ones([1, table.shape[1]]), tf.constant([1])))
    unsampled = engine.replica_digest()          # row 1 lies between sampled rows: not seen (a sample)
    assert unsampled == first
    table.scatter_add(tf.IndexedSlices(tf.ones([1, table.shape[1]]), tf.constant([rows - 1])))
    assert engine.replica_digest() != unsampled  # the last row is sampled
    before = engine.replica_digest()
    engine.loss_scaler._loss_scale.current_loss_scale.assign(2.0 ** 14)
    assert engine.replica_digest() != before     # so is the loss scale

    class TwoRanks(Distributed):
        size = 2

        def allgather_object(self, obj):
            return [obj, "0" * 40]
    engine.guards.dist = TwoRanks(use_horovod=False)
    with pytest.raises(DivergedError, match=r"step 7: the replicated weights of rank\(s\) \[1\] differ from rank 0's"):
        engine.guards.check_replicas(7)
