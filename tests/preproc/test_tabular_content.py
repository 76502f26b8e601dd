"""Issue 45 section 2, bad data: `preproc tabular run` refuses, in one line and before anything is
fitted, a column with no value (a 157-line NVTabular traceback for a categorical; NaN statistics and
exit 0 for a numerical), a numerical column with one value, a continuous label (the old message
offered a `positive` mapping that matched 2 rows), a header naming a column twice (one of them read
silently); it warns about a constant numerical column and an id-like categorical (accepted silently);
a header cut at the wrong separator and decimal commas say what to change.

Pure checks are ``fast``; the pipeline runs in process on 200-row tables (about a second each after
NVTabular's import) through the same `preproc.cli.main` the command uses."""
from __future__ import annotations

import gzip
import json
import logging

import numpy as np
import pandas as pd
import pytest
import yaml

from preproc.errors import PreprocError
from preproc.tabular import content, read
from preproc.tabular.config import parse_config

ROWS = 200


def table(rows: int = ROWS, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"y": rng.integers(0, 2, rows), "c": rng.choice(list("abcd"), rows),
                         "x": rng.normal(size=rows).round(3)})


# --- pure ------------------------------------------------------------------------------------------
@pytest.mark.fast
@pytest.mark.parametrize("opener", [open, gzip.open])
def test_a_header_naming_a_column_twice_is_one_line(tmp_path, opener):
    path = tmp_path / ("t.csv.gz" if opener is gzip.open else "t.csv")
    with opener(path, "wt") as f:
        f.write("y,c,x,c\n1,a,0.5,b\n")
    assert read.header_names(path, ",") == ["y", "c", "x", "c"]
    with pytest.raises(PreprocError) as err:
        read.file_columns(path, "csv", ",")
    assert str(err.value) == f"{path}: the header names column 'c' twice (columns 2 and 4): rename one"


@pytest.mark.fast
@pytest.mark.parametrize("sep, hint", [(";", "';': set `csv: {separator: ';'}`"),
                                       ("\t", 'tab: set `csv: {separator: "\\t"}`')])
def test_a_header_cut_at_the_wrong_separator_names_the_csv_key(tmp_path, sep, hint):
    path = tmp_path / "t.csv"
    table(5).to_csv(path, index=False, sep=sep)
    config = parse_config({"label": "y", "categorical": ["c"]}, "my.yaml")
    with pytest.raises(PreprocError) as err:
        read.check_columns([path], "csv", config)
    assert str(err.value).endswith(f"; the header looks separated by {hint} in my.yaml"), err.value
    # the suggested key, pasted as printed, reads the file
    key = yaml.safe_load("{" + hint.split("`csv: {")[1].split("}`")[0] + "}")
    fixed = parse_config({"label": "y", "categorical": ["c"], "csv": key}, "my.yaml")
    read.check_columns([path], "csv", fixed)


@pytest.mark.fast
def test_a_decimal_comma_is_a_bad_row_reason_of_its_own():
    config = parse_config({"label": "y", "categorical": ["c"], "numerical": ["x"]}, "my.yaml")
    frame = table(4).astype(str)
    frame["x"] = ["3,5", "-0,25", "abc", "1.5"]
    out = read.parse_piece(frame, 0, 0, config)
    reasons = [read.bad_reasons(config)[w - 1] if w else None for w in out["_why"]]
    assert reasons == ["numerical 'x': a decimal comma (3,5: write 3.5, or convert the file)"] * 2 + [
        "numerical 'x': not a number", None]


@pytest.mark.fast
def test_a_continuous_label_says_it_is_a_value_not_two_classes():
    config = parse_config({"label": "y", "categorical": ["c"]}, "my.yaml")
    frame = table()
    frame["y"] = np.linspace(-2, 3, ROWS).round(3)
    out = read.parse_piece(frame.astype(str), 0, 0, config)
    with pytest.raises(PreprocError) as err:
        read.check_labels(out["_label_kind"].value_counts(), out["_label_other"].dropna().value_counts(), config)
    assert str(err.value) == ("my.yaml: label column 'y' holds 200 distinct numbers from -2 to 3, a continuous "
                              "value: the models here are binary classifiers; add a 0/1 column to the table (e.g. 1 "
                              "where y >= a threshold of your choice) and name it as `label`")


@pytest.mark.fast
def test_content_check_refuses_empty_columns_and_warns_about_constants_and_ids():
    config = parse_config({"label": "y", "categorical": ["c"], "numerical": ["x"]}, "my.yaml")
    ok = {"c": {"kind": "categorical", "count": 200, "distinct": 4},
          "x": {"kind": "numerical", "count": 200, "min": -1.0, "max": 2.0}}
    assert content.check(ok, 200, config) == []
    with pytest.raises(PreprocError, match=r"^my\.yaml: categorical column 'c' has no value in any of the 200 "
                                           r"usable rows \(every one missing\): remove it from `categorical`$"):
        content.check({**ok, "c": {"kind": "categorical", "count": 0, "distinct": 0}}, 200, config)
    with pytest.raises(PreprocError, match=r"^my\.yaml: numerical column 'x' has a value in 1 of 200 usable rows"):
        content.check({**ok, "x": {"kind": "numerical", "count": 1, "min": 3.0, "max": 3.0}}, 200, config)
    warned = content.check({"c": {"kind": "categorical", "count": 200, "distinct": 195},
                            "x": {"kind": "numerical", "count": 150, "min": 5.0, "max": 5.0}}, 200, config)
    assert warned[0].startswith("categorical column 'c' has about 195 distinct values in 200 rows, about one per row")
    assert warned[1].startswith("numerical column 'x' is constant (5 in all 150 rows with a value)")
    # a small table's distinct values are not an id's
    assert content.check({**ok, "c": {"kind": "categorical", "count": 20, "distinct": 20}}, 20, config) == []


# --- the pipeline, in process ----------------------------------------------------------------------
@pytest.fixture()
def cli(tmp_path, capsys):
    """``cli(frame, config)`` -> (exit code, stderr, printed summary) of `preproc tabular run`."""
    pytest.importorskip("nvtabular", reason="NVTabular is not installed (pip install .[nvtabular])")
    from preproc.cli import main

    def call(frame, config):
        frame.to_csv(tmp_path / "t.csv", index=False)
        (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(config))
        code = main(["tabular", "run", "--input", str(tmp_path / "t.csv"), "--config", str(tmp_path / "cfg.yaml"),
                     "--output", str(tmp_path / "out"), "--overwrite"])
        captured = capsys.readouterr()
        return code, captured.err, json.loads(captured.out.splitlines()[-1]) if code == 0 else None
    return call


@pytest.mark.parametrize("column, values, role", [
    ("c2", [""] * ROWS, "categorical"),                      # was: a 157-line NVTabular traceback
    ("x2", [""] * ROWS, "numerical"),                        # was: exit 0, every value 0, NaN statistics
    ("x2", [""] * (ROWS - 1) + ["3.0"], "numerical")])        # was: the same
def test_a_column_without_values_is_refused_before_fitting(cli, tmp_path, column, values, role):
    frame = table().assign(**{column: values})
    config = {"label": "y", "categorical": ["c"] + (["c2"] if role == "categorical" else []),
              "numerical": ["x"] + (["x2"] if role == "numerical" else [])}
    code, err, _ = cli(frame, config)
    assert code == 2 and err.count("\n") == 1 and err.startswith(
        f"preproc: error: {tmp_path / 'cfg.yaml'}: {role} column {column!r} has ") and f"remove it from `{role}`" in err
    assert not (tmp_path / "out").exists()


def test_constant_and_id_like_columns_train_with_warnings_in_the_report(cli, tmp_path, caplog):
    frame = table().assign(x2=5.0, rowid=[f"id{i}" for i in range(ROWS)])
    config = {"label": "y", "categorical": ["c", "rowid"], "numerical": ["x", "x2"]}
    with caplog.at_level(logging.WARNING, logger="preproc.tabular"):
        code, err, summary = cli(frame, config)
    assert code == 0, err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert summary["warnings"] == report["warnings"] and len(report["warnings"]) == 2
    assert report["warnings"][0].startswith("categorical column 'rowid' has about ")
    assert report["warnings"][1].startswith("numerical column 'x2' is constant (5 in all 200 rows")
    assert "tabular: numerical column 'x2' is constant" in caplog.text


def test_semicolon_file_with_decimal_commas_says_what_to_change(cli, tmp_path, capsys):
    frame = table().assign(x=lambda f: f["x"].map(lambda v: str(v).replace(".", ",")))
    frame.to_csv(tmp_path / "t.csv", index=False, sep=";")
    from preproc.cli import main
    (tmp_path / "cfg.yaml").write_text("label: y\ncategorical: [c]\nnumerical: [x]\ncsv: {separator: ';'}\n")
    code = main(["tabular", "run", "--input", str(tmp_path / "t.csv"), "--config", str(tmp_path / "cfg.yaml"),
                 "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "out").exists()
    assert "(numerical 'x': a decimal comma (3,5: write 3.5, or convert the file): 200 row(s) (t.csv row 0" in err


@pytest.mark.fast
def test_a_config_with_three_mistakes_reports_all_three(tmp_path, capsys):
    """Issue 44 item 3: the tabular config is checked as study specs are (slurm.common.checker.Problems):
    every mistake, a line each, an unknown key with "did you mean" (it stopped at the first)."""
    from preproc.cli import main

    (tmp_path / "cfg.yaml").write_text("label: y\ncategorical: [c]\nnumerical: [{column: x, transform: sqrt}]\n"
                                       "split: {test_fraction: 1.5}\nmissing_value: [NA]\n")
    with pytest.raises(PreprocError) as err:
        parse_config(yaml.safe_load((tmp_path / "cfg.yaml").read_text()), "cfg.yaml")
    assert err.value.problems == [
        "cfg.yaml: missing_value: unknown key (did you mean 'missing_values'? known: "
        + ", ".join(__import__("preproc.tabular.config", fromlist=["KEYS"]).KEYS) + ")",
        "cfg.yaml: numerical[0].transform: 'sqrt' is not one of standard, log, none",
        "cfg.yaml: split.test_fraction: must be a number in (0, 1), got 1.5"]
    table(5).to_csv(tmp_path / "t.csv", index=False)
    assert main(["tabular", "run", "--input", str(tmp_path / "t.csv"), "--config", str(tmp_path / "cfg.yaml"),
                 "--output", str(tmp_path / "out"), "--dry-run"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all(line.startswith(f"preproc: error: {tmp_path / 'cfg.yaml'}: ") for line in lines)
