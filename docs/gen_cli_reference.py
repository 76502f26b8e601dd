"""Write docs/reference/{recsys-submit,recsys-train,recsys-preproc}.md from the three CLIs' own
argparse parsers (jobs.clidoc renders them), so the reference cannot drift from the commands.

    .venv/bin/python docs/gen_cli_reference.py            # rewrite the pages
    .venv/bin/python docs/gen_cli_reference.py --check    # exit 1 naming the pages that differ

Lives outside the packages: it imports each program's parser (jobs.cli, recsys.train,
preproc.cli), which no package may do for another (setup.cfg's import-linter contracts).
tests/docs/test_cli_reference.py regenerates the pages in memory and compares.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Dict, Iterator

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:           # run as a script from anywhere: the tree's own packages
    sys.path.insert(0, str(REPO))

from jobs import clidoc  # noqa: E402

OUT = REPO / "docs" / "reference"
COMMAND = ".venv/bin/python docs/gen_cli_reference.py"
# Defaults a parser reads from the environment (recsys-submit --profile: $RECSYS_PROFILE): the
# pages show the ones of an empty environment, whoever generates them.
ENVIRONMENT = ("RECSYS_PROFILE",)


@contextlib.contextmanager
def _plain_environment() -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in ENVIRONMENT if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def submit_page() -> str:
    from jobs.cli import PROG, build_parser

    return clidoc.page(build_parser(), PROG, COMMAND)


def train_page() -> str:
    from recsys.train import PROG, build_parser

    return clidoc.page(build_parser(), PROG, COMMAND)


def preproc_page() -> str:
    """recsys-preproc (= python -m preproc): its dataset list, then each dataset's parser and stages."""
    from preproc import cli

    parsers = {name: cli.build_parser(name) for name in sorted(cli.DATASETS)}
    found = []
    for name, parser in parsers.items():
        found.append((parser.prog, parser, parser.description))
        found += clidoc.commands(parser, parser.prog)
    lines = clidoc.header("recsys-preproc", COMMAND)
    lines += ["", "`recsys-preproc` and `python -m preproc` are the same program: a dataset, then one of its "
              "stages. With no arguments or `--help` it prints:", "", "```text", cli.usage(), "```",
              "", "## Commands"]
    lines += clidoc.contents((name, text) for name, _, text in found)
    for name, parser, text in found:
        lines += clidoc.command_section(parser, name, text)
    return "\n".join(lines).strip() + "\n"


def pages() -> Dict[str, str]:
    """{file name under docs/reference: its text}, as the CLIs are now."""
    with _plain_environment():
        return {"recsys-submit.md": submit_page(), "recsys-train.md": train_page(),
                "recsys-preproc.md": preproc_page()}


def stale(out: Path = OUT) -> Dict[str, str]:
    """{file name: why} of the pages whose committed text is not what the CLIs generate."""
    why = {}
    for name, text in pages().items():
        path = out / name
        if not path.is_file():
            why[name] = "missing"
        elif path.read_text(encoding="utf-8") != text:
            why[name] = "differs from the CLI"
    return why


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Write the CLI reference pages (docs/reference/).")
    parser.add_argument("--out", type=Path, default=OUT, help="directory of the pages (default docs/reference)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")
    args = parser.parse_args(argv)
    if args.check:
        bad = stale(args.out)
        for name, why in sorted(bad.items()):
            print(f"{args.out / name}: {why}; regenerate with `{COMMAND}`", file=sys.stderr)
        return 1 if bad else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        tmp = args.out / f".{name}.tmp"
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, args.out / name)        # never a half-written page
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
