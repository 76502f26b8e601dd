"""Bad data never trains silently: refusals at transcode and in the readers, the off-scale warning,
the divergence guard (NaN hidden by fused kernels, a finite explosion), W&D without a ``map``
channel, and exact NCF evaluation negatives for users with barely enough unseen items.

The fast tests are numpy/pyarrow only; the others start TensorFlow (in process, or one small run)."""
from __future__ import annotations

import time

import numpy as np
import pytest
import yaml

from recsys.data import make_reader, ncf, off_scale_warning, synthetic
from recsys.data.transcode import main as transcode_main
from recsys.errors import DataError

from conftest import SMALL, run_train


def write_csv(tmp_path, values, dtype="float16"):
    """A one-mapping DLRM-layout CSV: label, num_0, num_1 (``values`` [rows, 2]), cat_0; and its spec."""
    src = tmp_path / "in"
    src.mkdir()
    lines = [f"{r % 2},{a},{b},{r % 3}" for r, (a, b) in enumerate(values)]
    (src / "train.csv").write_text("\n".join(lines) + "\n")
    spec = {"feature_spec": {"label": {"dtype": "bool"}, "num_0": {"dtype": dtype}, "num_1": {"dtype": dtype},
                             "cat_0": {"dtype": "int32", "cardinality": 3}},
            "source_spec": {"train": [{"type": "csv", "files": ["train.csv"],
                                       "features": ["label", "num_0", "num_1", "cat_0"]}]},
            "channel_spec": {"label": ["label"], "numerical": ["num_0", "num_1"], "categorical": ["cat_0"]}}
    (src / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return src


def transcode(capsys, src, out, fmt="split_binary"):
    code = transcode_main(["--input", str(src), "--spec", str(src / "spec.yaml"), "--output", str(out),
                           "--format", fmt])
    return code, capsys.readouterr().err


@pytest.mark.fast
@pytest.mark.parametrize("bad, why", [("inf", "inf is not a finite number"), ("nan", "nan is not a finite number"),
                                      ("70000", "70000 overflows float16 (largest 65504)")])
def test_transcode_refuses_non_finite_and_float16_overflow(tmp_path, capsys, bad, why):
    values = [["0.5", "1"]] * 6
    values[3] = ["0.5", bad]
    src = write_csv(tmp_path, values)
    code, err = transcode(capsys, src, tmp_path / "out")
    assert code == 2 and err.count("\n") == 1, err
    assert f"train.csv: column 2 (num_1): row 4: numerical value {why}" in err
    assert not (tmp_path / "out").exists()
    if bad == "70000":          # parquet stores float32: 70000 fits
        assert transcode(capsys, src, tmp_path / "pq", "parquet")[0] == 0


@pytest.mark.fast
def test_readers_refuse_non_finite_numericals_naming_file_row_and_column(tmp_path, capsys):
    values = [[f"{k / 8}", "1"] for k in range(40)]
    src = write_csv(tmp_path, values)
    for fmt in ("split_binary", "parquet"):
        assert transcode(capsys, src, tmp_path / fmt, fmt)[0] == 0
    # split-binary: numerical.bin is float16 [rows, 2]; row 17, num_1 becomes inf
    path = tmp_path / "split_binary/train/numerical.bin"
    data = np.fromfile(path, np.float16).reshape(-1, 2)
    data[17, 1] = np.inf
    data.tofile(path)
    with pytest.raises(DataError, match=r"numerical\.bin: row 17: num_1 is inf: numerical values must be finite"):
        list(make_reader(str(tmp_path / "split_binary/feature_spec.yaml"), "train", 8).numpy_batches())
    # parquet: row 21 of num_0 becomes NaN
    import pyarrow.parquet as pq
    path = tmp_path / "parquet/train/part_000.parquet"
    table = pq.read_table(path)
    column = table.column("num_0").to_numpy().copy()
    column[21] = np.nan
    pq.write_table(table.set_column(table.schema.get_field_index("num_0"), "num_0", [column]), path)
    with pytest.raises(DataError, match=r"part_000\.parquet: row 21: num_0 is nan: numerical values must be finite"):
        list(make_reader(str(tmp_path / "parquet/feature_spec.yaml"), "train", 8).numpy_batches())


@pytest.mark.fast
def test_off_scale_numericals_get_one_warning_naming_the_columns(tmp_path, capsys):
    rng = np.random.default_rng(0)
    values = [[f"{a:.3f}", f"{b:.1f}"] for a, b in zip(rng.normal(0, 1, 64), rng.normal(40, 12, 64))]
    src = write_csv(tmp_path, values, dtype="float32")
    assert transcode(capsys, src, tmp_path / "out", "parquet")[0] == 0
    line = off_scale_warning(str(tmp_path / "out/feature_spec.yaml"))
    assert line.count("\n") == 0 and "num_1 (rms 4" in line and "num_0" not in line
    data = tmp_path / "ok"
    synthetic.generate(synthetic.default_spec("dlrm", num_files=1), str(data), {"train": 256, "test": 64}, seed=1)
    assert off_scale_warning(str(data / "feature_spec.yaml")) is None


@pytest.mark.fast
def test_ncf_eval_negatives_exact_without_replacement_for_100_and_101_unseen_items():
    num_items, rng = 400, np.random.default_rng(5)
    unseen = {0: 100, 1: 101, 2: 100, 3: 300}      # items each user never interacted with (nor its test item)
    users, items, tu, ti = [], [], [], []
    for u, n in unseen.items():
        seen = rng.choice(num_items, num_items - n, replace=False)
        users += [u] * (len(seen) - 1)
        items += list(seen[1:])
        tu.append(u)
        ti.append(seen[0])
    t0 = time.perf_counter()
    eu, cand, labels = ncf.eval_set(tu, ti, users, items, num_items, num_negatives=100, seed=3)
    assert time.perf_counter() - t0 < 1.0
    assert cand.shape == (4, 101) and (labels[:, 0] == 1).all()
    for k, u in enumerate(eu):
        positives = set(np.asarray(items)[np.asarray(users) == u]) | {ti[k]}
        negatives = cand[k, 1:]
        assert len(set(negatives)) == 100 and not set(negatives) & positives
        if unseen[u] == 100:           # every unseen item, each once
            assert set(negatives) == set(range(num_items)) - positives
    # uniform over the subsets: 3 unseen items, 2 negatives -> each of the 3 pairs a third of the time
    known = np.array([0 * 5 + 0, 0 * 5 + 2])
    draws = np.sort(ncf._draw_distinct_negatives(np.random.default_rng(0), np.zeros(6000, np.int64), 5, known, 2), 1)
    counts = {tuple(p): c for p, c in zip(*np.unique(draws, axis=0, return_counts=True))}
    assert set(counts) == {(1, 3), (1, 4), (3, 4)} and all(abs(c - 2000) < 200 for c in counts.values())


# ---------------------------------------------------------------- TensorFlow
def _engine(model, data, *flags):
    from recsys.configuration.train_config import TrainConfig
    from recsys.engine import Engine
    from recsys.features.spec import FeatureSpec
    from recsys.models.tasks import TASKS
    from recsys.monitoring.logger import RunLogger
    from recsys.runtime.distributed import Distributed
    from recsys.train import build_parser
    cfg = TrainConfig.from_args(build_parser().parse_args(["--model", model, "--data-path", str(data), *flags]))
    dist, log = Distributed(use_horovod=False), RunLogger(None)
    task = TASKS[model](cfg, FeatureSpec.from_yaml(cfg.feature_spec), dist, log)
    task.check_data()
    return Engine(cfg, task, dist, log)


def _dlrm_engine(tmp_path):
    data = tmp_path / "dlrm"
    synthetic.generate(synthetic.default_spec("dlrm", num_files=1), str(data), {"train": 2048, "test": 512}, seed=7)
    return _engine("dlrm", data, *SMALL["dlrm"], "--max-steps", "6", "--log-every", "3")


def _weight(engine, name):
    return next(v for v in engine.model.trainable_variables if v.name == name)


def _poison(variable, index):
    values = variable.numpy()
    values[index] = np.nan
    variable.assign(values)


def test_nan_weights_the_loss_cannot_show_stop_the_run(tmp_path):
    """A NaN in an embedding row that no training id looks up: no kernel on any CPU reads the row, so
    the loss stays finite whatever TensorFlow dispatches, and only the weight check can stop the run.
    (Its twin below, a NaN in a dense layer, depends on the kernel; this one does not.)"""
    from recsys.errors import DivergedError
    engine = _dlrm_engine(tmp_path)
    table = _weight(engine, "dlrm/embeddings/table_9/embeddings:0")        # 10,009 rows, 2,048 training rows
    seen = set()
    for inputs, _ in engine.task.train_dataset(0):
        seen.update(int(i) for i in inputs["categorical"][:, 9].numpy())
    row = next(r for r in range(int(table.shape[0])) if r not in seen)
    _poison(table, (row, 0))
    inputs, labels = next(iter(engine.task.train_dataset(0)))
    loss, _ = engine.step.train_step(inputs, labels)
    assert np.isfinite(float(loss)), "the poisoned row was read: the case is not hidden"
    with pytest.raises(DivergedError, match=r"^step 6: non-finite weights \(dlrm/embeddings/table_9/embeddings:0\) "
                                            r"while the loss is [0-9.]+: the run diverged"):
        engine.train()


def test_the_log_interval_check_names_a_nan_dense_weight_whatever_the_loss(tmp_path):
    """The cheap check at the log interval reads the dense weights themselves, not the loss."""
    from recsys.errors import DivergedError
    engine = _dlrm_engine(tmp_path)
    _poison(_weight(engine, "bottom_mlp_0/kernel:0"), (0, 0))
    with pytest.raises(DivergedError, match=r"^step 3: non-finite weights \(bottom_mlp_0/kernel:0\) while the "
                                            r"loss is 0.5: the run diverged"):
        engine.guards.check_weights(3, 0.5, dense_only=True)


def test_nan_dense_weight_stops_the_run_whichever_kernel_runs(tmp_path):
    """A NaN in the first bottom-MLP kernel stops the run on every CPU. Which kernel TensorFlow
    dispatches decides how: where a fused MatMul+BiasAdd+Relu maps the NaN outputs to 0 (seen on
    AVX-512 CPUs) the loss stays finite and the weight check at the log interval (step 3) stops it;
    where the NaN reaches the loss (seen on an AVX2-only EPYC, with and without oneDNN) the loss
    guard stops it at the first step of the run."""
    from recsys.errors import DivergedError
    engine = _dlrm_engine(tmp_path)
    _poison(_weight(engine, "bottom_mlp_0/kernel:0"), (0, 0))
    inputs, labels = next(iter(engine.task.train_dataset(0)))
    loss, _ = engine.step.train_step(inputs, labels)
    if np.isfinite(float(loss)):                                 # hidden by the kernel: the weight check's case
        want = r"^step 3: non-finite weights \(bottom_mlp_0/kernel:0\) while the loss is [0-9.]+: the run diverged"
    else:                                # shown by the kernel: the loss guard's case, at train()'s first
        want = r"^step 2: the training loss is nan: the run diverged"      # step (the probe above was step 1)
    with pytest.raises(DivergedError, match=want):
        engine.train()


def test_wide_deep_without_map_channel_reports_auc(tmp_path):
    data = tmp_path / "wd"
    synthetic.generate(synthetic.default_spec("wide_deep", num_files=1), str(data), {"train": 1024, "test": 512}, seed=7)
    spec = yaml.safe_load((data / "feature_spec.yaml").read_text())
    del spec["channel_spec"]["map"]
    (data / "feature_spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    engine = _engine("wide_deep", data, *SMALL["wide_deep"], "--max-steps", "2")
    metrics = engine.evaluate()
    assert set(metrics) == {"auc", "bce"} and 0 <= metrics["auc"] <= 1


def test_finite_explosion_exits_nonzero_with_one_line(tmp_path):
    res = run_train(["--model", "wide_deep", "--synthetic", "--linear-lr", "1e12", "--synthetic-rows", "2048",
                     "--epochs", "1", "--log-path", tmp_path / "log.jsonl"])
    assert res.returncode == 1, res.stderr[-2000:]
    errors = [line for line in res.stderr.splitlines() if line.startswith("recsys-train: error:")]
    assert len(errors) == 1 and "times the first one" in errors[0] and "--linear-lr" in errors[0], res.stderr[-2000:]
    assert "Traceback" not in res.stderr
