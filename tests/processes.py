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


def engine_ranks(needle: str) -> list[int]:
    """Pids of the live engine processes (`python -m recsys.train ...`: a rank, not the srun or
    mpirun line that started it) whose command line holds `needle` (a run or checkpoint path)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if "python" in Path(argv[0]).name and argv[1:3] == ["-m", "recsys.train"] and needle in " ".join(argv):
                found.append(int(proc.name))
    return found
