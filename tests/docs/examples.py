"""The shell examples of README.md and docs/*.md, as the docs test runs them.

Every fenced ```bash block is an example. The line right before its fence may hold a
directive (docs/testing.md, "Executable documentation"):

``<!-- docs-test: skip: <reason> -->``
    not run (GPUs, pyxis, real datasets, installs, multi-minute benchmarks).
``<!-- docs-test: dry-run -->``
    run with every command that would submit or compute made a dry run
    (:func:`dry_run_line`).
``<!-- docs-test: setup-done -->``
    run without its set-up steps: the ``&&``-joined parts that create ``.venv`` or
    ``pip install`` are dropped (the tree under test is installed already).

A line of its own (not before a fence) ``<!-- docs-test: twin NAME... -->`` makes every later
block of the file run with the built-in container profiles NAME resolved to their test twins
(tests/docs/twins.py): same container paths, the test cluster's nodes, pyxis stood in.

Pure functions only: the test module runs the blocks.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(skip|dry-run|setup-done)\s*(?::\s*(.*?))?\s*-->\s*$")
FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
TWIN = re.compile(r"^\s*<!--\s*docs-test:\s*twin\s+([\w.-]+(?:\s+[\w.-]+)*)\s*-->\s*$")
# Job commands of recsys-submit and the preprocessing stages take --dry-run.
DRY_RUN_COMMAND = re.compile(r"^(\S*recsys-submit\s+(train|evaluate|benchmark|preprocess)\b"
                             r"|(\S*python3?\s+-m\s+preproc|\S*recsys-preproc)\s+\S+\s+(run|dictionary|transform)\b)")
# Commands that act on a submitted run: in a dry-run block there is none.
RUN_COMMAND = re.compile(r"^\S*recsys-submit\s+(status|logs|cancel|requeue)\b")
PYTEST_COMMAND = re.compile(r"^\S*(pytest|python3?\s+-m\s+pytest)\b")
SETUP_PART = re.compile(r"^\s*(\S*python3?\s+-m\s+venv\b|\S*pip3?\s+install\b)")


@dataclass
class Block:
    path: Path          # the markdown file
    line: int           # 1-based line of the opening fence
    text: str           # the block's lines, indentation removed
    mode: str = "run"   # run | skip | dry-run | setup-done
    reason: str = ""    # why skipped
    twins: tuple = ()   # built-in profiles resolved to test twins (a `twin` line above)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def extract(path: Path, text: Optional[str] = None) -> List[Block]:
    """The ```bash blocks of one markdown file, in order, with their directives."""
    lines = (path.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: List[Block] = []
    twins: tuple = ()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            t = TWIN.match(lines[i])
            if t:
                twins = tuple(dict.fromkeys(twins + tuple(t.group(1).split())))
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        body, j = [], i + 1
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if lang == "bash":
            block = Block(path, i + 1, "\n".join(body) + "\n", twins=twins)
            d = DIRECTIVE.match(lines[i - 1]) if i > 0 else None
            if d:
                block.mode = d.group(1)
                block.reason = d.group(2) or ""
                if block.mode == "skip" and not block.reason:
                    raise ValueError(f"{block.where}: `docs-test: skip` needs a reason")
            blocks.append(block)
        i = j + 1
    return blocks


def _logical_lines(text: str) -> List[str]:
    """Lines with backslash continuations joined; comments and blank lines kept as they are."""
    out, current = [], ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        out.append(current + line)
        current = ""
    if current:
        out.append(current)
    return out


def _split_comment(line: str):
    """(command, ' # comment') of a line; a '#' inside quotes is not a comment."""
    quote = None
    for k, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k].rstrip(), " " + line[k:]
    return line.rstrip(), ""


def _split_commands(command: str) -> List[str]:
    """Split on ' ; ' and ' && ' outside quotes, keeping the separators as items."""
    parts, quote, start, k = [], None, 0, 0
    while k < len(command):
        ch = command[k]
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        else:
            for sep in ("&&", ";"):
                if command.startswith(sep, k):
                    parts += [command[start:k], sep]
                    start = k + len(sep)
                    k += len(sep) - 1
                    break
        k += 1
    parts.append(command[start:])
    return parts


def dry_run_line(command: str) -> Optional[str]:
    """One simple command as a dry-run block runs it, or None when it is not run:

    * ``recsys-submit train|evaluate|benchmark|preprocess`` and the Spark stages of
      ``python -m preproc`` (``run``, ``dictionary``, ``transform``):
      ``--dry-run`` inserted before the engine arguments (`` -- ``), else appended;
    * ``pytest``: ``--collect-only -q`` appended (the named tests must exist);
    * ``recsys-submit status|logs|cancel|requeue``: not run (no run was submitted);
    * anything else (render, profiles, preparing files): run as it is.
    """
    stripped = command.strip()
    if RUN_COMMAND.match(stripped):
        return None
    if DRY_RUN_COMMAND.match(stripped):
        head, sep, tail = stripped.partition(" -- ")
        return f"{head} --dry-run{sep}{tail}" if sep else f"{stripped} --dry-run"
    if PYTEST_COMMAND.match(stripped):
        return f"{stripped} --collect-only -q"
    return stripped


def script(block: Block) -> str:
    """The bash script the docs test runs for ``block`` (after its directive is applied)."""
    if block.mode == "run":
        return block.text
    out = []
    for line in _logical_lines(block.text):
        command, comment = _split_comment(line)
        if not command.strip():
            out.append(line)
            continue
        parts = _split_commands(command)
        kept: List[str] = []
        for part in parts:
            if part in ("&&", ";"):
                kept.append(part)
                continue
            if block.mode == "setup-done":
                new = None if SETUP_PART.match(part) else part.strip()
            else:
                new = dry_run_line(part)
            if new is None:   # drop the command and the separator that joined it
                if kept and kept[-1] in ("&&", ";"):
                    kept.pop()
                continue
            if kept and kept[-1] not in ("&&", ";"):
                kept.append("&&" if block.mode == "setup-done" else ";")
            kept.append(new)
        while kept and kept[0] in ("&&", ";"):
            kept.pop(0)
        trailing = command.rstrip().endswith("&&")
        text = " ".join(kept).strip()
        if trailing and not text.endswith("&&"):
            text += " &&"
        out.append(text + comment if text else comment.strip())
    return "\n".join(out) + "\n"


def markdown_files(repo: Path) -> List[Path]:
    """README.md and docs/*.md, the files whose examples are executed."""
    return [repo / "README.md"] + sorted((repo / "docs").glob("*.md"))
