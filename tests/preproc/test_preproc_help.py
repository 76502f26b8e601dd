"""`python -m preproc --help` lists every dataset with its stages; each stage's help describes
every flag and ends with an example (issue 15 item 9). No Spark is started."""
from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from preproc.cli import DATASETS, build_parser, stage_list

pytestmark = pytest.mark.fast


def _preproc(*args):
    return subprocess.run([sys.executable, "-m", "preproc", *args], capture_output=True, text=True, timeout=60)


def test_top_level_help_lists_datasets_and_stages():
    res = _preproc("--help")
    assert res.returncode == 0, res.stderr
    for dataset in DATASETS:
        assert f"\n  {dataset} " in res.stdout
        for stage, text in stage_list(dataset):
            assert text, f"{dataset} {stage} has no one-line description"
            assert f"    {stage:<12} {text}" in res.stdout
    assert "    dictionary   build the per-column dictionaries" in res.stdout


@pytest.mark.parametrize("dataset", sorted(DATASETS))
def test_every_stage_help_has_a_description_flag_help_and_an_example(dataset):
    parser = build_parser(dataset)
    stages = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, stage in stages.choices.items():
        text = stage.format_help()
        assert stage.description, f"{dataset} {name}: no description"
        assert f"example:\n  python -m preproc {dataset} {name} " in text, f"{dataset} {name}: no example"
        undocumented = [a.option_strings for a in stage._actions if not a.help]
        assert not undocumented, f"{dataset} {name}: flags without help {undocumented}"
    res = _preproc(dataset, "run", "--help")
    assert res.returncode == 0 and "example:" in res.stdout
