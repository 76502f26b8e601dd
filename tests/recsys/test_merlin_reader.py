"""``--reader merlin``: the Merlin dataloader over NVTabular output gives the tf.data reader's batches.

Data: generated Criteo days preprocessed by ``criteo run --engine nvtabular``
(1000 training rows in 4 parquet files of 250, shuffled order; test and
validation one file each). Without shuffling both readers must yield exactly the
same batches (every tensor equal, same count) for 1 rank and for each of 2
ranks: rank r reads files r, r+w, ... in order, rows flowing across file
boundaries (batch 96 does not divide 250). A file count Merlin cannot split that
way is refused. Then a 5-step DLRM training run on the same data works with
both readers.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import SMALL, read_log, run_train, summary

pytest.importorskip("merlin.dataloader", reason="Merlin is not installed (pip install .[nvtabular])")


@pytest.fixture(scope="module")
def nvt_criteo(tmp_path_factory):
    from preproc.criteo import nvt as criteo_nvt
    from preproc.criteo.generate import generate
    from preproc.criteo.layout import day_files, parse_thresholds
    from preproc.dataio.output import input_files

    base = tmp_path_factory.mktemp("merlin_reader")
    generate(base / "raw", rows=1500, days=3, seed=5)
    found = day_files(input_files(base / "raw"))
    files = [(idx, day, path) for idx, (day, path) in enumerate(found)]
    criteo_nvt.run(files, found[-1][0], parse_thresholds("2"), str(base / "out"), part_rows=250)
    assert len(list((base / "out" / "train").glob("part_*.parquet"))) == 4
    return base / "out"


def _batches(reader_kind, out, mapping, batch, rank, world, drop=None):
    from recsys.data import make_dataset

    ds = make_dataset(str(out / "feature_spec.yaml"), mapping, batch, rank, world, shuffle=False,
                      drop_remainder=drop, reader=reader_kind)
    return [(x, y.numpy()) for x, y in ds]


@pytest.mark.parametrize("world", [1, 2])
def test_same_batches_as_tfdata_reader(nvt_criteo, world):
    for rank in range(world):
        for mapping, drop in (("train", None), ("test", False)):
            if mapping == "test" and world > 1:
                continue  # one test file: the tf.data reader needs a file per rank
            ref = _batches("tfdata", nvt_criteo, mapping, 96, rank, world, drop)
            got = _batches("merlin", nvt_criteo, mapping, 96, rank, world, drop)
            assert len(got) == len(ref) > 0, (mapping, rank)
            for (gx, gy), (rx, ry) in zip(got, ref):
                np.testing.assert_array_equal(gy, ry)
                assert sorted(gx) == sorted(rx) == ["categorical", "numerical"]
                for key in rx:
                    np.testing.assert_array_equal(gx[key].numpy(), rx[key].numpy())
    if world == 1:
        rows = sum(len(y) for _, y in _batches("merlin", nvt_criteo, "test", 96, 0, 1, False))
        assert rows == 250  # the whole test mapping, last batch short


def test_file_split_merlin_cannot_match_is_refused():
    from recsys.data.merlin import merlin_file_order

    assert merlin_file_order(4, 2) == [0, 2, 1, 3]
    assert merlin_file_order(5, 2) == [0, 2, 4, 1, 3]
    with pytest.raises(ValueError, match="multiple of 3"):
        merlin_file_order(7, 3)


@pytest.mark.parametrize("reader", ["tfdata", "merlin"])
def test_dlrm_trains_five_steps(nvt_criteo, tmp_path, reader):
    log = tmp_path / "log.jsonl"
    args = [a if a != "256" else "64" for a in SMALL["dlrm"]]
    res = run_train(["--model", "dlrm", "--data-path", str(nvt_criteo), "--reader", reader, *args,
                     "--epochs", "1", "--max-steps", "5", "--log-path", str(log), "--log-every", "1"])
    assert res.returncode == 0, res.stderr[-3000:]
    recs = read_log(log)
    s = summary(recs)
    assert s["step"] == 5 and 0 < s["final_loss"] < 5, s
    assert [r for r in recs if r["type"] == "params"][0]["reader"] == reader


def test_non_finite_numerical_is_refused_naming_the_column(nvt_criteo, tmp_path):
    """The Merlin path refuses a NaN numerical like the tf.data readers (DataError, one line)."""
    import shutil

    import pyarrow.parquet as pq
    from recsys.data import make_reader
    from recsys.errors import DataError

    out = tmp_path / "out"
    shutil.copytree(nvt_criteo, out)
    path = sorted((out / "train").glob("part_*.parquet"))[0]
    table = pq.read_table(path)
    name = next(n for n in table.column_names if table.column(n).type in ("float", "double"))
    column = table.column(name).to_numpy().copy()
    column[7] = np.nan
    pq.write_table(table.set_column(table.schema.get_field_index(name), name, [column]), path)
    with pytest.raises(DataError, match=rf"train \(--reader merlin, rank 0\): row \d+ of this rank's rows: "
                                        rf"{name} is nan: numerical values must be finite"):
        list(make_reader(str(out / "feature_spec.yaml"), "train", 96, reader="merlin").numpy_batches())
