"""Synthetic datasets in any feature-spec format, deterministic by seed, with a learnable signal.

Why: tests and first runs need data whose metric a model can improve, not
noise. The hidden model, fixed by the seed and shared by every mapping (so
what is learnt on ``train`` transfers to ``test``):

* DLRM: ``label ~ Bernoulli(sigmoid(logit))`` with ``logit`` = weighted sum
  of the first (up to) 4 numericals + per-id weights of the first (up to) 6
  categoricals (weights from a seeded hash of the id, so no tables are
  stored and any cardinality works) + a bias giving a ~25% click rate.
  Numericals are stored already transformed (``log(1 + Exponential)``), as
  the preprocessing would feed them; categorical ids are power-law skewed
  (small ids frequent), like frequency-ordered dictionaries.
* Wide & Deep: rows come in display groups of 2-6 ads (``display_id``
  increasing), exactly one click per display drawn by a softmax over the
  same kind of logit (numericals + one-hot + mean of multi-hot id weights).
* NCF: users and items with 4-d latent factors and item popularity; each
  user's interactions are drawn without replacement by Gumbel top-k over
  ``u.v + popularity``; the last one is the test positive.

Generation is in fixed blocks of rows with a generator seeded by
(seed, mapping, block), so output is identical for a seed whatever the
memory, and size is only limited by disk. Files are written under temporary
names and renamed; the feature spec is written last.

CLI: ``python -m recsys.data.synthetic --model dlrm --out DIR --rows N``.
"""
from __future__ import annotations

import argparse
import os
import sys
import zlib
from typing import Dict, List, Optional, Sequence

import numpy as np

from recsys.data.writer import ChunkWriter
from recsys.features.spec import FeatureSpec, categorical_dtype

MODELS = ("dlrm", "wide_deep", "ncf")
BLOCK_ROWS = 1 << 17
#: Small default cardinalities (the Criteo-like layout with 26 categoricals, CPU-test sized).
DLRM_CARDINALITIES = [(10, 100, 1000, 20, 500, 3, 2000, 50, 200, 10000)[i % 10] + i for i in range(26)]
WD_ONEHOT = [1000, 500, 100, 50, 20, 3000, 10, 200]
WD_MULTIHOT = {"multihot_0": (300, 3), "multihot_1": (100, 5)}


# ----------------------------------------------------------------- specs
def _split_binary_chunks(mapping: str, label: List[str], numerical: List[str], categorical: List[str]):
    chunks = [{"type": "split_binary", "features": label, "files": [f"{mapping}/label.bin"]}]
    if numerical:
        chunks.append({"type": "split_binary", "features": numerical, "files": [f"{mapping}/numerical.bin"]})
    for i, c in enumerate(categorical):
        chunks.append({"type": "split_binary", "features": [c], "files": [f"{mapping}/cat_{i}.bin"]})
    return chunks


def _parquet_chunks(mapping: str, features: List[str], num_files: int):
    return [{"type": "parquet", "features": features,
             "files": [f"{mapping}/part_{k:03d}.parquet" for k in range(num_files)]}]


def default_spec(model: str, num_numerical: Optional[int] = None, cardinalities: Optional[Sequence[int]] = None,
                 multihot: Optional[Dict[str, tuple]] = None, num_users: int = 500, num_items: int = 300,
                 fmt: Optional[str] = None, num_files: int = 2, mappings: Sequence[str] = ("train", "test"),
                 base_directory: Optional[str] = None) -> FeatureSpec:
    """A small spec of the model's layout (files relative, to be written by :func:`generate`).

    dlrm: ``num_numerical`` (13), ``cardinalities`` (26 small ones), fmt split_binary.
    wide_deep: ``num_numerical`` (13), ``cardinalities`` of the one-hot features,
    ``multihot`` {name: (cardinality, max_hotness)}, fmt parquet with
    ``num_files`` per mapping (>= training ranks), display_id in test.
    ncf: ``num_users``, ``num_items``, fmt split_binary.
    """
    if model not in MODELS:
        raise ValueError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    fmt = fmt or ("parquet" if model == "wide_deep" else "split_binary")
    if fmt not in ("split_binary", "parquet"):
        raise ValueError(f"fmt must be split_binary or parquet, got {fmt!r}")
    if model == "wide_deep" and fmt != "parquet":
        raise ValueError("Wide & Deep data is parquet only (multi-hot list columns)")
    features: Dict[str, dict] = {}
    source: Dict[str, list] = {}
    meta: Dict[str, object] = {"synthetic_model": model}
    if model == "dlrm":
        n_num = 13 if num_numerical is None else num_numerical
        cards = list(DLRM_CARDINALITIES if cardinalities is None else cardinalities)
        num = [f"num_{i}" for i in range(n_num)]
        cat = [f"cat_{i}" for i in range(len(cards))]
        features["label"] = {"dtype": "bool"}
        features.update({n: {"dtype": "float16" if fmt == "split_binary" else "float32"} for n in num})
        features.update({c: {"dtype": categorical_dtype(k), "cardinality": int(k)} for c, k in zip(cat, cards)})
        channels = {"label": ["label"], "numerical": num, "categorical": cat}
        for m in mappings:
            source[m] = (_split_binary_chunks(m, ["label"], num, cat) if fmt == "split_binary"
                         else _parquet_chunks(m, ["label"] + num + cat, num_files))
    elif model == "wide_deep":
        n_num = 13 if num_numerical is None else num_numerical
        cards = list(WD_ONEHOT if cardinalities is None else cardinalities)
        mh = dict(WD_MULTIHOT if multihot is None else multihot)
        num = [f"num_{i}" for i in range(n_num)]
        onehot = [f"onehot_{i}" for i in range(len(cards))]
        features["label"] = {"dtype": "bool"}
        features["display_id"] = {"dtype": "int64"}
        features.update({n: {"dtype": "float32"} for n in num})
        features.update({c: {"dtype": "int32", "cardinality": int(k)} for c, k in zip(onehot, cards)})
        features.update({c: {"dtype": "int32", "cardinality": int(k), "max_hotness": int(h)} for c, (k, h) in mh.items()})
        channels = {"label": ["label"], "numerical": num, "onehot_categorical": onehot,
                    "multihot_categorical": list(mh), "map": ["display_id"]}
        for m in mappings:
            source[m] = _parquet_chunks(m, ["label"] + num + onehot + list(mh) + ["display_id"], num_files)
    else:
        features = {"user": {"dtype": categorical_dtype(num_users), "cardinality": int(num_users)},
                    "item": {"dtype": categorical_dtype(num_items), "cardinality": int(num_items)},
                    "label": {"dtype": "bool"}}
        channels = {"user_ch": ["user"], "item_ch": ["item"], "label_ch": ["label"]}
        for m in mappings:
            if fmt == "split_binary":
                source[m] = [{"type": "split_binary", "features": [f], "files": [f"{m}/{f}.bin"]}
                             for f in ("user", "item", "label")]
            else:
                source[m] = _parquet_chunks(m, ["user", "item", "label"], num_files)
        meta["test_positives_per_user"] = 1
    return FeatureSpec(features, source, channels, meta, base_directory=base_directory)


# -------------------------------------------------------- hidden model
def _mix(x: np.ndarray, salt: int) -> np.ndarray:
    """splitmix64 of (x, salt) -> uint64; a cheap seeded hash for per-id weights."""
    z = x.astype(np.uint64) + np.uint64((salt * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _id_weight(ids: np.ndarray, seed: int, feature_index: int) -> np.ndarray:
    """Per-id weight in [-1, 1), fixed by (seed, feature)."""
    h = _mix(ids, seed * 1000003 + feature_index + 1)
    return (h >> np.uint64(11)).astype(np.float64) / float(1 << 53) * 2.0 - 1.0


def _skewed_ids(rng, n: int, cardinality: int) -> np.ndarray:
    return np.minimum((cardinality * rng.random(n) ** 3).astype(np.int64), cardinality - 1)


def _numericals(rng, n: int, k: int) -> np.ndarray:
    return np.log1p(rng.exponential(4.0, size=(n, k)))


def _feature_logit(spec: FeatureSpec, seed: int, num: np.ndarray, cats: Dict[str, np.ndarray],
                   multihot: Dict[str, np.ndarray]) -> np.ndarray:
    wrng = np.random.default_rng([seed, 7])
    logit = np.zeros(len(num))
    k = min(4, num.shape[1])
    if k:
        w = wrng.normal(0, 1.0, size=k)
        logit += (num[:, :k] - 1.5) @ w
    for i, name in enumerate(list(cats)[:6]):
        logit += 1.5 * _id_weight(cats[name], seed, i)
    for j, (name, ids) in enumerate(list(multihot.items())[:2]):
        w = _id_weight(np.maximum(ids, 0), seed, 100 + j) * (ids >= 0)
        logit += 1.5 * w.sum(1) / np.maximum((ids >= 0).sum(1), 1)
    return logit


def _mapping_rng(seed: int, mapping: str, block: int):
    return np.random.default_rng([seed, zlib.crc32(mapping.encode()), block])


# --------------------------------------------------------------- blocks
def _dlrm_block(spec, seed, rng, n):
    num_f, cat_f = spec.features("numerical"), spec.features("categorical")
    num = _numericals(rng, n, len(num_f))
    cats = {c: _skewed_ids(rng, n, spec.cardinality(c)) for c in cat_f}
    logit = _feature_logit(spec, seed, num, cats, {}) - 1.1
    label = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
    out = {"label": label}
    out.update({f: num[:, i] for i, f in enumerate(num_f)})
    out.update(cats)
    return out


def _wd_block(spec, seed, rng, n, first_display):
    num_f = spec.features("numerical")
    num = _numericals(rng, n, len(num_f))
    cats = {c: _skewed_ids(rng, n, spec.cardinality(c)) for c in spec.features("onehot_categorical")}
    multihot = {}
    for c in spec.features("multihot_categorical"):
        h = spec.hotness(c)
        ids = _skewed_ids(rng, n * h, spec.cardinality(c)).reshape(n, h)
        lengths = rng.integers(1, h + 1, size=n)
        ids[np.arange(h)[None, :] >= lengths[:, None]] = -1
        multihot[c] = ids
    logit = _feature_logit(spec, seed, num, cats, multihot)
    sizes = rng.integers(2, 7, size=n // 2 + 1)
    group = np.repeat(np.arange(len(sizes)), sizes)[:n]
    # exactly one click per display: Gumbel-max = a sample of softmax(logit) within each group
    z = logit + rng.gumbel(size=n)
    order = np.lexsort((-z, group))
    first = np.r_[True, group[order][1:] != group[order][:-1]]
    label = np.zeros(n, dtype=bool)
    label[order[first]] = True
    out = {"label": label, "display_id": first_display + group}
    out.update({f: num[:, i] for i, f in enumerate(num_f)})
    out.update(cats)
    out.update({c: _padded_to_lists(ids) for c, ids in multihot.items()})
    return out, int(group[-1]) + 1


def _padded_to_lists(ids: np.ndarray):
    """int [n, h] padded with -1 (values first) -> pyarrow list array, without a Python loop."""
    import pyarrow as pa
    lengths = (ids >= 0).sum(1)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids[ids >= 0].astype(np.int32)))


def _ncf_interactions(spec, seed, train_rows):
    """All users' train and test positives (users in order, last interaction = test)."""
    n_users, n_items = spec.cardinality("user"), spec.cardinality("item")
    per_user = max(1, train_rows // n_users) + 1
    if per_user > n_items:
        raise ValueError(f"{per_user} interactions per user but only {n_items} items")
    wrng = np.random.default_rng([seed, 11])
    item_vec = wrng.normal(0, 1, size=(n_items, 4))
    popularity = wrng.normal(0, 1, size=n_items)
    train_u, train_i, test_u, test_i = [], [], [], []
    block = max(1, (1 << 22) // n_items)
    for b, lo in enumerate(range(0, n_users, block)):
        users = np.arange(lo, min(n_users, lo + block))
        rng = _mapping_rng(seed, "ncf", b)
        user_vec = rng.normal(0, 1, size=(len(users), 4))
        z = 1.5 * user_vec @ item_vec.T + popularity + rng.gumbel(size=(len(users), n_items))
        top = np.argpartition(-z, per_user - 1, axis=1)[:, :per_user]
        top = rng.permuted(top, axis=1)  # interaction order: the last one is the held-out test positive
        train_u.append(np.repeat(users, per_user - 1))
        train_i.append(top[:, :-1].ravel())
        test_u.append(users)
        test_i.append(top[:, -1])
    return (np.concatenate(train_u), np.concatenate(train_i)), (np.concatenate(test_u), np.concatenate(test_i))


def _num_files(spec, mapping):
    return max(len(c["files"]) for c in spec.chunks(mapping))


def generate(spec: FeatureSpec, out_dir: str, rows: Optional[Dict[str, int]] = None, seed: int = 0) -> FeatureSpec:
    """Write every mapping of ``spec`` under ``out_dir`` (+ feature_spec.yaml); return the written spec.

    ``rows`` per mapping (default train 4096, others 1024). NCF: ``rows['train']``
    is the number of train positives (rounded to whole users) and every other
    mapping holds one positive per user.
    """
    out_dir = os.path.abspath(out_dir)
    spec = spec.copy(base_directory=out_dir)
    rows = dict(rows or {})
    for m in spec.mappings():
        rows.setdefault(m, 4096 if m == "train" else 1024)
    unknown = set(rows) - set(spec.mappings())
    if unknown:
        raise ValueError(f"rows given for mappings not in the spec: {sorted(unknown)}")
    from recsys.data.layout import model_kind
    kind = model_kind(spec)
    if kind == "ncf":
        (tu, ti), (su, si) = _ncf_interactions(spec, seed, rows.get("train", 4096))
        for m in spec.mappings():
            u, i = (tu, ti) if m == "train" else (su, si)
            rng = _mapping_rng(seed, m, 0)
            perm = rng.permutation(len(u)) if m == "train" else np.arange(len(u))
            n_files = _num_files(spec, m)
            w = ChunkWriter(spec, m)
            for k, part in enumerate(np.array_split(perm, n_files)):
                w.write({"user": u[part], "item": i[part], "label": np.ones(len(part), bool)}, k)
            w.close()
            rows[m] = len(u)
    else:
        for m in spec.mappings():
            n_files = _num_files(spec, m)
            w = ChunkWriter(spec, m)
            per_file = np.diff(np.linspace(0, rows[m], n_files + 1).astype(np.int64))
            block, first_display = 0, 1
            for k, n_file in enumerate(per_file):
                done = 0
                while done < n_file:
                    n = int(min(BLOCK_ROWS, n_file - done))
                    rng = _mapping_rng(seed, m, block)
                    if kind == "dlrm":
                        data = _dlrm_block(spec, seed, rng, n)
                    else:
                        data, groups = _wd_block(spec, seed, rng, n, first_display)
                        first_display += groups
                    w.write(data, k)
                    done += n
                    block += 1
            w.close()
    spec.metadata.update({"synthetic_seed": int(seed), "rows": {m: int(rows[m]) for m in spec.mappings()}})
    spec.to_yaml(os.path.join(out_dir, "feature_spec.yaml"))
    return FeatureSpec.from_yaml(os.path.join(out_dir, "feature_spec.yaml"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m recsys.data.synthetic", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, choices=MODELS)
    p.add_argument("--out", required=True, help="output directory (feature_spec.yaml + data files)")
    p.add_argument("--rows", type=int, default=4096, help="train rows (NCF: train positives)")
    p.add_argument("--test-rows", type=int, default=None, help="test rows (default rows/4; NCF: one per user)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=("split_binary", "parquet"), default=None)
    p.add_argument("--num-files", type=int, default=2, help="parquet files per mapping (>= training ranks)")
    p.add_argument("--num-users", type=int, default=500, help="NCF users")
    p.add_argument("--num-items", type=int, default=300, help="NCF items")
    a = p.parse_args(argv)
    if a.rows < 1:
        p.error("--rows must be >= 1")
    try:
        spec = default_spec(a.model, fmt=a.format, num_files=a.num_files, num_users=a.num_users, num_items=a.num_items)
        out = generate(spec, a.out, {"train": a.rows, "test": a.test_rows or max(1, a.rows // 4)}, seed=a.seed)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {os.path.join(a.out, 'feature_spec.yaml')} rows {out.metadata['rows']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
