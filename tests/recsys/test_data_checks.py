"""Issue 37, items 2-4: the readers refuse labels outside {0, 1}, ids outside the feature spec's
tables and parquet columns of the wrong type, one line naming the file, row (or type) and column;
an evaluation set on which AUC is undefined (one class, one row) stops the run before training.

Numpy/pyarrow only (``fast``) on tiny synthetic datasets, except the ``--reader merlin`` checks
(TensorFlow) and one ``recsys-train`` run that checks the exit code and the one line of a one-class
test set."""
from __future__ import annotations

import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recsys.data import make_reader, synthetic
from recsys.errors import DataError

from conftest import SMALL, run_train

ROWS = {"train": 256, "test": 64}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """{model: directory} of tiny clean datasets: Wide & Deep parquet, DLRM split-binary."""
    out = {}
    for model in ("wide_deep", "dlrm"):
        base = tmp_path_factory.mktemp(f"clean-{model}")
        synthetic.generate(synthetic.default_spec(model, num_files=1), str(base), ROWS, seed=3)
        out[model] = base
    return out


def copy(datasets, model, tmp_path):
    return shutil.copytree(datasets[model], tmp_path / model)


def rewrite_column(path, name, values, type_=None):
    table = pq.read_table(path)
    table = table.set_column(table.schema.get_field_index(name), name, [pa.array(values, type=type_)])
    pq.write_table(table, path)


def spec_of(data):
    """The feature spec of a copied dataset, as YAML data."""
    import yaml

    return yaml.safe_load((data / "feature_spec.yaml").read_text())


def first_feature(spec, channel):
    """(the first feature of `channel`, its table's size)."""
    feature = spec["channel_spec"][channel][0]
    return feature, spec["feature_spec"][feature].get("cardinality")


def read_all(directory, mapping="train"):
    return list(make_reader(str(directory / "feature_spec.yaml"), mapping, 32, drop_remainder=False).numpy_batches())


@pytest.mark.fast
@pytest.mark.parametrize("label", [2, -1, 0.5])
def test_parquet_reader_refuses_a_label_outside_0_1(datasets, tmp_path, label):
    data = copy(datasets, "wide_deep", tmp_path)
    path = data / "train" / "part_000.parquet"
    labels = pq.read_table(path).column("label").to_numpy().astype(np.float32)
    labels[37] = label
    rewrite_column(path, "label", labels)
    with pytest.raises(DataError, match=rf"part_000\.parquet: row 37: label label is {float(label)}: labels must be 0 or 1"):
        read_all(data)


@pytest.mark.fast
def test_split_binary_reader_refuses_a_label_outside_0_1(datasets, tmp_path):
    """A float32 label file (a bool one cannot hold anything else) with a 2 in row 70."""
    import yaml
    data = copy(datasets, "dlrm", tmp_path)
    spec = yaml.safe_load((data / "feature_spec.yaml").read_text())
    label = spec["channel_spec"]["label"][0]
    spec["feature_spec"][label]["dtype"] = "float32"
    (data / "feature_spec.yaml").write_text(yaml.safe_dump(spec))
    chunk = next(c for c in spec["source_spec"]["train"] if c["features"] == [label])
    path = data / chunk["files"][0]
    values = np.fromfile(path, np.bool_).astype(np.float32)
    values[70] = 2
    values.tofile(path)
    with pytest.raises(DataError, match=rf"{path.name}: row 70: label {label} is 2\.0: labels must be 0 or 1"):
        read_all(data)


@pytest.mark.fast
@pytest.mark.parametrize("bad", ["at_size", "negative"])
def test_parquet_reader_refuses_onehot_ids_outside_the_table(datasets, tmp_path, bad):
    data = copy(datasets, "wide_deep", tmp_path)
    spec = spec_of(data)
    feature, size = first_feature(spec, "onehot_categorical")
    path = data / "train" / "part_000.parquet"
    ids = pq.read_table(path).column(feature).to_numpy().copy()
    ids[101] = size if bad == "at_size" else -1
    rewrite_column(path, feature, ids)
    with pytest.raises(DataError, match=rf"part_000\.parquet: row 101: id {ids[101]} of {feature} outside "
                                        rf"\[0, {size}\)"):
        read_all(data)


@pytest.mark.fast
def test_parquet_reader_refuses_multihot_ids_outside_the_table(datasets, tmp_path):
    """A stored -1 in a list is an error, not padding; the row is the list's row."""
    data = copy(datasets, "wide_deep", tmp_path)
    spec = spec_of(data)
    feature, size = first_feature(spec, "multihot_categorical")
    path = data / "test" / "part_000.parquet"
    lists = pq.read_table(path).column(feature).to_pylist()
    lists[9] = [1, -1]
    rewrite_column(path, feature, lists, pa.list_(pa.int32()))
    with pytest.raises(DataError, match=rf"part_000\.parquet: row 9: id -1 of {feature} outside \[0, {size}\)"):
        read_all(data, "test")


@pytest.mark.fast
def test_split_binary_reader_refuses_ids_outside_the_table(datasets, tmp_path):
    """The split-binary check (issue 11) now shares the readers' one check: the same line."""
    import yaml
    data = copy(datasets, "dlrm", tmp_path)
    spec = yaml.safe_load((data / "feature_spec.yaml").read_text())
    feature = spec["channel_spec"]["categorical"][2]
    size = spec["feature_spec"][feature]["cardinality"]
    path = data / spec_file_of(spec, feature)
    ids = np.fromfile(path, np.dtype(spec["feature_spec"][feature]["dtype"]))
    ids[40] = -1
    ids.tofile(path)
    with pytest.raises(DataError, match=rf"row 40: id -1 of {feature} outside \[0, {size}\)"):
        read_all(data)


def spec_file_of(spec, feature):
    return next(c["files"][0] for c in spec["source_spec"]["train"] if feature in c["features"])


@pytest.mark.fast
@pytest.mark.parametrize("kind", ["string", "struct", "list"])
def test_parquet_reader_refuses_a_numerical_column_of_text_or_nested_values(datasets, tmp_path, kind):
    """Was a 29-line traceback (numpy could not convert 'abc' to float) at the first batch."""
    data = copy(datasets, "wide_deep", tmp_path)
    path = data / "train" / "part_000.parquet"
    values = pq.read_table(path).column("num_0").to_pylist()
    new = {"string": [str(v) for v in values[:-1]] + ["abc"], "struct": [{"x": v} for v in values],
           "list": [[v] for v in values]}[kind]
    rewrite_column(path, "num_0", new)
    with pytest.raises(DataError, match=rf"part_000\.parquet: column 'num_0' is {kind}.*: the feature spec's "
                                        rf"float32 num_0 needs numbers"):
        make_reader(str(data / "feature_spec.yaml"), "train", 32)       # at the footers, before any read


@pytest.mark.fast
def test_evaluation_problem_one_class_one_row_and_clean(datasets, tmp_path):
    from recsys.data import evaluation_problem
    assert evaluation_problem(str(datasets["wide_deep"] / "feature_spec.yaml")) is None
    assert evaluation_problem(str(datasets["dlrm"] / "feature_spec.yaml")) is None
    data = copy(datasets, "wide_deep", tmp_path)
    path = data / "test" / "part_000.parquet"
    rewrite_column(path, "label", np.ones(ROWS["test"], np.float32))
    problem = evaluation_problem(str(data / "feature_spec.yaml"))
    assert problem.endswith("test: AUC is undefined on one class (1.0: 64 rows): the evaluation needs rows of "
                            "both labels, 0 and 1 (split the data so that the test rows hold both)")
    table = pq.read_table(path)
    pq.write_table(table.slice(0, 1), path)
    spec = spec_of(data)
    assert "AUC is undefined on 1 row(s)" in evaluation_problem(str(data / "feature_spec.yaml"))
    assert spec                                                          # the spec itself is unchanged


@pytest.mark.fast
def test_evaluation_problem_of_a_split_binary_test_set(datasets, tmp_path):
    """DLRM's split-binary test labels (a memory-mapped column, the Criteo path): one class, and
    a float32 label file holding a 2, each one line before training."""
    import yaml
    from recsys.data import evaluation_problem
    data = copy(datasets, "dlrm", tmp_path)
    spec = spec_of(data)
    label = spec["channel_spec"]["label"][0]
    path = data / next(c for c in spec["source_spec"]["test"] if c["features"] == [label])["files"][0]
    np.zeros(ROWS["test"], np.bool_).tofile(path)
    assert evaluation_problem(str(data / "feature_spec.yaml")) == (
        f"{data}/feature_spec.yaml: test: AUC is undefined on one class (0: {ROWS['test']} rows): the evaluation "
        f"needs rows of both labels, 0 and 1 (split the data so that the test rows hold both)")
    spec["feature_spec"][label]["dtype"] = "float32"
    (data / "feature_spec.yaml").write_text(yaml.safe_dump(spec))
    values = np.tile(np.float32([0, 1]), ROWS["test"] // 2)
    values[5] = 2
    values.tofile(path)
    assert evaluation_problem(str(data / "feature_spec.yaml")).endswith(
        "test: labels must be 0 or 1, the label column holds 0.0: 32 rows, 1.0: 31 rows, 2.0: 1 rows: map the "
        "classes to 0/1 in the preprocessing")


def test_merlin_reader_refuses_labels_and_ids_outside_their_range(datasets, tmp_path):
    """`--reader merlin` (TensorFlow and Merlin: not fast, 4 s alone) runs the same checks on the
    loader's batches: a label of 2, a one-hot id at its table's size, a -1 in a multi-hot list."""
    pytest.importorskip("merlin.dataloader", reason="Merlin is not installed (pip install .[nvtabular])")
    spec = spec_of(datasets["wide_deep"])
    onehot, size = first_feature(spec, "onehot_categorical")
    multihot, multi_size = first_feature(spec, "multihot_categorical")
    cases = {"label": (37, "label label is 2.0: labels must be 0 or 1"),
             onehot: (101, rf"id {size} of {onehot} outside \[0, {size}\)"),
             multihot: (9, rf"id -1 of {multihot} outside \[0, {multi_size}\)")}
    for column, (row, why) in cases.items():
        data = shutil.copytree(datasets["wide_deep"], tmp_path / column)
        path = data / "train" / "part_000.parquet"
        if column == multihot:
            lists = pq.read_table(path).column(column).to_pylist()
            lists[row] = [1, -1]
            rewrite_column(path, column, lists, pa.list_(pa.int32()))
        else:
            values = pq.read_table(path).column(column).to_numpy().copy()
            if column == "label":
                values = values.astype(np.float32)              # a bool column cannot hold a 2
            values[row] = 2 if column == "label" else size
            rewrite_column(path, column, values)
        with pytest.raises(DataError, match=rf"train \(--reader merlin, rank 0\): row {row} of this rank's rows: "
                                            rf"{why}"):
            list(make_reader(str(data / "feature_spec.yaml"), "train", 32, reader="merlin").numpy_batches())


def test_recsys_train_stops_on_a_one_class_test_set(datasets, tmp_path):
    """Was `auc=nan` in the summary and exit 0: now one line, exit 2, before the first step."""
    data = copy(datasets, "wide_deep", tmp_path)
    rewrite_column(data / "test" / "part_000.parquet", "label", np.zeros(ROWS["test"], np.float32))
    res = run_train(["--model", "wide_deep", "--data-path", data, *SMALL["wide_deep"], "--batch-size", "64",
                     "--epochs", "1"])
    errors = [line for line in res.stderr.splitlines() if "error" in line.lower()]
    assert res.returncode == 2, res.stderr[-2000:]
    assert errors == [f"recsys-train: error: {data}/feature_spec.yaml: test: AUC is undefined on one class "
                      f"(0.0: 64 rows): the evaluation needs rows of both labels, 0 and 1 (split the data so "
                      f"that the test rows hold both)"], res.stderr[-2000:]
    assert "step" not in res.stdout
