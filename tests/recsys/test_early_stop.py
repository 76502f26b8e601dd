"""Issue 37 items 5 and 7, pure: the best evaluation and the early stop's count (recsys.checkpoints.atomic
BestEvaluation), carried through a checkpoint; the best checkpoint kept from pruning; the flags and
their small-data defaults; a table of numerical columns alone for Wide & Deep (no embedding table)
and one line for DLRM. The runs on real data are tests/recsys/test_realdata_adult.py's."""
from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
import yaml

from recsys.checkpoints.atomic import AtomicCheckpointer, BestEvaluation
from recsys.configuration.train_config import TrainConfig
from recsys.errors import EngineError
from recsys.models.embedding_tables import dense_params, wide_deep_groups
from recsys.train import build_parser

pytestmark = pytest.mark.fast

# Wide & Deep's AUC after each of its 10 epochs on Adult with the small-data defaults before early
# stopping (tests/recsys/test_realdata_adult.py, 2026-11-27): the best of the first 7 epochs is epoch 7,
# by 0.00005 over epoch 5, and epoch 9 is 0.0004 above it.
ADULT_WIDE_DEEP = [0.902297552792305, 0.9052025232255028, 0.9096535426537687, 0.9111167675955296,
                   0.9124823184936358, 0.909798182738324, 0.9125360023873127, 0.9092851803932042,
                   0.9129087842878616, 0.9121258008682295]


def run(aucs, patience, min_delta, best=None, start=0):
    """Evaluations 1.. of ``aucs`` (one per epoch, 100 steps each) until the patience runs out:
    (the tracker, the epochs evaluated)."""
    best = best or BestEvaluation("auc", patience, min_delta)
    epochs = []
    for epoch, auc in enumerate(aucs[start:], start=start + 1):
        best.update(100 * epoch, epoch, {"auc": auc, "bce": 0.4}, checkpoint=f"ckpt-{100 * epoch}")
        epochs.append(epoch)
        if best.stop:
            break
    return best, epochs


def test_noise_within_min_delta_makes_a_new_best_but_does_not_prolong_the_run():
    best, epochs = run(ADULT_WIDE_DEEP, patience=2, min_delta=0.001)
    assert epochs == [1, 2, 3, 4, 5, 6, 7] and best.stop
    assert (best.step, best.value, best.checkpoint) == (700, ADULT_WIDE_DEEP[6], "ckpt-700")
    assert best.summary()["metrics"] == {"auc": ADULT_WIDE_DEEP[6], "bce": 0.4}
    # any gain restarting the count, the run goes on to its last epoch and the best is epoch 9
    best, epochs = run(ADULT_WIDE_DEEP, patience=2, min_delta=0.0)
    assert epochs == list(range(1, 11)) and not best.stop and best.step == 900
    # patience 0: never stops
    assert run([0.9, 0.8, 0.7, 0.6], patience=0, min_delta=0.0)[1] == [1, 2, 3, 4]


def test_the_count_goes_on_from_a_checkpoint_as_if_never_stopped():
    """A checkpoint holds the state of the evaluations before its step (it is saved first): a run
    restored from epoch k's checkpoint evaluates epoch k again and stops where the straight run did."""
    straight, straight_epochs = run(ADULT_WIDE_DEEP, patience=2, min_delta=0.001)
    for k in range(1, len(straight_epochs) + 1):
        before, _ = run(ADULT_WIDE_DEEP[:k - 1], patience=2, min_delta=0.001)
        state = json.loads(json.dumps(before.state()))             # through meta.json
        resumed = BestEvaluation("auc", 2, 0.001).restored(state)
        assert resumed.last_step == (100 * (k - 1) if k > 1 else None)
        resumed, epochs = run(ADULT_WIDE_DEEP, 2, 0.001, best=resumed, start=k - 1)
        assert epochs[-1] == straight_epochs[-1] and resumed.state() == straight.state(), k
    # the state of another metric (NCF's --topk changed) or version starts afresh
    other = BestEvaluation("hr_at_5").restored(straight.state())
    assert other.value is None and other.since_best == 0
    assert BestEvaluation("auc").restored(dict(straight.state(), version=99)).value is None


def test_a_nan_is_never_the_best_and_counts_against_the_patience():
    best = BestEvaluation("auc", patience=2)
    assert best.update(1, 1, {"auc": float("nan")}) is False and best.value is None
    assert best.update(2, 2, {"auc": 0.7}) is True
    assert best.update(3, 3, {"auc": float("nan")}) is False and best.since_best == 1


def _ckpt(directory, step):
    path = directory / f"ckpt-{step:010d}"
    path.mkdir(parents=True)
    (path / "meta.json").write_text(json.dumps({"step": step}))
    return str(path)


def test_the_protected_best_checkpoint_survives_pruning(tmp_path):
    paths = [_ckpt(tmp_path, s) for s in (10, 20, 30)]
    ck = AtomicCheckpointer(str(tmp_path), None, keep=1)
    ck.protected = {paths[0]}
    ck.prune()
    assert [p for _, p in ck.list()] == [paths[0], paths[2]]
    ck.protected = set()            # a newer best: the old one goes at the next prune
    ck.prune()
    assert [p for _, p in ck.list()] == [paths[2]]
    AtomicCheckpointer(str(tmp_path), None, keep=1, writer=False).prune()   # a reader never deletes
    assert os.path.isdir(paths[2])


# --- the flags ------------------------------------------------------------------------------------
def _dataset(tmp_path, channels, rows=600):
    """A feature-spec dataset of numerical columns (and the empty id channels of ``channels``)."""
    rng = np.random.default_rng(0)
    num = ["a", "b", "c"]
    for mapping, n in (("train", rows), ("test", rows // 4)):
        frame = pd.DataFrame({f: rng.normal(size=n).astype(np.float32) for f in num})
        frame["label"] = (frame["a"] > 0).astype(np.float32)
        (tmp_path / mapping).mkdir(parents=True, exist_ok=True)
        frame.to_parquet(tmp_path / mapping / "part.parquet")
    spec = {"feature_spec": {f: {"dtype": "float32"} for f in ["label", *num]},
            "source_spec": {m: [{"type": "parquet", "features": ["label", *num], "files": [f"{m}/part.parquet"]}]
                            for m in ("train", "test")},
            "channel_spec": {"label": ["label"], "numerical": num, **{ch: [] for ch in channels}}}
    (tmp_path / "feature_spec.yaml").write_text(yaml.safe_dump(spec))
    return tmp_path


def _cfg(*argv):
    return TrainConfig.from_args(build_parser().parse_args(list(map(str, argv))))


def test_small_data_keeps_the_best_and_stops_early_reference_data_does_not(tmp_path):
    data = _dataset(tmp_path, ["onehot_categorical", "multihot_categorical"])
    cfg = _cfg("--model", "wide_deep", "--data-path", data)
    assert (cfg.early_stop_patience, cfg.early_stop_min_delta, cfg.keep_best) == (2, 0.001, True)
    assert ("--epochs 10 --deep-warmup-epochs 1 --early-stop-patience 2 --early-stop-min-delta 0.001 --keep-best: "
            in dict(cfg.notes)["small_data_defaults"])
    given = _cfg("--model", "wide_deep", "--data-path", data, "--early-stop-patience", 0, "--no-keep-best")
    assert (given.early_stop_patience, given.keep_best) == (0, False)
    assert "--keep-best" not in dict(given.notes)["small_data_defaults"]
    synthetic = _cfg("--model", "wide_deep", "--synthetic")
    assert (synthetic.early_stop_patience, synthetic.early_stop_min_delta, synthetic.keep_best) == (0, 0.0, False)


@pytest.mark.parametrize("flag,value", [("--early-stop-patience", -1), ("--early-stop-min-delta", -0.5)])
def test_bad_early_stop_values_are_one_line(flag, value):
    with pytest.raises(EngineError, match=rf"^{flag} must be >= 0"):
        _cfg("--model", "dlrm", "--synthetic", flag, value)


# --- numerical columns alone (item 5) ----------------------------------------------------------------
def test_numerical_columns_alone_give_wide_deep_no_table(tmp_path):
    assert wide_deep_groups([], [], 16) == ()
    cfg = _cfg("--model", "wide_deep", "--data-path", _dataset(tmp_path, ["onehot_categorical",
                                                                           "multihot_categorical"]))
    assert cfg.embedding_groups == () and cfg.embedding_tables == []
    assert cfg.placement.fits and cfg.placement.mode == "replicated"
    # the deep MLP reads the numericals alone: its first layer is 3 wide (the estimate's 13 is DLRM's Criteo)
    assert cfg.dense_parameters == dense_params("wide_deep", (), deep_hidden_units=cfg.deep_hidden_units) > 0


def test_a_model_that_needs_ids_says_so_in_one_line(tmp_path):
    data = _dataset(tmp_path, ["categorical"])
    with pytest.raises(EngineError) as err:
        _cfg("--model", "dlrm", "--data-path", data)
    assert str(err.value) == (f"{data}/feature_spec.yaml: --model dlrm needs categorical features (channel "
                              f"categorical) and the spec has none: a table of numerical columns alone trains with "
                              f"--model wide_deep")
