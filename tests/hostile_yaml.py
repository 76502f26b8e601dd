"""Hostile YAML for the loader-limit tests (profiles, study specs, tabular configs): one
"billion laughs" value as text and in memory, and the check that a refusal is one short line
that came quickly (a refusal reads no more than slurm/common/yamlfile.py's limits allow)."""

import time

import pytest

QUICK = 5.0     # seconds


def bomb_text(levels=9):
    """A billion-laughs value: 9 anchors, each 9 aliases of the one before (9**9 strings)."""
    value = "&a0 [" + ", ".join(["lol"] * 9) + "]"
    for i in range(1, levels):
        value = f"&a{i} [{value}, " + ", ".join([f"*a{i - 1}"] * 8) + "]"
    return value


def bomb_value(levels=30):
    """The same in memory (shared lists, 9**30 strings if walked): what a program may pass."""
    value = ["lol"] * 9
    for _ in range(levels):
        value = [value] * 9
    return value


def quick_error(call, error=ValueError):
    """The message of the `error` that `call()` raises, checked to be one line under 400
    characters, raised within QUICK seconds."""
    start = time.monotonic()
    with pytest.raises(error) as info:
        call()
    assert time.monotonic() - start < QUICK
    message = str(info.value)
    assert "\n" not in message and len(message) < 400, message[:400]
    return message
