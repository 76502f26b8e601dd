"""The project's one parser and formatter of Linux CPU lists (``"0-3,8,176-183"``).

Why here: the submission layer (``jobs``, login node: profile tables, sysfs detection,
binding) and the training engine (``recsys``, in the job: pinning a rank to its NUMA
node) both read CPU lists, and neither may import the other (``jobs`` knows ``recsys``
only as a command; ``recsys`` must run without the submission layer).  ``slurm.common`` is the
leaf both already ship with (in the job's ``slurm/``), and this module imports nothing
but ``re``, so either side may import it at no cost.  ``slurm/bind.sh`` keeps a shell
twin (``expand_list``/``compress_list``): a per-rank wrapper cannot start Python, and
tests/jobs/test_binding.py holds the two to the same results.
"""
from __future__ import annotations

import re
from typing import Any, Iterable, List

__all__ = ["parse_cpulist", "format_cpulist"]

_PART = re.compile(r"^\s*\d+(\s*-\s*\d+)?\s*$")


def parse_cpulist(text: Any, allow_empty: bool = False) -> List[int]:
    """``"0-3,8"`` (Linux cpulist), ``[0, 1]`` or ``5`` -> sorted unique ints.

    Raises ValueError on anything else (bad syntax, descending range, negative or
    repeated id).  An empty or blank string is an error unless ``allow_empty``
    (sysfs writes an empty line for a CPU-less NUMA node).
    """
    if isinstance(text, bool):
        raise ValueError(f"not a CPU list: {text!r}")
    if isinstance(text, int):
        items: List[int] = [text]
    elif isinstance(text, list):
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in text):
            raise ValueError(f"not a CPU list: {text!r}")
        items = list(text)
    elif isinstance(text, str):
        if allow_empty and not text.strip():
            return []
        items = []
        for part in text.split(","):
            if not _PART.match(part):
                raise ValueError(f"not a CPU list: {text!r}")
            lo, _, hi = part.partition("-")
            lo_i, hi_i = int(lo), int(hi) if hi else int(lo)
            if hi_i < lo_i:
                raise ValueError(f"descending range {part.strip()!r} in CPU list")
            items.extend(range(lo_i, hi_i + 1))
    else:
        raise ValueError(f"not a CPU list: {text!r}")
    if any(x < 0 for x in items):
        raise ValueError(f"negative CPU id in {text!r}")
    if len(set(items)) != len(items):
        raise ValueError(f"CPU listed twice in {text!r}")
    return sorted(items)


def format_cpulist(cpus: Iterable[int]) -> str:
    """Ints -> canonical cpulist ``"48-55,176-183"`` (``""`` when empty)."""
    out, ids = [], sorted(set(cpus))
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)
