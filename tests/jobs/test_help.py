"""Issue 15 item 9: every subcommand's help shows only its own flags, each with a description,
and examples; the run argument of status/logs/cancel/requeue is explained."""

import argparse
import subprocess
import sys

import pytest

from jobs.cli import build_parser

from submit_helpers import REPO

pytestmark = pytest.mark.fast


def _subparsers(parser, path=()):
    """(command path, parser) of every (sub)command."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subparsers(sub, path + (name,))


ALL = dict(_subparsers(build_parser()))


def _flags(path):
    return {o for a in ALL[path]._actions for o in a.option_strings}


@pytest.mark.parametrize("path", sorted(ALL), ids=lambda p: " ".join(p) or "recsys-submit")
def test_every_argument_has_a_description(path):
    for action in ALL[path]._actions:
        if not isinstance(action, argparse._SubParsersAction):
            assert action.help and action.help != argparse.SUPPRESS, (path, action.option_strings or action.dest)


@pytest.mark.parametrize("path", [p for p in sorted(ALL) if not any(isinstance(a, argparse._SubParsersAction)
                                                                    for a in ALL[p]._actions)],
                         ids=lambda p: " ".join(p))
def test_every_command_has_an_example(path):
    epilog = ALL[path].epilog or ALL[path[:-1]].epilog or ""
    assert "examples:" in epilog and "recsys-submit " in epilog, path


def test_each_job_command_shows_only_its_own_flags():
    chain = {"--preprocess-from", "--then-evaluate", "--shards"}
    assert chain <= _flags(("train",))
    for kind in ("evaluate", "benchmark", "preprocess"):
        assert not {"--preprocess-from", "--then-evaluate"} & _flags((kind,)), kind
    assert not {"--input", "--output", "--dataset", "--mode"} & _flags(("evaluate",))
    assert not {"--array", "--payload", "--data-path"} & _flags(("preprocess",))
    assert {"--input", "--output", "--mode", "--dataset"} <= _flags(("preprocess",))
    assert _flags(("render", "train")) == _flags(("train",)) - {"--dry-run", "--no-wait", "--keep-partial"} \
        | {"-o", "--out-dir"}


def test_help_text_reads_right():
    text = subprocess.run([sys.executable, "-m", "jobs.cli", "--help"], cwd=REPO, text=True,
                          capture_output=True, timeout=60, check=True).stdout
    assert "submit an evaluate job" in text and "submit a evaluate" not in text
    for name in ("logs", "cancel", "requeue", "status"):
        run = next(a for a in ALL[(name,)]._actions if a.dest == "run")
        assert "run directory" in run.help and "newest" in run.help
    pre = ALL[("preprocess",)].format_help()
    assert "--mode {single,array,multinode}" in pre and "python -m preproc" in pre
    assert "--run-mode" in ALL[("train",)].format_help()      # the engine's mode, named in the epilog
