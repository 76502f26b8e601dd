"""Model-parallel embedding tables on Horovod alltoall, with real ranks (mpirun, srun --mpi=pmix).

DLRM (2 ranks under mpirun, 4 under srun --mpi=pmix) and Wide & Deep (2 and 4 ranks): the model-parallel
runs are compared with replicated runs of the same world size: same data
per rank, same initial weights (tables are seeded per column and block of rows), so only the floating-point
order of the gradient sums differs. Stated tolerance: losses within 1e-5 absolute, final
weights within rtol 1e-4 / atol 1e-6 (observed: DLRM on 2 ranks, 8 steps, bitwise equal).
"""
import json
import shutil
import subprocess

import numpy as np
import pytest

from conftest import MPI_ENV, REPO, SMALL, base_env, finish, finish_all, mpirun_cmd, read_log, records, run_train, \
    start_train, summary, train_cmd

pytestmark = [pytest.mark.horovod,
              pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")]

LOSS_TOL = 1e-5
WEIGHT_RTOL, WEIGHT_ATOL = 1e-4, 1e-6
STEPS = 8


def _args(model, data, placement, ck, log, *extra):
    return ["--model", model, "--data-path", data, *SMALL[model], "--epochs", "1", "--max-steps", STEPS,
            "--log-every", "1", "--embedding-placement", placement, "--checkpoint-dir", ck, "--log-path", log,
            *(["--deep-dropout", "0"] if model == "wide_deep" else []), *extra]


def _mpirun(np_, args, timeout=400):
    res = subprocess.run(mpirun_cmd(np_, train_cmd(*args)), env=base_env(), cwd=REPO, text=True,
                         capture_output=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _start(tmp, np_, model, data, placement, *extra):
    """An mpirun run started and not waited for: (process, checkpoint dir, log)."""
    ck, log = tmp / f"ck-{placement}", tmp / f"{placement}.jsonl"
    return start_train(np_, _args(model, data, placement, ck, log, *extra)), ck, log


def _result(res, ck, log):
    assert res.returncode == 0, res.stderr[-3000:]
    return dict(log=read_log(log), ck=ck, stderr=res.stderr)


def _runs(tmp, np_, model, data, placements, *extra):
    """The runs of several placements side by side (conftest.finish_all): {placement: run}."""
    started = [_start(tmp, np_, model, data, p, *extra) for p in placements]
    done = finish_all([proc for proc, _, _ in started], timeout=400)
    return {p: _result(res, ck, log) for p, res, (_, ck, log) in zip(placements, done, started)}


def _latest(ck):
    return sorted(p for p in ck.iterdir() if p.name.startswith("ckpt-"))[-1]


def _weights(ck):
    from recsys.checkpoints.contents import checkpoint_weights
    return checkpoint_weights(str(_latest(ck)))


def _assert_same_training(mp, rep):
    lm = [(r["step"], r["loss"]) for r in records(mp["log"], "step")]
    lr = [(r["step"], r["loss"]) for r in records(rep["log"], "step")]
    assert len(lm) == STEPS and [s for s, _ in lm] == [s for s, _ in lr]
    np.testing.assert_allclose([x for _, x in lm], [x for _, x in lr], rtol=0, atol=LOSS_TOL)
    wm, wr = _weights(mp["ck"]), _weights(rep["ck"])
    assert sorted(wm) == sorted(wr) and any(k.startswith("table:") for k in wm)
    for key in wr:
        np.testing.assert_allclose(wm[key], wr[key], rtol=WEIGHT_RTOL, atol=WEIGHT_ATOL, err_msg=key)
    assert summary(mp["log"])["step"] == STEPS


def _assert_each_rank_holds_its_plan_share(ck, world, column_slice_threshold=None, data_parallel_threshold=None):
    from recsys.placement.decision import plan_for_group
    path = _latest(ck)
    meta = json.loads((path / "meta.json").read_text())
    assert meta["world_size"] == world and meta["writers"] == list(range(world))
    for group, info in meta["groups"].items():
        plan = plan_for_group(info["cardinalities"], info["dims"], world, column_slice_threshold,
                              data_parallel_threshold)
        for r in range(world):
            listing = json.loads((path / f"rank-{r:05d}" / "tables.json").read_text())
            held = sorted((p["table"], p["col_start"], p["col_end"], tuple(p["shape"])) for p in listing
                          if p["group"] == group)
            want = sorted((s.table, s.col_start, s.col_end, (s.rows, s.col_end - s.col_start))
                          for s in plan.slices if s.rank == r and (not s.replicated or r == 0))
            assert held == want, (group, r)
            assert held, f"rank {r} holds no table of {group}"


def _assert_exchange_and_initial_state(run):
    """Replicated: the tables are seeded on every rank, not broadcast (only the dense weights are), and
    their averaged gradients stay IndexedSlices (allgathered rows, never a dense table-sized allreduce).
    Model parallel: the shards stay local. Both: the checkpoint's dense weights are all that was broadcast."""
    weights = _weights(run["ck"])
    tables = [k for k in weights if k.startswith("table:")]
    dense_bytes = sum(w.nbytes for k, w in weights.items() if k.startswith("dense:"))
    (state,) = records(run["log"], "initial_state")
    (exchange,) = records(run["log"], "gradient_exchange")
    assert state["broadcast_bytes"] == dense_bytes > 0
    assert not exchange["sparse_as_dense"]
    if exchange["local"] == 0:                                 # replicated
        assert state["seeded_table_bytes"] == sum(weights[k].nbytes for k in tables) and state["local_bytes"] == 0
        assert exchange["allgathered_indexed_slices"] == len(tables)
        assert exchange["allreduced_dense_bytes"] == dense_bytes
        assert len(set(summary(run["log"])["replica_weight_digests"])) == 1     # identical without a broadcast
    else:
        assert state["seeded_table_bytes"] == 0 and state["local_bytes"] > 0
        assert exchange["allgathered_indexed_slices"] == 0 and exchange["allreduced_dense_bytes"] == dense_bytes


@pytest.fixture(scope="module")
def dlrm_two_rank_runs(tiny_data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dlrm-mp")
    data = tiny_data("dlrm")
    return tmp, _runs(tmp, 2, "dlrm", data, ("replicated", "model_parallel"))


def test_dlrm_two_ranks_model_parallel_matches_replicated(dlrm_two_rank_runs):
    _, runs = dlrm_two_rank_runs
    mp, rep = runs["model_parallel"], runs["replicated"]
    _assert_same_training(mp, rep)
    _assert_exchange_and_initial_state(rep)
    _assert_exchange_and_initial_state(mp)
    assert "implementation: horovod-alltoall" in mp["stderr"]
    placement = records(mp["log"], "placement")[-1]
    assert placement["model_parallel"] and placement["implementation"] == "horovod-alltoall"
    _assert_each_rank_holds_its_plan_share(mp["ck"], 2)
    # evaluation metrics identical to the replicated path
    sm, sr = summary(mp["log"]), summary(rep["log"])
    assert sm["auc"] == pytest.approx(sr["auc"], abs=1e-6) and sm["bce"] == pytest.approx(sr["bce"], abs=1e-6)
    # replicas differ in their tables (each holds its share), unlike the replicated run
    assert len(set(sm["replica_weight_digests"])) == 2 and len(set(sr["replica_weight_digests"])) == 1


def test_dlrm_model_parallel_resume_same_world_is_bitwise(dlrm_two_rank_runs, tiny_data):
    tmp, runs = dlrm_two_rank_runs
    straight = summary(runs["model_parallel"]["log"])
    ck, log1, log2 = tmp / "resume-ck", tmp / "resume1.jsonl", tmp / "resume2.jsonl"
    data = tiny_data("dlrm")
    args = _args("dlrm", data, "model_parallel", ck, log1)
    args[args.index("--max-steps") + 1] = 3
    _mpirun(2, args)
    _mpirun(2, _args("dlrm", data, "model_parallel", ck, log2, "--restore"))
    resumed = summary(read_log(log2))
    assert [r["step"] for r in records(read_log(log2), "step")][0] == 4
    assert resumed["step"] == STEPS
    assert resumed["replica_weight_digests"] == straight["replica_weight_digests"]   # every rank's shard, bitwise


@pytest.fixture(scope="module")
def four_files(tmp_path_factory):
    """``four_files(model)`` -> synthetic data with one parquet file per rank for 4 ranks (made once)."""
    from recsys.data import synthetic
    made = {}

    def get(model):
        if model not in made:
            made[model] = tmp_path_factory.mktemp(f"data-{model}-4")
            synthetic.generate(synthetic.default_spec(model, num_files=4), str(made[model]),
                               {"train": 4096, "test": 2048}, seed=7)
        return made[model]
    return get


@pytest.fixture(scope="module")
def wide_deep_four_files(four_files):
    return four_files("wide_deep")


def test_wide_deep_four_ranks_sliced_and_data_parallel_tables_match_replicated(wide_deep_four_files, tmp_path):
    """4 ranks, multi-hot (mean combiner), wide and deep groups, column slices and small replicated tables;
    then the 4-rank checkpoint re-sharded to 2 ranks and to 1 rank gives the same predictions."""
    data = wide_deep_four_files
    extra = ["--combiner", "mean", "--column-slice-threshold", "2000", "--data-parallel-threshold", "100"]
    runs = _runs(tmp_path, 4, "wide_deep", data, ("model_parallel", "replicated"), *extra)
    mp, rep = runs["model_parallel"], runs["replicated"]
    _assert_same_training(mp, rep)
    _assert_each_rank_holds_its_plan_share(mp["ck"], 4, 2000, 100)
    listing = [json.loads((_latest(mp["ck"]) / f"rank-{r:05d}" / "tables.json").read_text()) for r in range(4)]
    sliced = [p for rank in listing for p in rank if p["col_end"] - p["col_start"] < 8 and p["group"] == "deep_embeddings"]
    assert sliced, "the threshold should have split some deep tables by columns"
    final = summary(mp["log"])
    # re-shard: the 4-rank checkpoint on 2 ranks (model parallel), through a restart of training at its
    # last step (restore, no step, then its own checkpoint in the 2-rank layout), and evaluated on 1 rank
    ck2 = tmp_path / "ck-2"
    shutil.copytree(mp["ck"], ck2)
    for np_, placement in ((2, "model_parallel"), (1, "auto")):
        log = tmp_path / f"eval-{np_}.jsonl"
        mode = (["--run-mode", "train", "--epochs", "1", "--max-steps", STEPS, "--restore", "--checkpoint-dir", ck2]
                if np_ == 2 else ["--run-mode", "evaluate", "--checkpoint-dir", mp["ck"]])
        args = ["--model", "wide_deep", "--data-path", data, *SMALL["wide_deep"], "--deep-dropout", "0", *extra,
                *mode, "--log-path", log, "--embedding-placement", placement]
        if np_ == 1:
            res = run_train(args)
            assert res.returncode == 0, res.stderr[-3000:]
        else:
            res = res_2 = _mpirun(np_, args)
        assert f"restored on {np_}" in res.stderr
        s = summary(read_log(log))
        assert s["step"] == STEPS
        for key in ("auc", "map_at_12", "bce"):
            assert s[key] == pytest.approx(final[key], abs=1e-6), (np_, key)
    # the tables' optimizer slots (RMSprop's velocities for the deep tables, FTRL's accumulators and
    # linears for the wide ones) went through the re-shard with the tables: the 2-rank checkpoint holds
    # exactly the 4-rank one's
    from recsys.checkpoints.contents import checkpoint_table_slots
    from recsys.checkpoints.sharded import read_meta
    assert "table optimizer slots re-sharded (accumulators, linears, velocities)" in res_2.stderr
    assert read_meta(str(_latest(ck2)))["world_size"] == 2
    before, after = checkpoint_table_slots(str(_latest(mp["ck"]))), checkpoint_table_slots(str(_latest(ck2)))
    assert sorted(before) == sorted(after) and {k.rsplit("/", 1)[1] for k in before} == {
        "accumulators", "linears", "velocities"}
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    assert any(np.abs(v).sum() > 0 for k, v in before.items() if k.endswith("velocities"))
    wb, wa = _weights(mp["ck"]), _weights(ck2)
    for key in wb:
        np.testing.assert_array_equal(wa[key], wb[key], err_msg=key)


def test_replicated_checkpoint_restores_into_model_parallel_run(dlrm_two_rank_runs, tiny_data, tmp_path):
    """The replicated run's checkpoint, evaluated model parallel on 2 ranks: its metrics."""
    _, runs = dlrm_two_rank_runs
    rep = runs["replicated"]
    log = tmp_path / "eval.jsonl"
    res = _mpirun(2, _eval_args(tiny_data("dlrm"), rep["ck"], log, "--embedding-placement", "model_parallel"))
    assert "a replicated checkpoint, restored on 2 ranks (model parallel)" in res.stderr
    s, want = summary(read_log(log)), summary(rep["log"])
    assert s["step"] == STEPS and records(read_log(log), "placement")[-1]["model_parallel"]
    assert s["auc"] == pytest.approx(want["auc"], abs=1e-6) and s["bce"] == pytest.approx(want["bce"], abs=1e-6)


def _eval_args(data, ck, log, *extra):
    return ["--model", "dlrm", "--data-path", data, *SMALL["dlrm"], "--run-mode", "evaluate", "--checkpoint-dir", ck,
            "--log-path", log, *extra]


def _tree(path):
    return sorted((str(p.relative_to(path)), p.stat().st_mtime_ns) for p in path.rglob("*"))


def test_incomplete_or_foreign_sharded_checkpoint_is_refused(dlrm_two_rank_runs, tiny_data, tmp_path):
    _, runs = dlrm_two_rank_runs
    ck = tmp_path / "ck"
    shutil.copytree(runs["model_parallel"]["ck"], ck)
    data = tiny_data("dlrm")
    # another model: a different embedding width
    res = run_train(_eval_args(data, ck, tmp_path / "a.jsonl", "--embedding-dim", "16", "--bottom-mlp", "16,16"),
                    timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "checkpoint of another model" in res.stderr
    # a missing shard
    shard = next((_latest(ck) / "rank-00001").glob("*.npy"))
    shard.unlink()
    before = _tree(ck)
    res = run_train(_eval_args(data, ck, tmp_path / "b.jsonl"), timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "incomplete sharded checkpoint" in res.stderr and shard.name in res.stderr
    res = run_train(["--model", "dlrm", "--data-path", data, *SMALL["dlrm"], "--epochs", "1", "--restore",
                     "--checkpoint-dir", ck], timeout=60)
    assert res.returncode == 2 and "incomplete sharded checkpoint" in res.stderr
    assert _tree(ck) == before                                        # nothing overwritten
    assert not (tmp_path / "b.jsonl").exists()


def test_wide_deep_two_ranks_sum_combiner_matches_replicated(wide_deep_four_files, tmp_path):
    """2 ranks, multi-hot with the sum combiner (the 4-rank test uses mean), whole tables per rank."""
    runs = _runs(tmp_path, 2, "wide_deep", wide_deep_four_files, ("replicated", "model_parallel"), "--combiner", "sum")
    mp, rep = runs["model_parallel"], runs["replicated"]
    _assert_same_training(mp, rep)
    _assert_each_rank_holds_its_plan_share(mp["ck"], 2)
    sm, sr = summary(mp["log"]), summary(rep["log"])
    for key in ("auc", "map_at_12", "bce"):
        assert sm[key] == pytest.approx(sr[key], abs=1e-6), key


@pytest.mark.slurm
def test_srun_pmix_dlrm_four_ranks_model_parallel_matches_replicated(slurm_cluster, four_files, tmp_path):
    """DLRM on 4 ranks, 2 emulated nodes x 2 tasks under srun --mpi=pmix, against the replicated run of
    the same 4 ranks under mpirun."""
    data = four_files("dlrm")
    env = dict(slurm_cluster.env)
    env.update(MPI_ENV)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    cmd = ["srun", "--mpi=pmix", "-N2", "--ntasks=4", "--ntasks-per-node=2", "--cpus-per-task=1",
           "-p", slurm_cluster.partition, "--time=5",
           *train_cmd(*_args("dlrm", data, "model_parallel", ck, log))]
    replicated = _start(tmp_path, 4, "dlrm", data, "replicated")     # side by side with the srun step
    try:
        res = slurm_cluster.run(cmd, env=env, timeout=400)
    except BaseException:
        replicated[0].kill()
        raise
    rep = _result(finish(replicated[0], timeout=400), *replicated[1:])
    assert res.returncode == 0, res.stderr[-3000:]
    mp = dict(log=read_log(log), ck=ck)
    sm = summary(mp["log"])
    assert sm["world_size"] == 4 and len(set(sm["replica_weight_digests"])) == 4
    _assert_same_training(mp, rep)
    _assert_each_rank_holds_its_plan_share(ck, 4)
    assert sm["auc"] == pytest.approx(summary(rep["log"])["auc"], abs=1e-6)
