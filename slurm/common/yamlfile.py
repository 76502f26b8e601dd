"""The toolkit's one reader of YAML files (profiles, study specs, tabular configs, feature specs),
with limits, and the helpers that keep an error message about a read value one short line.

Why here: the submission layer (``jobs``: profiles, study specs) and both engines (``preproc``:
tabular configs; ``recsys``: feature specs) read YAML a user wrote, and must refuse the same hostile
inputs the same way; none of them may import another (``jobs`` knows the engines only as commands,
the engines never import ``jobs``). ``slurm.common`` is the leaf package all three already import
(``slurm.common.cpulist``) and it imports nothing of theirs (contract ``slurm-is-a-leaf``).
pyyaml and the standard library only.

Why limits: pyyaml's safe loaders build an alias as a shared reference, so a "billion laughs"
file (anchors of anchors) loads in microseconds, but whatever walks, formats, copies or dumps the
value expands it exponentially (a ``{value!r}`` in an error message hung for ever); deep nesting
overflows the recursive composer; a FIFO or ``/dev/zero`` never ends. So a file is read only if it
is a regular file of at most MAX_BYTES, and its events are counted (nothing is built) before it is
loaded: at most MAX_DEPTH levels, MAX_ALIASES aliases, no alias inside its own anchor, and at most
MAX_NODES nodes with every alias counted as the nodes it stands for. Every refusal is one
:class:`YamlFileError` ``<file>: <where>: <problem>``.
"""
from __future__ import annotations

import os
import re
import stat
from typing import Any

import yaml

from slurm.common.errors import ToolkitError

__all__ = ["YamlFileError", "load_yaml_file", "typename", "shown", "keyname", "printable", "control_char",
           "MAX_BYTES", "MAX_DEPTH", "MAX_ALIASES", "MAX_NODES"]

MAX_BYTES = 4 << 20         # profiles, specs and configs are a few KiB; a feature spec lists its files
MAX_DEPTH = 64              # levels of nesting (an alias counts with the depth of its anchor)
MAX_ALIASES = 256
MAX_NODES = 200_000         # scalars and collections, an alias counted as the nodes it stands for

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when built with it
# C0 controls, DEL, C1 controls (U+0080-U+009F, NEL among them) and the Unicode line and paragraph
# separators: each may end a line for some reader of a script or a file name (sbatch read a
# partition holding U+2028 as two names).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class YamlFileError(ToolkitError, ValueError):
    """A YAML file that cannot be read, is malformed or exceeds a limit (one-line message)."""

    def __init__(self, path: Any, where: str, problem: str):
        self.path, self.where, self.problem = str(path), where, problem
        super().__init__(f"{printable(self.path)}: {where}: {problem}")


def control_char(text: str):
    """The first control character in ``text`` (below 0x20, DEL, U+0080-U+009F) or line or
    paragraph separator (U+2028, U+2029), or None: in a value that reaches a script line or a
    file name it ends the line or the name."""
    match = _CONTROL.search(text)
    return match.group() if match else None


def printable(text: str) -> str:
    """``text`` with every control character escaped (``\\n``, ``\\x1b``): a file name or key in a
    one-line message stays one line."""
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], str(text))


def typename(value: Any) -> str:
    """The YAML word for a value's type (mapping, list, string, integer, ...)."""
    return {dict: "mapping", list: "list", str: "string", int: "integer", float: "number",
            bool: "bool", type(None): "null"}.get(type(value), type(value).__name__)


def shown(value: Any, limit: int = 40) -> str:
    """A read value as an error message may show it: a short scalar's repr (a long string cut to
    ``limit`` characters), anything else only by its type. Never the text of a nested value,
    which can be exponentially long (module docstring) or span lines."""
    if value is None or isinstance(value, (bool, float)):
        return repr(value)
    if isinstance(value, int):
        return repr(value) if value.bit_length() <= 64 else "a very large integer"
    if isinstance(value, str):
        return repr(value) if len(value) <= limit else repr(value[:limit]) + "..."
    return f"a {typename(value)}"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _read_text(path: Any) -> str:
    """The UTF-8 text of a regular file of at most MAX_BYTES; never blocks on a FIFO or reads a
    device (checked before opening, and again on the opened descriptor)."""
    def fail(where, problem):
        raise YamlFileError(path, where, problem)

    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            fail("file", f"not a regular file ({_kind(info.st_mode)})")
        if info.st_size > MAX_BYTES:
            fail("file", f"{info.st_size} bytes, more than the {MAX_BYTES} a YAML file may have")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                fail("file", "not a regular file")
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        fail("file", f"cannot read: {exc.strerror or exc}")
    if len(data) > MAX_BYTES:
        fail("file", f"more than the {MAX_BYTES} bytes a YAML file may have")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = exc.object.count(b"\n", 0, exc.start) + 1
        fail(f"line {line}", f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})")


def _check_events(text: str, path: Any) -> None:
    """Refuse a document over the limits from its parser events alone (nothing is built)."""
    frames = []         # open collections: [expanded size, height, anchor]
    anchors = {}        # anchor -> (expanded size, height) of its finished node
    open_anchors = set()
    count = aliases = 0

    def fail(event, problem):
        raise YamlFileError(path, f"line {event.start_mark.line + 1}", problem)

    def add(event, size, height, anchor=None):
        nonlocal count
        count += size
        if count > MAX_NODES:
            fail(event, f"more than {MAX_NODES} nodes (aliases counted as what they repeat)")
        if len(frames) + height > MAX_DEPTH:
            fail(event, f"nested more than {MAX_DEPTH} levels deep")
        if anchor is not None:
            anchors[anchor] = (size, height)
            open_anchors.discard(anchor)
        if frames:
            frames[-1][0] += size
            frames[-1][1] = max(frames[-1][1], height + 1)

    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.ScalarEvent):
            add(event, 1, 1, event.anchor)
        elif isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if len(frames) >= MAX_DEPTH:
                fail(event, f"nested more than {MAX_DEPTH} levels deep")
            frames.append([0, 1, event.anchor])
            if event.anchor is not None:
                open_anchors.add(event.anchor)
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            size, height, anchor = frames.pop()
            add(event, size + 1, height, anchor)
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                fail(event, f"more than {MAX_ALIASES} aliases")
            if event.anchor in open_anchors:
                fail(event, f"alias *{printable(event.anchor)} inside its own anchor (a structure that contains itself)")
            size, height = anchors.get(event.anchor, (1, 1))   # an unknown anchor: the loader says so
            add(event, size, height)


def load_yaml_file(path: Any) -> Any:
    """The value of a YAML file (None when empty), read within the limits of this module;
    :class:`YamlFileError` otherwise. The caller checks the value's types."""
    text = _read_text(path)
    try:
        _check_events(text, path)
        return yaml.load(text, Loader=_LOADER)
    except YamlFileError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "yaml"
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YamlFileError(path, where, f"malformed YAML: {printable(problem)}") from None
    except (ValueError, OverflowError) as exc:   # a date like 2024-13-45, an integer of 5000 digits
        raise YamlFileError(path, "yaml", f"a value cannot be read: {printable(str(exc).splitlines()[0])[:120]}") \
            from None


def keyname(key: Any, limit: int = 40) -> str:
    """A mapping key as a key path in a message shows it: the key itself when it is a short
    one-line string, else :func:`shown` (a YAML key may be a number, null or a long string)."""
    if isinstance(key, str) and len(key) <= limit and not _CONTROL.search(key):
        return key
    return shown(key, limit)
