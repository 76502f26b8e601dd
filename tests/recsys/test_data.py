"""Readers: values equal the files, tail handling, per-rank sharding (disjoint + complete), tf.data structure, NCF sampling."""
import numpy as np
import pytest

from recsys.data import make_dataset, make_reader, ncf, synthetic
from recsys.features.spec import FeatureSpecError


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    spec = synthetic.default_spec("dlrm", num_numerical=3, cardinalities=[7, 300, 70000])
    return synthetic.generate(spec, tmp_path_factory.mktemp("dlrm"), {"train": 1000, "test": 450}, seed=3)


@pytest.fixture(scope="module")
def wd(tmp_path_factory):
    spec = synthetic.default_spec("wide_deep", num_numerical=2, cardinalities=[50, 9], num_files=3)
    return synthetic.generate(spec, tmp_path_factory.mktemp("wd"), {"train": 900, "test": 400}, seed=4)


@pytest.fixture(scope="module")
def ncf_spec(tmp_path_factory):
    spec = synthetic.default_spec("ncf", num_users=60, num_items=40)
    return synthetic.generate(spec, tmp_path_factory.mktemp("ncf"), {"train": 600}, seed=5)


def raw(spec, mapping, file, dtype, width=1):
    return np.fromfile(spec.path(f"{mapping}/{file}"), dtype=dtype).reshape(-1, width)


def concat(batches):
    inputs, labels = zip(*batches)
    return {k: np.concatenate([b[k] for b in inputs]) for k in inputs[0] if not isinstance(inputs[0][k], dict)}, \
        np.concatenate(labels)


# ------------------------------------------------------------ split-binary
def test_split_binary_batches_equal_the_files_and_drop_the_tail(dlrm):
    reader = make_reader(dlrm, "train", 300)
    assert reader.num_batches == 3  # 1000 rows: 100-row tail dropped
    got, labels = concat(list(reader.numpy_batches()))
    assert got["numerical"].shape == (900, 3) and got["categorical"].shape == (900, 3)
    assert np.array_equal(got["numerical"], raw(dlrm, "train", "numerical.bin", np.float16, 3)[:900].astype(np.float32))
    for i, dtype in enumerate((np.int8, np.int16, np.int32)):
        assert dlrm.dtype(f"cat_{i}") == np.dtype(dtype).name
        assert np.array_equal(got["categorical"][:, i], raw(dlrm, "train", f"cat_{i}.bin", dtype)[:900, 0])
    assert np.array_equal(labels[:, 0], raw(dlrm, "train", "label.bin", bool)[:900, 0].astype(np.float32))
    assert got["categorical"].dtype == np.int32 and labels.dtype == np.float32


@pytest.mark.parametrize("drop", [True, False])
def test_split_binary_two_ranks_read_disjoint_shards_covering_the_data(dlrm, drop):
    batch = 100 if drop else 64  # 1000 rows: 10 full batches / 16 batches with a short last one
    shards = [concat(list(make_reader(dlrm, "train", batch, r, 2, drop_remainder=drop).numpy_batches()))
              for r in range(2)]
    full = raw(dlrm, "train", "numerical.bin", np.float16, 3).astype(np.float32)
    rows = np.concatenate([s[0]["numerical"] for s in shards])
    assert rows.shape == full.shape
    # every row exactly once: compare as sets of row tuples (rows are random floats, duplicates negligible)
    assert sorted(map(tuple, rows)) == sorted(map(tuple, full))
    a, b = ({tuple(x) for x in s[0]["numerical"]} for s in shards)
    assert not a & b


def test_split_binary_training_ranks_get_equal_batch_counts(dlrm):
    counts = [make_reader(dlrm, "train", 300, r, 2).num_batches for r in range(2)]
    assert counts == [1, 1]  # 3 full batches for 2 ranks: the surplus one is dropped
    with pytest.raises(FeatureSpecError, match="no full batch of 600 per rank"):
        make_reader(dlrm, "train", 600, 0, 2)


def test_split_binary_tf_dataset_structure_shuffle_and_cardinality(dlrm):
    import tensorflow as tf
    ds = make_dataset(dlrm, "train", 100, shuffle=True, seed=1)
    assert ds.cardinality().numpy() == 10
    inputs, labels = ds.element_spec
    assert inputs["numerical"].shape.as_list() == [100, 3] and inputs["numerical"].dtype == tf.float32
    assert inputs["categorical"].shape.as_list() == [100, 3] and inputs["categorical"].dtype == tf.int32
    assert labels.shape.as_list() == [100, 1] and labels.dtype == tf.float32
    order = lambda d: [float(x["numerical"][0, 0]) for x, _ in d]  # noqa: E731
    plain = order(make_dataset(dlrm, "train", 100))
    e1, e2 = order(ds), order(ds)  # two epochs reshuffle
    assert sorted(e1) == sorted(plain) and e1 != plain and e1 != e2
    assert order(make_dataset(dlrm, "train", 100, shuffle=True, seed=1)) == e1  # deterministic by seed
    reps = make_dataset(dlrm, "train", 100, repeat=True).take(25)
    assert sum(1 for _ in reps) == 25
    # eval mapping: every row, short last batch
    test = list(make_dataset(dlrm, "test", 200))
    assert [int(t[1].shape[0]) for t in test] == [200, 200, 50]


# ----------------------------------------------------------------- parquet
def test_parquet_values_equal_the_files_and_multihot_is_padded(wd):
    import pyarrow.parquet as pq
    table = pq.read_table([wd.path(f) for f in wd.chunks("test")[0]["files"]][0])
    reader = make_reader(wd, "test", 64, 0, 3)  # rank 0 of 3 reads part_000 only
    (inputs, labels), = [next(iter(reader.numpy_batches()))]
    n = len(labels)
    assert np.array_equal(inputs["map"], table.column("display_id").to_numpy()[:n])
    assert np.array_equal(inputs["onehot_categorical"]["onehot_1"], table.column("onehot_1").to_numpy()[:n])
    assert np.allclose(inputs["numerical"][:, 1], table.column("num_1").to_numpy()[:n])
    mh = inputs["multihot_categorical"]["multihot_1"]
    assert mh.shape == (n, 5) and mh.dtype == np.int32
    for row, ids in zip(mh, table.column("multihot_1").to_pylist()[:n]):
        assert list(row[:len(ids)]) == ids and all(row[len(ids):] == -1)


@pytest.mark.parametrize("mapping", ["train", "test"])
def test_parquet_shards_are_disjoint_and_complete(wd, mapping):
    ranks = [make_reader(wd, mapping, 50, r, 3, drop_remainder=False) for r in range(3)]
    seen = [np.concatenate([b[0]["numerical"][:, 0] for b in r.numpy_batches()]) for r in ranks]
    total = wd.num_rows(mapping)
    assert sum(len(s) for s in seen) == total
    allv = np.concatenate(seen)
    assert len(np.unique(allv)) == total  # float32 random values: distinct rows
    if mapping == "test":  # display groups never straddle ranks
        groups = [set(np.concatenate([b[0]["map"] for b in r.numpy_batches()])) for r in ranks]
        assert not (groups[0] & groups[1]) and not (groups[1] & groups[2])


def test_parquet_training_batches_full_and_equal_per_rank(wd):
    readers = [make_reader(wd, "train", 100, r, 2) for r in range(2)]
    counts = [sum(1 for _ in r.numpy_batches(shuffle=True, seed=2)) for r in readers]
    assert counts[0] == counts[1] == readers[0].num_batches > 0
    for r in readers:
        assert all(len(lab) == 100 for _, lab in r.numpy_batches())


def test_parquet_needs_a_file_per_rank(wd):
    with pytest.raises(FeatureSpecError, match="3 parquet file\\(s\\) for 4 ranks"):
        make_reader(wd, "train", 10, 0, 4)


def test_parquet_tf_dataset(wd):
    import tensorflow as tf
    ds = make_dataset(wd, "train", 100, rank=1, world_size=2, shuffle=True, seed=0)
    batches = list(ds)
    assert len(batches) == ds.cardinality().numpy() > 0
    inputs, labels = batches[0]
    assert inputs["multihot_categorical"]["multihot_0"].shape == (100, 3)
    assert inputs["onehot_categorical"]["onehot_0"].dtype == tf.int32
    assert labels.shape == (100, 1)
    test = list(make_dataset(wd, "test", 64))
    assert sum(int(t[1].shape[0]) for t in test) == wd.num_rows("test")
    assert test[0][0]["map"].dtype == tf.int64


# --------------------------------------------------------------------- NCF
def test_ncf_layout_and_sampling(ncf_spec):
    users, items = ncf.load_pairs(ncf_spec, "train")
    tu, ti = ncf.load_pairs(ncf_spec, "test")
    assert len(users) == 600 and np.array_equal(np.sort(tu), np.arange(60))  # one test positive per user
    known = set(zip(users.tolist(), items.tolist())) | set(zip(tu.tolist(), ti.tolist()))
    assert len(known) == 660  # no duplicate interactions, test positive not in train
    inputs, labels = next(make_reader(ncf_spec, "train", 100).numpy_batches())
    assert set(inputs) == {"user", "item"} and inputs["user"].dtype == np.int32 and labels.shape == (100, 1)

    sampler = ncf.TrainSampler(users, items, 40, num_negatives=4, seed=1)
    u, i, y = sampler.epoch(0)
    assert len(u) == len(sampler) == 3000 and y.sum() == 600
    train_pos = set(zip(users.tolist(), items.tolist()))
    assert all((a, b) not in train_pos for a, b in zip(u[y == 0].tolist(), i[y == 0].tolist()))
    _, i1, _ = sampler.epoch(1)
    assert not np.array_equal(i, i1)  # resampled per epoch
    assert all(np.array_equal(a, b) for a, b in zip(sampler.epoch(0), (u, i, y)))  # deterministic

    eu, eitems, elabels = ncf.eval_set(tu, ti, users, items, 40, num_negatives=20, seed=0)
    assert eitems.shape == (60, 21) and np.array_equal(eitems[:, 0], ti) and elabels[:, 0].all()
    for user, row in zip(eu.tolist(), eitems[:, 1:].tolist()):
        assert all((user, it) not in known for it in row)
    parts = [ncf.shard((eu, eitems), r, 3, equal=False) for r in range(3)]
    assert np.array_equal(np.concatenate([p[0] for p in parts]), eu)


@pytest.mark.parametrize("shuffle", [False, True])
def test_parquet_tf_pipeline_reads_the_same_rows_as_numpy(wd, shuffle):
    reader = make_reader(wd, "test", 64, 1, 2)  # rank 1 of 2: file 1 only of 3
    tf_rows = np.concatenate([x["numerical"].numpy() for x, _ in reader.dataset(shuffle=shuffle, seed=3)])
    np_rows = np.concatenate([x["numerical"] for x, _ in reader.numpy_batches(shuffle=shuffle, seed=3)])
    assert tf_rows.shape == np_rows.shape and len(tf_rows) == reader.rows
    assert sorted(map(tuple, tf_rows)) == sorted(map(tuple, np_rows))


def test_ncf_stored_test_negatives(tmp_path):
    """A test mapping with preprocessing-written negatives: load_pairs keeps positives, stored_eval_set the blocks."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from recsys.features.spec import FeatureSpec
    (tmp_path / "t").mkdir()
    pq.write_table(pa.table({"user": pa.array([0, 0, 1], pa.int32()), "item": pa.array([1, 2, 0], pa.int32()),
                             "label": pa.array([1.0, 1.0, 1.0], pa.float32())}), tmp_path / "t/train.parquet")
    pq.write_table(pa.table({"user": pa.array([0, 0, 0, 1, 1, 1], pa.int32()),
                             "item": pa.array([3, 0, 4, 2, 3, 4], pa.int32()),
                             "label": pa.array([1, 0, 0, 1, 0, 0], pa.float32())}), tmp_path / "t/test.parquet")
    feats = ["user", "item", "label"]
    spec = FeatureSpec({"user": {"dtype": "int32", "cardinality": 2}, "item": {"dtype": "int32", "cardinality": 5},
                        "label": {"dtype": "float32"}},
                       {"train": [{"type": "parquet", "features": feats, "files": ["t/train.parquet"]}],
                        "test": [{"type": "parquet", "features": feats, "files": ["t/test.parquet"]}]},
                       {"user_ch": ["user"], "item_ch": ["item"], "label_ch": ["label"]},
                       {"test_samples_per_series": 3}, base_directory=str(tmp_path))
    u, i = ncf.load_pairs(spec, "test")
    assert u.tolist() == [0, 1] and i.tolist() == [3, 2]
    users, items, labels = ncf.stored_eval_set(spec)
    assert users.tolist() == [0, 1] and items.tolist() == [[3, 0, 4], [2, 3, 4]] and labels[:, 0].all()
    spec.metadata["test_samples_per_series"] = 4
    with pytest.raises(FeatureSpecError, match="blocks of test_samples_per_series=4"):
        ncf.stored_eval_set(spec)


@pytest.mark.parametrize("model", ["dlrm", "ncf"])
def test_same_rows_from_split_binary_and_parquet(tmp_path, model):
    """The channel packing does not depend on the storage format (mixed int8/16/32 columns included)."""
    kw = dict(num_numerical=3, cardinalities=[7, 300, 70000]) if model == "dlrm" else {}
    rows = {"train": 512, "test": 100}
    a = synthetic.generate(synthetic.default_spec(model, fmt="split_binary", **kw), tmp_path / "a", rows, seed=1)
    b = synthetic.generate(synthetic.default_spec(model, fmt="parquet", num_files=1, **kw), tmp_path / "b", rows, seed=1)
    (xa, ya), = list(make_reader(a, "train", 500).numpy_batches())
    (xb, yb), = list(make_reader(b, "train", 500).numpy_batches())
    assert np.array_equal(ya, yb)
    for key in xa:
        assert xa[key].dtype == xb[key].dtype
        assert np.allclose(xa[key], xb[key], rtol=1e-3)  # float16 vs float32 storage of numericals
