"""The CLI reference (docs/reference/*.md) is what the CLIs' parsers generate now
(docs/gen_cli_reference.py, jobs.clidoc), names every command and flag, and does not depend on
the terminal or the environment of whoever generated it."""
from __future__ import annotations

import argparse
import difflib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jobs import clidoc
from jobs.completion import walk

pytestmark = pytest.mark.fast
REPO = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_cli_reference", REPO / "docs" / "gen_cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()
PAGES = GEN.pages()


def test_committed_pages_are_what_the_clis_generate():
    for name, text in PAGES.items():
        path = REPO / "docs" / "reference" / name
        committed = path.read_text(encoding="utf-8") if path.is_file() else ""
        diff = "".join(list(difflib.unified_diff(committed.splitlines(True), text.splitlines(True),
                                                 f"{path} (committed)", "generated", n=1))[:40])
        assert committed == text, f"{path} is stale: regenerate with `{GEN.COMMAND}` and commit it\n{diff}"


def _flags_and_commands(parser, prog, page):
    for path, node, _ in walk(parser):
        if path:
            assert f"\n## {' '.join((prog, *path))}\n" in page, (prog, path)
        for action in node._actions:
            if action.help != argparse.SUPPRESS and not isinstance(action, argparse._HelpAction):
                for flag in action.option_strings:
                    assert f"`{flag}" in page or f", {flag}" in page, (prog, path, flag)


def test_every_command_and_flag_of_each_program_appears():
    from jobs.cli import build_parser as submit_parser
    from preproc import cli as preproc_cli
    from recsys.train import build_parser as train_parser

    _flags_and_commands(submit_parser(), "recsys-submit", PAGES["recsys-submit.md"])
    _flags_and_commands(train_parser(), "recsys-train", PAGES["recsys-train.md"])
    assert "--mode " not in PAGES["recsys-train.md"]        # the hidden deprecated alias stays hidden
    for dataset in preproc_cli.DATASETS:
        parser = preproc_cli.build_parser(dataset)
        assert f"\n## {parser.prog}\n" in PAGES["recsys-preproc.md"]
        _flags_and_commands(parser, parser.prog, PAGES["recsys-preproc.md"])
    # every link of a contents table or command list has its heading
    for name, page in PAGES.items():
        headings = {clidoc.anchor(line[3:]) for line in page.splitlines() if line.startswith("## ")}
        links = set(re.findall(r"\]\(#([^)]+)\)", page))
        assert links <= headings and (links or name == "recsys-train.md"), (name, links - headings)


def test_pages_ignore_the_terminal_and_the_environment(monkeypatch):
    monkeypatch.setenv("COLUMNS", "37")
    monkeypatch.setenv("RECSYS_PROFILE", "ci")
    assert GEN.pages() == PAGES
    assert "| `--profile PROFILE` | `local` |" in PAGES["recsys-submit.md"]


def test_check_names_a_stale_page_and_the_command(tmp_path, capsys):
    for name, text in PAGES.items():
        (tmp_path / name).write_text(text)
    assert GEN.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "recsys-train.md").write_text("old\n")
    (tmp_path / "recsys-preproc.md").unlink()
    assert GEN.main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [f"{tmp_path / 'recsys-preproc.md'}: missing; regenerate with `{GEN.COMMAND}`",
                   f"{tmp_path / 'recsys-train.md'}: differs from the CLI; regenerate with `{GEN.COMMAND}`"]
    assert GEN.main(["--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.iterdir()} == set(PAGES)       # no temporary file left
    assert (tmp_path / "recsys-train.md").read_text() == PAGES["recsys-train.md"]


def test_argument_rows_and_prose():
    parser = argparse.ArgumentParser(prog="tool", epilog="examples:\n  tool a\n    --b\n\nA <note> | `x<y>`.")
    parser.add_argument("files", nargs="*", help="inputs")
    parser.add_argument("--kind", choices=("a", "b"), metavar="K", default="a", help="the kind, 100%% of it")
    parser.add_argument("--out", required=True, help="where")
    parser.add_argument("-f", "--follow", action="store_true", help="keep going")
    text = "\n".join(clidoc.command_section(parser, "tool"))
    assert "| `files ...` |" not in text and "| `[files ...]` |  | inputs |" in text
    assert "| `--kind K` | `a` | the kind, 100% of it (choices: `a`, `b`) |" in text
    assert "| `--out OUT` | *required* | where |" in text
    assert "| `-f, --follow` |  | keep going |" in text
    assert "Examples:\n\n```text\ntool a\n  --b\n```" in text
    assert "A &lt;note> \\| `x<y>`." in text
    assert "*arguments*" in text and "*options*" in text and "positional" not in text
    assert clidoc.anchor("python -m preproc criteo run") == "python--m-preproc-criteo-run"


def test_the_cli_does_not_import_the_generator():
    code = "import sys, jobs.cli; sys.exit('jobs.clidoc' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
