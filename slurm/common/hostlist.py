"""Slurm host lists ("node[1-3,7],gpu[01-02]") expanded into host names, as `scontrol show
hostnames` does, without a Slurm command (a report reads old runs on any machine)."""

import re

_GROUP = re.compile(r"\[([^\[\]]*)\]")


def _split_top(text):
    """Split at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _range(item):
    if "-" not in item:
        return [item]
    lo, hi = item.split("-", 1)
    if not (lo.isdigit() and hi.isdigit()) or int(hi) < int(lo):
        raise ValueError(f"bad host range {item!r}")
    width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
    return [str(n).zfill(width) for n in range(int(lo), int(hi) + 1)]


def expand(hostlist):
    """['node1', 'node2', ...] of a Slurm host list; ValueError on a malformed one."""
    out = []
    for part in _split_top(hostlist or ""):
        match = _GROUP.search(part)
        if not match:
            if "[" in part or "]" in part:
                raise ValueError(f"bad host list {part!r}")
            out.append(part)
            continue
        head, tail = part[:match.start()], part[match.end():]
        for item in match.group(1).split(","):
            for value in _range(item.strip()):
                out.extend(expand(head + value + tail))
    return out


def natural_key(name):
    """Sort key that puts node2 before node10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]
