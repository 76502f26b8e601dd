"""Live processes seen through /proc, for tests that check a job left nothing running."""
from __future__ import annotations

from pathlib import Path


def live_commands(*needles: str, width: int = 200) -> list[str]:
    """`pid: command line` (cut to `width`) of every live process whose command line holds all `needles`."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if all(needle in cmd for needle in needles):
                found.append(f"{proc.name}: {cmd[:width]}")
    return found
