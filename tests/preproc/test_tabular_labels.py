"""Issue 37, items 1 and 4-6: `preproc tabular` refuses a label not coded 0/1 (naming the values and
the `positive` key that maps them), a split of one class, more bad rows than `--max-bad-rows`, nested
parquet columns outside `multihot`, and says per model what a table needs; bad-row messages name the
column, the reason and the first rows; a 1-row table, unquoted numeric column names and the import
noise of every run.

Pure pandas/pyarrow checks are ``fast``; the pipeline runs in process on tables of a few hundred
rows (about a second each after NVTabular's import), and one `python -m preproc` run checks stderr."""
from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from preproc.dataio import bad_rows
from preproc.errors import PreprocError
from preproc.tabular import read
from preproc.tabular.config import parse_config

REPO = Path(__file__).resolve().parents[2]


def table(rows: int = 300, labels=(0, 1), seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"y": rng.choice(labels, rows), "c": rng.choice(["a", "b", "c"], rows),
                         "x": rng.normal(size=rows).round(3)})


def parsed(frame: pd.DataFrame, config) -> pd.DataFrame:
    return read.parse_piece(frame.astype(str), 0, 0, config)


def scan_labels(frame, config):
    out = parsed(frame, config)
    read.check_labels(out["_label_kind"].value_counts(), out["_label_other"].dropna().value_counts(), config)
    return out


# --- item 1: the label's classes, pure ------------------------------------------------------------
@pytest.mark.fast
@pytest.mark.parametrize("labels, seen, suggest", [((-1, 1), "'-1'", "1"), ((1, 2), "'2'", "2"),
                                                   ((0, 5), "'5'", "5")])
def test_a_label_column_not_coded_0_1_is_refused_naming_values_and_the_key(labels, seen, suggest):
    config = parse_config({"label": "y", "categorical": ["c"]}, "my.yaml")
    with pytest.raises(PreprocError) as err:
        scan_labels(table(labels=labels), config)
    message = str(err.value)
    assert message.startswith("my.yaml: label column 'y' must hold the two classes 0 and 1; values seen: ")
    assert f"{seen} (" in message and " rows)" in message and "\n" not in message
    assert message.endswith(f"map them with `label: {{column: y, positive: [{suggest}]}}` (the values in "
                            "`positive` -> 1, every other value -> 0)")


@pytest.mark.fast
@pytest.mark.parametrize("labels, suggest", [(("yes", "no", "no"), "'yes'"), (("True", "False", "False"), "'True'")])
def test_the_printed_positive_mapping_works_when_pasted_into_the_yaml(labels, suggest):
    """A yes/no or True/False column: the mapping the message prints, pasted as printed, maps the
    column. Bare, `no` and `True` are booleans to YAML, which `positive` refuses with a quoting hint."""
    config = parse_config({"label": "y", "categorical": ["c"]}, "my.yaml")
    frame = table(labels=labels)
    with pytest.raises(PreprocError) as err:
        scan_labels(frame, config)
    mapping = re.search(r"`(label: \{.*?\})`", str(err.value)).group(1)
    assert mapping == f"label: {{column: y, positive: [{suggest}]}}"
    out = scan_labels(frame, parse_config({**yaml.safe_load(mapping), "categorical": ["c"]}, "my.yaml"))
    assert out["label"].tolist() == (frame["y"] == suggest.strip("'")).astype(float).tolist()
    bare = yaml.safe_load(mapping.replace(suggest, suggest.strip("'")))
    with pytest.raises(PreprocError, match=r"^my\.yaml: label\.positive: must be a value or a non-empty list of "
                                           r"values \(YAML reads a bare yes/no, true/false or on/off as a boolean: "
                                           r"quote the label's value, e\.g\. positive: \['yes'\]\)$"):
        parse_config({**bare, "categorical": ["c"]}, "my.yaml")


@pytest.mark.fast
def test_positive_maps_the_listed_values_to_1_and_the_others_to_0():
    config = parse_config({"label": {"column": "y", "positive": [1]}, "categorical": ["c"]})
    frame = table(labels=(-1, 1))
    out = scan_labels(frame, config)
    assert out["label"].tolist() == (frame["y"] == 1).astype(float).tolist() and not out["_bad"].any()


@pytest.mark.fast
@pytest.mark.parametrize("positive", [1, 1.0, "1.0"])
def test_positive_written_as_a_float_matches_float_labels(positive):
    # `positive: [1.0]` (or 1, '1.0') and a column's 1.0 (a float, or "1.0" in a CSV) are one value:
    # they were "1.0" against "1" for a parquet float column, so nothing matched
    config = parse_config({"label": {"column": "y", "positive": [positive]}, "categorical": ["c"]})
    frame = table(labels=(-1, 1))
    frame["y"] = frame["y"].astype(float)
    assert config.positive == ("1",)
    for out in (scan_labels(frame, config),                                 # CSV: the text "1.0"
                read.parse_piece(frame, 0, 0, config)):                     # parquet: the float 1.0
        assert out["label"].tolist() == (frame["y"] == 1).astype(float).tolist() and out["label"].sum() > 0


@pytest.mark.fast
def test_bad_rows_skip_fails_above_the_stated_share():
    counts = {"t.csv": (3, 200)}
    assert bad_rows.enforce(counts, "skip", "tabular", max_share=0.02)["t.csv"]["bad_rows"] == 3
    with pytest.raises(PreprocError, match=r"^tabular: 3 of 200 rows bad \(1\.5%\), more than --max-bad-rows 0\.01 "
                                           r"of the rows that --bad-rows skip may drop \(x: why\); fix the input, "
                                           r"or raise --max-bad-rows$"):
        bad_rows.enforce(counts, "skip", "tabular", max_share=0.01, details="x: why")


@pytest.mark.fast
@pytest.mark.parametrize("share", ["2", "-0.1", "nan"])
def test_max_bad_rows_outside_0_1_is_one_line_before_anything_runs(tmp_path, capsys, share):
    from preproc.cli import main
    table(4).to_csv(tmp_path / "t.csv", index=False)
    (tmp_path / "cfg.yaml").write_text("label: y\ncategorical: [c]\n")
    code = main(["tabular", "run", "--input", str(tmp_path / "t.csv"), "--config", str(tmp_path / "cfg.yaml"),
                 "--output", str(tmp_path / "out"), "--max-bad-rows", share])
    assert code == 2 and capsys.readouterr().err == (f"preproc: error: --max-bad-rows: a share of the rows in "
                                                     f"[0, 1], got {float(share):g}\n")
    assert not (tmp_path / "out").exists()


# --- item 6: bad-row messages name the column, the reason and the first rows ----------------------
@pytest.mark.fast
def test_bad_row_details_name_column_reason_and_first_rows():
    config = parse_config({"label": "y", "categorical": ["c"], "numerical": ["x"]})
    frame = table(20).astype(str)
    frame.loc[5, "x"], frame.loc[9, "x"], frame.loc[12, "x"], frame.loc[7, "y"] = "inf", "abc", "-inf", ""
    out = read.parse_piece(frame, 0, 0, config)
    details = read.describe_bad_rows(read.first_bad_rows(out), out["_why"].value_counts(), config, {0: 0},
                                     ["data/t.csv"])
    assert details == ("numerical 'x': infinite: 2 row(s) (t.csv row 5, t.csv row 12); label 'y': missing: "
                       "1 row(s) (t.csv row 7); numerical 'x': not a number: 1 row(s) (t.csv row 9)")


# --- item 4: nested parquet columns, pure pyarrow -------------------------------------------------
@pytest.mark.fast
@pytest.mark.parametrize("value, role, hint", [([1, 2], "categorical", "a list of ids per row goes under `multihot`"),
                                               ({"a": 1}, "categorical", "flatten it into plain columns"),
                                               ([1.5], "numerical", "flatten it into plain columns")])
def test_a_nested_parquet_column_outside_multihot_is_refused(tmp_path, value, role, hint):
    frame = table(10)
    frame["n"] = [value] * len(frame)
    frame.to_parquet(tmp_path / "t.parquet")
    config = parse_config({"label": "y", "categorical": ["c"], role: ["n"]} if role == "numerical" else
                          {"label": "y", "categorical": ["c", "n"]})
    with pytest.raises(PreprocError) as err:
        read.check_columns([tmp_path / "t.parquet"], "parquet", config)
    typ = pq.read_schema(tmp_path / "t.parquet").field("n").type
    assert str(err.value) == (f"{tmp_path / 't.parquet'}: column 'n' is {typ}, a nested type: a {role} column "
                              f"holds one value per row ({hint})")


# --- items 5 and 6: the config, pure --------------------------------------------------------------
@pytest.mark.fast
def test_models_default_to_those_that_read_the_table_and_say_what_each_needs():
    assert parse_config({"label": "y", "categorical": ["c"]}).models == ("wide_deep",)
    # numericals alone: Wide & Deep reads them (its deep MLP), DLRM is not blamed unless named
    assert parse_config({"label": "y", "numerical": ["a", "b"]}, "p.yaml").models == ("wide_deep",)
    with pytest.raises(PreprocError, match=r"^p\.yaml: models: dlrm needs numerical and categorical columns$"):
        parse_config({"label": "y", "numerical": ["a", "b"], "models": ["dlrm"]}, "p.yaml")
    with pytest.raises(PreprocError, match=r"^p\.yaml: models: dlrm needs numerical and categorical columns$"):
        parse_config({"label": "y", "categorical": ["c"], "models": ["dlrm"]}, "p.yaml")


@pytest.mark.fast
def test_unquoted_numeric_column_names_mention_yaml_quoting():
    raw = yaml.safe_load("label: y\ncategorical: [1, 2]\n")
    with pytest.raises(PreprocError) as err:
        parse_config(raw, "n.yaml")
    assert str(err.value) == ("n.yaml: categorical[0]: must be a column name or a mapping with `column` "
                              "(YAML reads 1 as a number: quote a numeric column name, '1')")


# --- the pipeline, in process ---------------------------------------------------------------------
@pytest.fixture()
def cli(tmp_path, capsys):
    """``cli(frame, config, *flags)`` -> (exit code, stderr, report) of `preproc tabular run`."""
    pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
    from preproc.cli import main

    def call(frame, config, *flags, name="t.csv"):
        frame.to_csv(tmp_path / name, index=False)
        (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(config))
        out = tmp_path / "out"
        code = main(["tabular", "run", "--input", str(tmp_path / name), "--config", str(tmp_path / "cfg.yaml"),
                     "--output", str(out), "--overwrite", *flags])
        captured = capsys.readouterr()
        return code, captured.err, json.loads(captured.out.splitlines()[-1]) if code == 0 else None
    return call


def test_run_refuses_minus_1_1_labels_and_trains_them_with_positive(cli, tmp_path):
    """Was: 89 of 200 rows skipped with one WARNING, a dataset of one class, exit 0."""
    frame = table(labels=(-1, 1))
    code, err, _ = cli(frame, {"label": "y", "categorical": ["c"], "numerical": ["x"]})
    assert code == 2 and "label column 'y' must hold the two classes 0 and 1" in err
    assert not (tmp_path / "out").exists()
    code, err, report = cli(frame, {"label": {"column": "y", "positive": [1]}, "categorical": ["c"]})
    assert code == 0, err
    spec = yaml.safe_load((tmp_path / "out" / "feature_spec.yaml").read_text())
    assert report["bad_rows"] == 0 and 0.3 < spec["metadata"]["label_rate"]["train"] < 0.7


def test_run_refuses_a_split_of_one_class(cli, tmp_path):
    code, err, _ = cli(table(), {"label": {"column": "y", "positive": [7]}, "categorical": ["c"]})
    assert code == 2 and err.startswith("preproc: error: train: all ") and "rows have label 0: a split needs both "\
        "classes (check `label` in" in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_run_fails_above_max_bad_rows_with_the_column_and_rows(cli, tmp_path, caplog):
    frame = table().astype({"x": object})
    frame.loc[[10, 20, 30, 40, 50], "x"] = "inf"                   # 5 of 300 rows: 1.7 %
    config = {"label": "y", "categorical": ["c"], "numerical": ["x"]}
    code, err, _ = cli(frame, config)
    assert code == 2 and err == ("preproc: error: tabular: 5 of 300 rows bad (1.7%), more than --max-bad-rows 0.01 "
                                 "of the rows that --bad-rows skip may drop (numerical 'x': infinite: 5 row(s) "
                                 "(t.csv row 10, t.csv row 20, t.csv row 30, ...)); fix the input, or raise "
                                 "--max-bad-rows\n")
    with caplog.at_level(logging.WARNING, logger="preproc.bad_rows"):
        code, err, report = cli(frame, config, "--max-bad-rows", "0.02")
    assert code == 0 and report["bad_rows"] == 5
    assert "bad rows: numerical 'x': infinite: 5 row(s) (t.csv row 10" in caplog.text


def test_one_row_table_and_no_import_noise(tmp_path):
    """A real `python -m preproc` run: its stderr is the one error line (no merlin warnings, no
    TensorFlow INFO lines), which does not ask to lower --num-files when it is already 1."""
    pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
    table(1).to_csv(tmp_path / "one.csv", index=False)
    (tmp_path / "cfg.yaml").write_text("label: y\ncategorical: [c]\n")
    proc = subprocess.run([sys.executable, "-m", "preproc", "tabular", "run", "--input", str(tmp_path / "one.csv"),
                           "--config", str(tmp_path / "cfg.yaml"), "--output", str(tmp_path / "out")],
                          cwd=REPO, text=True, capture_output=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if " INFO " not in line]
    assert proc.returncode == 2 and lines == [
        f"preproc: error: test: no test rows (1 usable rows in all): a dataset needs training and test rows: use "
        f"a larger table or another split.test_fraction in {tmp_path / 'cfg.yaml'}"], proc.stderr
