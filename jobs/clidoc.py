"""A command-line reference page in Markdown, generated from a CLI's own argparse parser so that
it cannot drift from the commands and flags (docs/reference/, written by
docs/gen_cli_reference.py for recsys-submit, recsys-train and recsys-preproc; a fast test
regenerates the pages and compares).

Walks the parser with jobs.completion.walk (the walk shell completion uses); every command gets
its usage, description, arguments (names, metavar, default, choices, help) and the examples of
its epilog. The output depends on nothing but the parser: usage is formatted at a fixed width
(not the terminal's), argparse's version-dependent group titles are replaced, no dates. Nothing
in the CLI imports this module (`recsys-submit --help` stays as fast as it was).
"""
from __future__ import annotations

import argparse
import re
from typing import Iterable, List, Optional, Tuple

from .completion import subcommands, walk

USAGE_WIDTH = 100       # fixed, so the pages do not depend on the terminal of whoever generates them
_DEFAULT_GROUPS = {"positional arguments": "arguments", "optional arguments": "options", "options": "options"}


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading (lower case, punctuation dropped, spaces as dashes)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def inline(text: str) -> str:
    """Help text as one Markdown table cell: one line, `|` escaped, `<...>` shown (outside code)."""
    parts = " ".join(str(text).split()).replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):          # the even parts are outside code spans
        parts[i] = parts[i].replace("<", "&lt;")
    return "`".join(parts)


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    return argparse.HelpFormatter(prog=parser.prog, width=USAGE_WIDTH)


def usage(parser: argparse.ArgumentParser) -> str:
    """`usage: ...` as argparse prints it, wrapped at USAGE_WIDTH."""
    fmt = _formatter(parser)
    fmt.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return fmt.format_help().strip()


def invocation(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    """How --help names an argument: `-f, --follow`, `--nodes NODES`, `--model {dlrm,ncf}`, `RUN`."""
    fmt = _formatter(parser)
    if not action.option_strings:
        return fmt._format_args(action, action.dest)
    if action.nargs == 0:
        return ", ".join(action.option_strings)
    value = fmt._format_args(action, action.dest.upper())
    return ", ".join(f"{flag} {value}" for flag in action.option_strings)


def _default(action: argparse.Action) -> str:
    if action.required and action.option_strings:
        return "*required*"
    if action.nargs == 0 or action.default in (None, False, [], argparse.SUPPRESS):
        return ""
    return f"`{action.default}`"


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    text = _formatter(parser)._expand_help(action) if action.help else ""
    if action.choices and action.metavar is not None:       # the metavar hides them: say them
        text += " (choices: " + ", ".join(f"`{c}`" for c in action.choices) + ")"
    return inline(text)


def argument_tables(parser: argparse.ArgumentParser) -> List[str]:
    """One table per argument group (its title as --help shows it), -h/--help and hidden flags left out."""
    lines: List[str] = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions
                   if a.help != argparse.SUPPRESS and not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        if not actions:
            continue
        lines += ["", f"*{_DEFAULT_GROUPS.get(str(group.title), group.title)}*", "",
                  "| argument | default | help |", "|---|---|---|"]
        lines += [f"| `{invocation(parser, a)}` | {_default(a)} | {_help(parser, a)} |" for a in actions]
    return lines


def prose(text: Optional[str]) -> List[str]:
    """A description or epilog as Markdown: a paragraph whose first line ends with ':' and whose other
    lines are indented ("examples:\\n  recsys-submit ...") becomes that line and a code block."""
    lines: List[str] = []
    for paragraph in re.split(r"\n\s*\n", (text or "").strip("\n")):
        rows = paragraph.rstrip().split("\n")
        if not paragraph.strip():
            continue
        if len(rows) > 1 and rows[0].rstrip().endswith(":") and all(r.startswith(" ") for r in rows[1:]):
            body = [r[min(len(x) - len(x.lstrip()) for x in rows[1:]):] for r in rows[1:]]
            lines += ["", inline(rows[0].strip().capitalize()), "", "```text", *body, "```"]
        else:
            lines += ["", inline(paragraph)]
    return lines


def command_section(parser: argparse.ArgumentParser, heading: Optional[str], summary: Optional[str] = None,
                    level: int = 2) -> List[str]:
    """The section of one command: heading, description (else its one-line help), usage, arguments, epilog."""
    lines = ["", "#" * level + " " + heading] if heading else []
    lines += prose(parser.description or summary)
    lines += ["", "```text", usage(parser), "```"]
    below = subcommands(parser)
    if below:
        prefix = heading or parser.prog
        lines += ["", "Commands: " + ", ".join(f"[`{name}`](#{anchor(prefix + ' ' + name)})" for name, _, _ in below)
                  + "."]
    lines += argument_tables(parser)
    lines += prose(parser.epilog)
    return lines


def commands(parser: argparse.ArgumentParser, prog: str) -> List[Tuple[str, argparse.ArgumentParser, Optional[str]]]:
    """[(full command, parser, one-line help)] of every command below the top, depth first."""
    seen, found = {id(parser)}, []
    for path, node, text in walk(parser):
        if id(node) not in seen:                # an alias names a parser already listed
            seen.add(id(node))
            found.append((" ".join((prog, *path)), node, text))
    return found


def contents(entries: Iterable[Tuple[str, Optional[str]]]) -> List[str]:
    """A table of commands linking to their sections."""
    lines = ["", "| command | what it does |", "|---|---|"]
    lines += [f"| [`{name}`](#{anchor(name)}) | {inline(text or '')} |" for name, text in entries]
    return lines


def header(title: str, command: str) -> List[str]:
    """The page's title and the note that it is generated (and how to regenerate it)."""
    return [f"# {title}", "",
            "<!-- Generated from the CLI's own parser by docs/gen_cli_reference.py: do not edit; "
            f"regenerate with `{command}`. -->",
            "",
            "Every command also takes `-h`/`--help`, which prints the same text in the terminal. This page is "
            "generated from the parser itself; the task-oriented guides are in [the docs](../../README.md#documentation)."]


def page(parser: argparse.ArgumentParser, prog: str, command: str) -> str:
    """The whole reference page of one program: its own section, a table of commands, then one
    section per command (a command with subcommands first, its subcommands after it)."""
    found = commands(parser, prog)
    lines = header(prog, command) + command_section(parser, None)
    if found:
        lines += ["", "## Commands"] + contents((name, text) for name, _, text in found)
    for name, node, text in found:
        lines += command_section(node, name, text)
    return "\n".join(lines).strip() + "\n"
