"""The small checks TrainConfig makes on single values and paths, each failing with one line that
names its flag (EngineError: exit 2 at the entry point, before TensorFlow starts)."""
from __future__ import annotations

import os

from recsys.errors import EngineError


def memory_budget_gb(flag_value):
    """--embedding-memory-gb, else the profile's value exported by the job, else memory / local ranks."""
    if flag_value is not None:
        return flag_value
    env = os.environ.get("RECSYS_EMBEDDING_MEMORY_GB")
    if env:
        try:
            return float(env)
        except ValueError:
            fail(f"RECSYS_EMBEDDING_MEMORY_GB={env!r} is not a number")
    local = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE", "1")
                .split("(")[0] or 1)
    if os.environ.get("SLURM_MEM_PER_NODE", "").isdigit():
        return int(os.environ["SLURM_MEM_PER_NODE"]) * 2**20 / 1e9 / max(1, local)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9 / max(1, local)
    except (ValueError, OSError):
        return None


def fitting_batch(samples: int, world_size: int) -> int:
    """A batch to suggest: the ranks times the largest power of two that fits ``samples``."""
    per_rank = max(1, samples // world_size)
    return world_size * (1 << (per_rank.bit_length() - 1))


def check_creatable(flag: str, value: str, directory: str):
    """``directory`` exists or can be made with ``mkdir -p``: its nearest existing ancestor
    is a writable directory (not a file)."""
    path = os.path.abspath(directory)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    if not os.path.isdir(path):
        fail(f"{flag} {value}: {path} is not a directory")
    if not os.access(path, os.W_OK):
        fail(f"{flag} {value}: directory {path} is not writable")


def flag_text(dest: str, value) -> str:
    """A flag and its value as the user would type it (``--keep-best``, ``--lr 0.001``)."""
    if isinstance(value, bool):
        return f"--{flag_name(dest)}" if value else f"--no-{flag_name(dest)}"
    return f"--{flag_name(dest)} {value:g}" if isinstance(value, float) else f"--{flag_name(dest)} {value}"


def flag_name(dest: str) -> str:
    """A TrainConfig field's flag name without its dashes (``keep_best``: ``keep-best``)."""
    return dest.replace("_", "-")


def fail(message: str):
    """A configuration error: one line naming the flag, exit 2 at the entry point."""
    raise EngineError(message)
