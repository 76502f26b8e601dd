"""The one polling loop (with back-off) of runs, studies and the local backend's waits, so
none of them hammers a controller or spins on a process."""

import os
import time


def poll_until(poll_once, done, on_poll=None, first=None, factor=1.5, ceiling=None, timeout=None):
    """Call `poll_once()` until `done(result)` (or `timeout` s), backing off from `first` to
    `ceiling` seconds between polls (RECSYS_POLL_FIRST / RECSYS_POLL_MAX by default)."""
    first = float(first or os.environ.get("RECSYS_POLL_FIRST", "2"))
    ceiling = float(ceiling or os.environ.get("RECSYS_POLL_MAX", "60"))
    delay, start = first, time.monotonic()
    while True:
        result = poll_once()
        if on_poll:
            on_poll(result)
        if done(result) or (timeout is not None and time.monotonic() - start > timeout):
            return result
        time.sleep(delay)
        delay = min(ceiling, delay * factor)
