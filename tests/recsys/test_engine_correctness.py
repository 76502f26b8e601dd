"""Issue 11: results a run reports must be the ones of its last step, and wrong runs must not exit 0.

Each test fails on the engine before the fix: stale summary after --max-steps, silent divergence,
NCF negatives with duplicates / stored negatives ignored, non-bitwise resume with dropout,
bad data found late or not at all, benchmark rates and losses, the synthetic LR schedule.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import yaml

from conftest import REPO, SMALL, base_env, finish, finish_all, read_log, records, run_train, \
    start_train, summary


def _error_line(res):
    lines = [l for l in res.stderr.splitlines() if "error:" in l]
    assert len(lines) == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    return lines[0]


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------- 1, 6, 7, 8
def test_max_steps_on_an_epoch_boundary_ends_with_eval_and_checkpoint_of_the_last_step(tiny_data, tmp_path):
    """32 steps per epoch, --max-steps 64: the summary reports the evaluation and checkpoint of step 64,
    the last step's loss, and warns that the given LR schedule ends at step 30."""
    log, ck = tmp_path / "log.jsonl", tmp_path / "ck"
    res = run_train(["--model", "dlrm", "--data-path", tiny_data("dlrm"), *SMALL["dlrm"], "--epochs", "3",
                     "--max-steps", "64", "--decay-start-step", "20", "--decay-steps", "10",
                     "--checkpoint-dir", ck, "--log-path", log, "--log-every", "5"])
    assert res.returncode == 0, res.stderr[-3000:]
    recs = read_log(log)
    s = summary(recs)
    evals = records(recs, "eval")
    assert [e["step"] for e in evals] == [32, 64]
    assert s["step"] == 64 and s["eval_step"] == 64 and s["auc"] == evals[-1]["auc"]
    assert s["checkpoint"] == str(ck / "ckpt-0000000064") and os.path.isdir(s["checkpoint"])
    # the checkpoint is written before the evaluation (a failing evaluation loses no step)
    kinds = [(r["type"], r.get("step")) for r in recs if r["type"] in ("checkpoint", "eval")]
    assert kinds[-2:] == [("checkpoint", 64), ("eval", 64)]
    # final_loss is the last step's (64), not the last logged one (60)
    assert (s["first_loss_step"], s["final_loss_step"]) == (1, 64)
    assert s["summary_version"] == 3 and s["world_size"] == 1
    assert s["throughput_samples_per_s"] > 0 and s["mean_step_time_ms"] > 0
    warnings = [r for r in records(recs, "info") if r.get("warning") == "lr_schedule_ends_early"]
    assert len(warnings) == 1 and warnings[0]["lr_zero_step"] == 30 and warnings[0]["total_steps"] == 64


def test_synthetic_dlrm_schedule_spans_the_run(tmp_path):
    """8 steps per epoch x 6 epochs: the LR still decays (is > 0) until the last step, no warning."""
    log = tmp_path / "log.jsonl"
    res = run_train(["--model", "dlrm", "--synthetic", "--synthetic-rows", "4096", "--epochs", "6",
                     "--log-path", log, "--log-every", "1"])
    assert res.returncode == 0, res.stderr[-3000:]
    recs = read_log(log)
    p = records(recs, "params")[0]
    assert p["decay_start_step"] + p["decay_steps"] == 48 and 0 < p["warmup_steps"] < p["decay_start_step"]
    lrs = {r["step"]: r["lr"] for r in records(recs, "step")}
    assert lrs[47] > 0 and lrs[30] > lrs[47]
    assert not [r for r in records(recs, "info") if r.get("warning")]


def test_benchmark_rates_and_losses(tiny_data, tmp_path):
    log = tmp_path / "bench.jsonl"
    res = run_train(["--model", "dlrm", "--data-path", tiny_data("dlrm"), *SMALL["dlrm"], "--run-mode", "benchmark",
                     "--benchmark-warmup-steps", "10", "--benchmark-steps", "5", "--log-every", "5",
                     "--log-path", log])
    assert res.returncode == 0, res.stderr[-3000:]
    recs = read_log(log)
    rates = [r["samples_per_s"] for r in records(recs, "step")]
    assert len(rates) == 3 and max(rates) < 1e9       # warm-up steps too: a step's own time, not 1e-9 s
    s = summary(recs)
    assert (s["first_loss_step"], s["final_loss_step"]) == (1, 15) and s["first_loss"] != s["final_loss"]


# ------------------------------------------------------------------ 2
def test_divergence_stops_the_run_and_keeps_the_last_good_checkpoint(tiny_data, tmp_path):
    data, ck = tiny_data("dlrm"), tmp_path / "ck"
    res = run_train(["--model", "dlrm", "--data-path", data, *SMALL["dlrm"], "--epochs", "1", "--max-steps", "8",
                     "--checkpoint-dir", ck])
    assert res.returncode == 0, res.stderr[-3000:]
    log = tmp_path / "log.jsonl"
    res = run_train(["--model", "dlrm", "--data-path", data, *SMALL["dlrm"], "--lr", "1e12", "--epochs", "1",
                     "--checkpoint-dir", ck, "--restore", "--log-path", log])
    assert res.returncode == 1, res.stderr[-3000:]
    line = _error_line(res)
    assert "step" in line and "diverged" in line and "ckpt-0000000008" in line
    assert sorted(p.name for p in ck.glob("ckpt-*")) == ["ckpt-0000000008"]
    assert not [p for p in os.listdir(ck) if p.startswith(".tmp")]
    diverged = records(read_log(log), "diverged")
    assert len(diverged) == 1 and diverged[0]["step"] > 8
    assert not records(read_log(log), "summary")


def test_non_finite_predictions_at_evaluation_stop_the_run(tiny_data, tmp_path):
    """NaN predictions (here: a NaN output bias) raise DivergedError naming the step, not NaN metrics."""
    import tensorflow as tf
    from recsys.configuration.train_config import TrainConfig
    from recsys.engine import Engine
    from recsys.errors import DivergedError
    from recsys.features.spec import FeatureSpec
    from recsys.models.tasks import TASKS
    from recsys.monitoring.logger import RunLogger
    from recsys.runtime.distributed import Distributed
    from recsys.train import build_parser

    cfg = TrainConfig.from_args(build_parser().parse_args(
        ["--model", "ncf", "--data-path", str(tiny_data("ncf")), *SMALL["ncf"]]))
    dist, log = Distributed(use_horovod=False), RunLogger(None)
    engine = Engine(cfg, TASKS["ncf"](cfg, FeatureSpec.from_yaml(cfg.feature_spec), dist, log), dist, log)
    for x, y in engine.task.train_dataset(0).take(3):
        engine.step.train_step(x, y)
    assert engine.evaluate()["hr_at_10"] >= 0
    engine.model.out.bias.assign(tf.fill(engine.model.out.bias.shape, float("nan")))
    with pytest.raises(DivergedError, match=r"^step 3: \d+ non-finite predictions at evaluation"):
        engine.evaluate()


# ------------------------------------------------------------------ 3
def test_ncf_eval_negatives_are_distinct_and_never_positives():
    from recsys.data import ncf
    rng = np.random.default_rng(0)
    users = np.repeat(np.arange(50), 40)
    items = np.concatenate([rng.choice(150, 40, replace=False) for _ in range(50)])
    tu = np.arange(50)
    ti = np.array([np.setdiff1d(np.arange(150), items[users == u])[0] for u in tu])
    _, cand, labels = ncf.eval_set(tu, ti, users, items, num_items=150, num_negatives=100, seed=3)
    assert cand.shape == (50, 101) and (labels[:, 0] == 1).all()
    for u in tu:
        negatives = cand[u, 1:]
        assert len(set(negatives.tolist())) == 100                        # distinct
        assert not set(negatives.tolist()) & (set(items[users == u].tolist()) | {int(ti[u])})
    with pytest.raises(ValueError, match="--valid-negative"):
        ncf.eval_set(tu, ti, users, items, num_items=150, num_negatives=110)


def test_too_few_unseen_items_for_the_negatives_fails_before_training(tiny_data, tmp_path):
    log = tmp_path / "log.jsonl"
    res = run_train(["--model", "ncf", "--data-path", tiny_data("ncf"), *SMALL["ncf"], "--valid-negative", "1000",
                     "--log-path", log])
    assert res.returncode == 2, res.stderr[-3000:]
    assert "--valid-negative" in _error_line(res)
    assert not records(read_log(log), "step")


def _with_stored_negatives(src, dst, negatives=20):
    """The tiny NCF dataset with a test mapping of 1 + N rows per user (positive first), as
    `preproc movielens --test-negatives N` writes it."""
    from recsys.data import ncf
    from recsys.features.spec import FeatureSpec
    _copy(src, dst)
    spec = FeatureSpec.from_yaml(str(dst / "feature_spec.yaml"))
    tu, ti = ncf.load_pairs(spec, "test")
    u_tr, i_tr = ncf.load_pairs(spec, "train")
    n_items = spec.cardinality("item")
    rng = np.random.default_rng(5)
    items = []
    for u, i in zip(tu, ti):
        unseen = np.setdiff1d(np.arange(n_items), np.r_[i_tr[u_tr == u], i])
        items.append(np.r_[i, rng.choice(unseen, negatives, replace=False)])
    items = np.concatenate(items)
    users = np.repeat(tu, negatives + 1)
    labels = np.tile(np.r_[1, np.zeros(negatives)], tu.size).astype(bool)
    for name, arr in (("user", users), ("item", items), ("label", labels)):
        arr.astype(spec.dtype(name)).tofile(dst / "test" / f"{name}.bin")
    raw = yaml.safe_load((dst / "feature_spec.yaml").read_text())
    raw["metadata"]["test_samples_per_series"] = negatives + 1
    (dst / "feature_spec.yaml").write_text(yaml.safe_dump(raw))
    return dst, users, items


def test_ncf_evaluates_against_stored_negatives(tiny_data, tmp_path):
    from recsys.configuration.train_config import TrainConfig
    from recsys.features.spec import FeatureSpec
    from recsys.models.tasks import NCFTask
    from recsys.monitoring.logger import RunLogger
    from recsys.runtime.distributed import Distributed
    from recsys.train import build_parser

    data, users, items = _with_stored_negatives(tiny_data("ncf"), tmp_path / "ncf")
    cfg = TrainConfig.from_args(build_parser().parse_args(["--model", "ncf", "--data-path", str(data),
                                                           *SMALL["ncf"]]))
    task = NCFTask(cfg, FeatureSpec.from_yaml(cfg.feature_spec), Distributed(use_horovod=False), RunLogger(None))
    eval_users, eval_items = task._eval_arrays()
    assert eval_items.shape == (users.size // 21, 21)
    np.testing.assert_array_equal(eval_items.reshape(-1), items)
    np.testing.assert_array_equal(eval_users, users[::21])


# ------------------------------------------------------------------ 4
def _flags(model):
    # larger batches: about 8 steps per epoch, so that 12 steps cross an epoch boundary
    drop = {"wide_deep": ["--deep-dropout", "0.3", "--batch-size", "1024"],
            "ncf": ["--dropout", "0.3", "--batch-size", "4096"],
            "dlrm": ["--batch-size", "1024"]}[model]
    return [*SMALL[model], *drop, "--epochs", "2"]


@pytest.mark.parametrize("model,ranks", [("wide_deep", 1), ("ncf", 1),
                                         pytest.param("wide_deep", 2, marks=pytest.mark.horovod),
                                         pytest.param("ncf", 2, marks=pytest.mark.horovod),
                                         pytest.param("dlrm", 2, marks=pytest.mark.horovod)])
def test_restore_is_bitwise_with_dropout(model, ranks, tiny_data, tmp_path):
    """Interrupted at step 5 (epoch 0) and resumed into epoch 1 (NCF: new negatives): the same
    weights as an uninterrupted run, bit for bit (DLRM at 1 rank: test_checkpoint.py)."""
    if ranks > 1 and shutil.which("mpirun") is None:
        pytest.skip("Open MPI (mpirun) is not installed")
    data = tiny_data(model)
    base = ["--model", model, "--data-path", data, *_flags(model)]
    straight, ck = tmp_path / "straight.jsonl", tmp_path / "ck"
    # the uninterrupted run and the interrupted one share nothing: they run side by side (on CI's
    # 2 cores one's start-up fills what the other leaves idle); only the resumed run waits
    done = finish_all([start_train(ranks, [*base, "--max-steps", "12", "--log-path", straight]),
                       start_train(ranks, [*base, "--max-steps", "5", "--checkpoint-dir", ck])])
    for res in done:
        assert res.returncode == 0, res.stderr[-3000:]
    resumed = tmp_path / "resumed.jsonl"
    res = finish(start_train(ranks, [*base, "--max-steps", "12", "--checkpoint-dir", ck, "--restore",
                                     "--log-path", resumed]))
    assert res.returncode == 0, res.stderr[-3000:]
    a, b = summary(read_log(straight)), summary(read_log(resumed))
    assert a["step"] == b["step"] == 12 and a["epoch"] >= 1
    assert a["weights_digest"] == b["weights_digest"]
    assert a["final_loss"] == b["final_loss"]


# ------------------------------------------------------------------ 5
def test_out_of_range_id_in_split_binary_is_one_line_before_training(tiny_data, tmp_path):
    data = _copy(tiny_data("dlrm"), tmp_path / "data")
    spec = yaml.safe_load((data / "feature_spec.yaml").read_text())
    card = spec["feature_spec"]["cat_3"]["cardinality"]
    path = data / "test" / "cat_3.bin"
    ids = np.fromfile(path, dtype=spec["feature_spec"]["cat_3"]["dtype"])
    ids[123] = card
    ids.tofile(path)
    log = tmp_path / "log.jsonl"
    res = run_train(["--model", "dlrm", "--data-path", data, *SMALL["dlrm"], "--epochs", "1", "--log-path", log])
    assert res.returncode == 2, res.stderr[-3000:]
    line = _error_line(res)
    assert str(path) in line and "row 123" in line and "cat_3" in line
    assert not records(read_log(log), "step")                 # found before training


def _corrupt_parquet(path):
    """Overwrite the middle of the file (its data pages) with garbage; footer intact."""
    raw = bytearray(path.read_bytes())
    lo, hi = 8, len(raw) // 2
    raw[lo:hi] = bytes((i * 37 + 11) % 256 for i in range(hi - lo))
    path.write_bytes(bytes(raw))


def test_corrupt_parquet_test_file_is_one_line_after_a_checkpoint(tiny_data, tmp_path):
    data = _copy(tiny_data("wide_deep"), tmp_path / "data")
    bad = sorted((data / "test").glob("*.parquet"))[0]
    _corrupt_parquet(bad)
    ck = tmp_path / "ck"
    res = run_train(["--model", "wide_deep", "--data-path", data, *SMALL["wide_deep"], "--epochs", "1",
                     "--max-steps", "4", "--checkpoint-dir", ck])
    assert res.returncode == 2, res.stderr[-3000:]
    assert str(bad) in _error_line(res)
    assert json.loads((ck / "ckpt-0000000004" / "meta.json").read_text())["step"] == 4   # trained steps kept


@pytest.mark.parametrize("label,dtype,shown", [("7", "bool", "label 7"), ("", "bool", "label empty or NaN"),
                                               ("nan", "float32", "label empty or NaN")])
def test_transcoder_refuses_labels_other_than_0_and_1(tmp_path, label, dtype, shown):
    src = tmp_path / "in"
    src.mkdir()
    rows = ["1,0.5,3", "0,1.5,2", f"{label},2.5,1", "1,0.1,0"]
    (src / "train.csv").write_text("\n".join(rows) + "\n")
    spec = {"feature_spec": {"label": {"dtype": dtype}, "num_0": {"dtype": "float32"},
                             "cat_0": {"dtype": "int8", "cardinality": 4}},
            "source_spec": {"train": [{"type": "csv", "features": ["label", "num_0", "cat_0"],
                                       "files": ["train.csv"]}]},
            "channel_spec": {"label": ["label"], "numerical": ["num_0"], "categorical": ["cat_0"]}}
    (src / "spec.yaml").write_text(yaml.safe_dump(spec))
    res = subprocess.run([sys.executable, "-m", "recsys.data.transcode", "--input", src, "--spec",
                          src / "spec.yaml", "--output", tmp_path / "out", "--format", "split_binary"],
                         env=base_env(), cwd=REPO, text=True, capture_output=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.count("\n") == 1 and "train.csv" in res.stderr and "row 3" in res.stderr
    assert shown in res.stderr and not (tmp_path / "out").exists()


def test_split_binary_reader_checks_ids_of_every_batch_it_reads(tmp_path):
    """Large files are not scanned before training: each batch read is checked (negative ids too)."""
    from recsys.data import synthetic
    from recsys.data.split_binary import SplitBinaryReader
    from recsys.errors import DataError
    spec = synthetic.generate(synthetic.default_spec("dlrm", num_files=1), str(tmp_path),
                              {"train": 4096, "test": 1024}, seed=1)
    path = spec.path(spec.chunk_of("train", "cat_2")["files"][0])
    ids = np.fromfile(path, dtype=spec.dtype("cat_2"))
    ids[1000] = -1
    ids.tofile(path)
    reader = SplitBinaryReader(spec, "train", 512)
    reader.read_flat(0)                                     # rows 0-511 are fine
    with pytest.raises(DataError, match=rf"^{path}: row 1000: id -1 of cat_2 outside \[0, "):
        reader.read_flat(1)
