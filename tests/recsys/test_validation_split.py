"""Issue 45 section 2: a training run on your own table judges its epochs on a validation split and
evaluates the test split once. `preproc tabular run` wrote train and test only, the engine evaluated
test after every epoch, and the early stop and the reported best were chosen on those test figures.
Now the spec has a `validation` mapping: every `eval` record is validation's, the test rows are
evaluated once at the end with the best evaluation's weights (kept in memory), and that figure equals
an `--run-mode evaluate` of the best checkpoint on test. A `--restore` run goes on judging on
validation; a 2-rank model-parallel run keeps each rank's shards."""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import REPO, SMALL, base_env, mpirun_cmd, read_log, records, run_train, summary, train_cmd


def _test_evals(log) -> list:
    return records(log, "test_eval")


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """A 1200-row table (the label follows the colour and x) through `preproc tabular run`, its
    default split: test 0.2, validation 0.1."""
    pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
    from preproc.cli import main

    out = tmp_path_factory.mktemp("validation")
    rng = np.random.default_rng(3)
    rows = 1200
    colour = rng.choice(["red", "blue", "pink", "grey"], rows)
    x = rng.normal(size=rows).round(3)
    shop = rng.integers(0, 30, rows)
    clicked = (rng.random(rows) < np.where(colour == "red", 0.65, 0.25) + 0.1 * np.tanh(x)).astype(int)
    pd.DataFrame({"clicked": clicked, "colour": colour, "shop": shop, "x": x}).to_csv(out / "t.csv", index=False)
    (out / "cfg.yaml").write_text(yaml.safe_dump({"label": "clicked", "categorical": ["colour", "shop"],
                                                  "numerical": ["x"]}))
    assert main(["tabular", "run", "--input", str(out / "t.csv"), "--config", str(out / "cfg.yaml"),
                 "--output", str(out / "data"), "--num-files", "2"]) == 0          # a file per rank
    spec = yaml.safe_load((out / "data" / "feature_spec.yaml").read_text())
    assert set(spec["source_spec"]) == {"train", "test", "validation"}
    return out


@pytest.fixture(scope="module")
def trained(table):
    log = table / "train.jsonl"
    res = run_train(["--model", "wide_deep", "--data-path", table / "data", *SMALL["wide_deep"], "--batch-size", "64",
                     "--epochs", "4", "--checkpoint-dir", table / "ck", "--keep-best", "--log-path", log])
    assert res.returncode == 0, res.stderr[-3000:]
    return read_log(log), res.stderr


def test_epochs_are_judged_on_validation_and_test_is_evaluated_once(trained):
    log, stderr = trained
    evals, s = records(log, "eval"), summary(log)
    assert len(evals) == 4 and {e["mapping"] for e in evals} == {"validation"}
    assert len(_test_evals(log)) == 1 and stderr.count("test evaluated once") == 1
    best = max(evals, key=lambda e: e["auc"])
    # the best is validation's; the summary's last metrics are the last validation evaluation's
    assert s["best_eval"]["step"] == best["step"] and s["best_eval"]["value"] == best["auc"]
    assert s["auc"] == evals[-1]["auc"] and s["eval_step"] == evals[-1]["step"]
    test = s["test_eval"]
    assert test == {k: v for k, v in _test_evals(log)[0].items() if k not in ("type", "time", "seconds")}
    assert test["mapping"] == "test" and test["weights"] == "best" and test["step"] == best["step"]
    assert test["epoch"] == best["epoch"] and 0 < test["metrics"]["auc"] < 1
    assert test["metrics"]["auc"] not in [e["auc"] for e in evals]          # other rows than validation's
    assert f"test (best weights, step {best['step']}): auc {test['metrics']['auc']:.5f}" in stderr
    assert f"with the weights of step {best['step']} epoch {best['epoch']} (the best auc on validation)" in stderr


def test_the_test_figure_is_an_evaluate_of_the_best_checkpoint(table, trained):
    log, _ = trained
    out = table / "evaluate.jsonl"
    res = run_train(["--model", "wide_deep", "--data-path", table / "data", *SMALL["wide_deep"],
                     "--checkpoint-dir", table / "ck", "--run-mode", "evaluate", "--log-path", out])
    assert res.returncode == 0, res.stderr[-3000:]
    test, s = summary(log)["test_eval"], summary(read_log(out))
    assert s["evaluated_checkpoint"].endswith(f"ckpt-{test['step']:010d}")
    assert [e["mapping"] for e in records(read_log(out), "eval")] == ["test"] and "test_eval" not in s
    assert s["auc"] == pytest.approx(test["metrics"]["auc"], abs=1e-9)
    assert s["bce"] == pytest.approx(test["metrics"]["bce"], rel=1e-6)


def test_a_restored_run_goes_on_judging_on_validation(table, trained):
    first, _ = trained
    ck = table / "ck-restore"
    shutil.copytree(table / "ck", ck)
    log = table / "restore.jsonl"
    res = run_train(["--model", "wide_deep", "--data-path", table / "data", *SMALL["wide_deep"], "--batch-size", "64",
                     "--epochs", "6", "--checkpoint-dir", ck, "--keep-best", "--restore", "--log-path", log])
    assert res.returncode == 0, res.stderr[-3000:]
    recs = read_log(log)
    evals, s = records(recs, "eval"), summary(recs)
    assert [e["mapping"] for e in evals] == ["validation"] * len(evals) and evals
    assert len(_test_evals(recs)) == 1
    every = {e["step"]: e["auc"] for e in records(first, "eval") + evals}
    best = max(every, key=every.get)
    assert s["best_eval"]["step"] == best
    test = s["test_eval"]
    if best in {e["step"] for e in evals}:      # beaten in this attempt: its weights are in memory
        assert test["weights"] == "best" and test["step"] == best
    else:                                       # the earlier attempt's best: the last weights, said so
        assert test["weights"] == "last" and test["step"] == s["step"]
        assert "the best validation evaluation came before this attempt" in res.stderr


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
def test_two_ranks_model_parallel_keep_their_own_best_shards(table):
    """Each rank copies and restores its own tables: the test figure equals a 2-rank evaluate of the
    best checkpoint (its shards written per rank)."""
    ck, log, out = table / "ck-mp", table / "mp.jsonl", table / "mp-eval.jsonl"
    args = ["--model", "dlrm", "--data-path", table / "data", "--feature-spec", table / "data" / "feature_spec_dlrm.yaml", *SMALL["dlrm"],
            "--batch-size", "64", "--epochs", "3", "--embedding-placement", "model_parallel",
            "--checkpoint-dir", ck, "--keep-best"]
    res = subprocess.run(mpirun_cmd(2, train_cmd(*args, "--log-path", log)), env=base_env(), cwd=REPO, text=True,
                         capture_output=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    recs = read_log(log)
    s = summary(recs)
    assert s["world_size"] == 2 and {e["mapping"] for e in records(recs, "eval")} == {"validation"}
    assert len(_test_evals(recs)) == 1 and s["test_eval"]["weights"] == "best"
    assert s["test_eval"]["step"] == s["best_eval"]["step"]
    assert json.loads((ck / "best.json").read_text())["step"] == s["best_eval"]["step"]
    res = subprocess.run(mpirun_cmd(2, train_cmd(*args, "--run-mode", "evaluate", "--log-path", out)),
                         env=base_env(), cwd=REPO, text=True, capture_output=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    evaluated = summary(read_log(out))
    assert evaluated["evaluated_checkpoint"].endswith(f"ckpt-{s['best_eval']['step']:010d}")
    assert evaluated["auc"] == pytest.approx(s["test_eval"]["metrics"]["auc"], abs=1e-9)
