"""The toolkit's one checker of a YAML file a user wrote: every mistake at once, each one line.

Why one: profiles (``jobs.profiles.schema``), study specs (``jobs.study.spec``), tabular configs
(``preproc.tabular.config``) and feature specs (``recsys.features.spec``) are all read from YAML a
user wrote, and a user fixing a file wants every mistake in one run, each in the same shape:
``<file>: <key.path>: <problem>`` (``<file>: line N: ...`` from the reader, slurm.common.yamlfile,
where only a line is known), an unknown key with the closest known one ("did you mean"). A single
mistake stays the one-line error it always was: the error raised is the first mistake, and its
``problems`` lists every line, that one first (the CLIs print them one per line).

Two ways to check a key, both recording a mistake and going on with the next key: a ``with
problems:`` block (its first mistake, raised with :meth:`Problems.fail`, leaves the block) and
:meth:`Problems.collect` (a function's value, or a default when it raised the format's error).
Standard library only (``slurm.common`` is the leaf every layer imports).
"""
from __future__ import annotations

import difflib
from typing import Any, Callable, Dict, Iterable, List, NoReturn, Optional, Tuple, Type

from slurm.common.cpulist import parse_cpulist
from slurm.common.yamlfile import printable, typename

__all__ = ["Problems", "unknown_key", "type_words"]


def unknown_key(key: Any, known: Iterable[str]) -> str:
    """The problem of a key that is not one of ``known``: with the closest known key, if any."""
    known = list(known)
    close = difflib.get_close_matches(key, sorted(known), n=1) if isinstance(key, str) else []
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown key ({hint}known: {', '.join(known)})"


_ARTICLE = {"mapping": "a mapping", "list": "a list", "string": "a string", "integer": "an integer",
            "number": "a number", "bool": "true or false"}


def type_words(types: Tuple[type, ...]) -> str:
    """``(int, float)`` -> "a number", ``(str,)`` -> "a string": what a message says a key must be."""
    names = [typename(t()) for t in types]
    if names == ["integer", "number"]:
        names = ["number"]
    return " or ".join(_ARTICLE.get(n, n) for n in names)


class Problems:
    """Every mistake of one file. ``error`` is the format's exception class (a mistake the checks
    raise, caught by ``with`` and :meth:`collect`); ``make(source, key, problem)`` builds one (by
    default ``error("<source>: <key>: <problem>")``, one printable line)."""

    class _Left(Exception):
        """Raised by :meth:`add`: the block is left, the line already recorded."""

    def __init__(self, source: Any, error: Type[Exception],
                 make: Optional[Callable[[str, str, str], Exception]] = None):
        self.source = str(source)
        self.error = error
        self.make = make or (lambda source, key, problem: error(printable(f"{source}: {key}: {problem}")))
        self._found: List[Tuple[str, Optional[Exception]]] = []     # (line, its error when there is one)

    @property
    def lines(self) -> List[str]:
        """Every mistake recorded so far, one line each, in the order found."""
        return [line for line, _ in self._found]

    def problem(self, key: str, problem: str) -> Exception:
        """The mistake ``<source>: <key>: <problem>`` as the format's error (not recorded)."""
        return self.make(self.source, key, problem)

    def fail(self, key: str, problem: str) -> NoReturn:
        """Raise the mistake: recorded by the enclosing ``with`` block or :meth:`collect`."""
        raise self.problem(key, problem)

    def record(self, key: str, problem: str) -> None:
        """Record a mistake and go on in the same block."""
        self._keep(self.problem(key, problem))

    def add(self, line: str) -> NoReturn:
        """Record a whole line (a message that already names the file) and leave the block."""
        self._found.append((line, None))
        raise self._Left

    def _keep(self, exc: Exception) -> None:
        """Record an error of the format, with every problem it carries (a file it read)."""
        lines = [str(p) for p in getattr(exc, "problems", None) or [exc]]
        for i, line in enumerate(lines):
            if line not in self.lines:
                self._found.append((line, exc if i == 0 else None))

    def collect(self, check: Callable[[], Any], default: Any = None) -> Any:
        """Run one independent check: its value, or ``default`` with its mistake(s) recorded."""
        try:
            return check()
        except self.error as exc:
            self._keep(exc)
            return default

    def __enter__(self) -> "Problems":
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if kind is not None and issubclass(kind, self.error):
            self._keep(exc)
            return True
        return kind is self._Left       # a block's first mistake ends the block, not the check

    def raise_problems(self) -> None:
        """Raise the first mistake (one line), carrying every line as ``problems``."""
        if not self._found:
            return
        line, first = self._found[0]
        if first is None or str(first) != line:
            first = self.error(line)
        first.problems = self.lines
        raise first

    # typed access to a raw mapping: a wrong type or a value out of range is a mistake of ``path``
    def mapping(self, value: Any, path: str) -> Dict[Any, Any]:
        if not isinstance(value, dict):
            self.fail(path, f"must be a mapping, got {typename(value)}")
        return value

    def no_unknown(self, data: Dict[Any, Any], known: Iterable[str], prefix: str = "") -> None:
        """Record every unknown key of ``data`` (the other keys are still checked)."""
        known = sorted(known)
        for key in data:
            if key not in known:
                self.record(f"{prefix}{printable(key)}", unknown_key(key, known))

    def typed(self, data: Dict[Any, Any], key: str, types: Any, path: str, required: bool = False,
              default: Any = None) -> Any:
        if key not in data or data[key] is None:
            if required:
                self.fail(path, "required key is missing")
            return default
        value = data[key]
        want = types if isinstance(types, tuple) else (types,)
        if isinstance(value, bool) and bool not in want:
            self.fail(path, f"must be {type_words(want)}, got bool")
        if not isinstance(value, want):
            self.fail(path, f"must be {type_words(want)}, got {typename(value)}")
        return value

    def integer(self, data, key: str, path: str, required: bool = False, default: Any = None,
                minimum: Optional[int] = None) -> Optional[int]:
        value = self.typed(data, key, int, path, required, default)
        if value is not None and minimum is not None and value < minimum:
            self.fail(path, f"must be >= {minimum}, got {value}")
        return value

    def number(self, data, key: str, path: str, default: Any = None) -> Optional[float]:
        value = self.typed(data, key, (int, float), path, False, default)
        if value is not None and value <= 0:
            self.fail(path, f"must be positive, got {value}")
        return value

    def string(self, data, key: str, path: str, required: bool = False, default: Any = None,
               choices: Optional[Iterable[str]] = None) -> Optional[str]:
        value = self.typed(data, key, str, path, required, default)
        if value is not None and choices and value not in choices:
            self.fail(path, f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def str_list(self, data, key: str, path: str) -> List[str]:
        value = self.typed(data, key, list, path, default=[])
        for i, item in enumerate(value):
            if not isinstance(item, str) or isinstance(item, bool):
                self.fail(f"{path}[{i}]", f"must be a string, got {typename(item)}")
        return list(value)

    def cpulist(self, value: Any, path: str) -> List[int]:
        try:
            return parse_cpulist(value)
        except ValueError as exc:
            self.fail(path, str(exc))
