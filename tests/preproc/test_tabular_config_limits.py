"""Hostile tabular configs (issue 33): a YAML bomb in any key, a value too nested or huge to
print, and a column name that would become a path are one quick line naming the file and key,
before any data is read (`python -m preproc tabular run`: exit 2, no output)."""

import os
import subprocess
import sys

import pytest
import yaml

from preproc.errors import PreprocError
from preproc.tabular.config import KEYS, load_config, parse_config
from slurm.common.yamlfile import MAX_NODES
from tests.hostile_yaml import bomb_text, bomb_value, quick_error

pytestmark = [pytest.mark.fast, pytest.mark.timeout(120)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASE = {"label": "y", "categorical": ["c"], "numerical": ["x"]}


def quick(call):
    return quick_error(call, PreprocError)


@pytest.mark.parametrize("key", KEYS)
def test_a_yaml_bomb_in_any_key_is_one_quick_line(tmp_path, key):
    """threshold, models and format hung for ever (their value printed with !r)."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(dict(BASE, **{key: "BOMB"})).replace("BOMB", bomb_text()))
    message = quick(lambda: load_config(str(path)))
    assert message.startswith(f"--config: {path}: line ") and f"more than {MAX_NODES} nodes" in message


NESTED = [  # (key the error names, config with the in-memory bomb there)
    ("threshold", dict(BASE, threshold=bomb_value())),
    ("models", dict(BASE, models=bomb_value())),
    ("format", dict(BASE, format=bomb_value())),
    ("split.method", dict(BASE, split={"method": bomb_value()})),
    ("split.test_fraction", dict(BASE, split={"test_fraction": bomb_value()})),
    ("split.seed", dict(BASE, split={"seed": bomb_value()})),
    ("csv.separator", dict(BASE, csv={"separator": bomb_value()})),
    ("numerical[0].transform", dict(BASE, numerical=[{"column": "x", "transform": bomb_value()}])),
    ("categorical[0].threshold", dict(BASE, categorical=[{"column": "c", "threshold": bomb_value()}])),
    ("multihot[0].max_hotness", dict(BASE, multihot=[{"column": "m", "max_hotness": bomb_value()}])),
    ("ncf.user", dict(BASE, ncf={"user": bomb_value(), "item": "c"})),
    ("map", dict(BASE, map=bomb_value())),
    ("label", dict(BASE, label=bomb_value())),
]


@pytest.mark.parametrize("key, raw", NESTED, ids=[k for k, _ in NESTED])
def test_a_value_is_never_printed_whole(key, raw):
    assert quick(lambda: parse_config(raw, "my.yaml")).startswith(f"my.yaml: {key}: ")


@pytest.mark.parametrize("config, key", [
    ({"label": "y", "categorical": ["a/b"], "numerical": ["x"]}, "categorical[0]"),
    ({"label": "y", "categorical": [{"column": "../up", "threshold": 2}]}, "categorical[0].column"),
    ({"label": "y/z", "categorical": ["c"]}, "label"),
    ({"label": {"column": "y\nz"}, "categorical": ["c"]}, "label.column"),
    ({"label": "y", "numerical": ["x\x1b[2J"]}, "numerical[0]"),
    ({"label": "y", "categorical": ["c"], "map": "/etc"}, "map"),
])
def test_a_column_name_that_would_be_a_path_is_refused(config, key):
    message = quick(lambda: parse_config(config, "my.yaml"))
    assert message.startswith(f"my.yaml: {key}: column ") and "has a '/' or a control character" in message


def test_a_slash_in_a_column_is_one_line_from_the_cli_and_writes_nothing(tmp_path):
    """It reached NVTabular's categories/unique.<column>.parquet: a 93-line traceback."""
    (tmp_path / "rows.csv").write_text("y,a/b,x\n1,u,0.5\n0,v,1.5\n1,u,2.0\n0,w,0.1\n")
    (tmp_path / "cfg.yaml").write_text("label: y\ncategorical: [a/b]\nnumerical: [x]\n")
    proc = subprocess.run([sys.executable, "-m", "preproc", "tabular", "run", "--input", str(tmp_path / "rows.csv"),
                           "--config", str(tmp_path / "cfg.yaml"), "--output", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        f"preproc: error: {tmp_path / 'cfg.yaml'}: categorical[0]: column 'a/b' has a '/' or a control "
        "character (column names become file names; rename the column)"]
    assert sorted(os.listdir(tmp_path)) == ["cfg.yaml", "rows.csv"]


def test_a_config_that_is_a_device_or_a_fifo_is_one_quick_line(tmp_path):
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    assert quick(lambda: load_config(str(fifo))) == f"--config: {fifo}: file: not a regular file (a FIFO)"
    assert quick(lambda: load_config("/dev/zero")) == \
        "--config: /dev/zero: file: not a regular file (a character device)"
