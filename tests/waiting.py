"""The tests' one wait: poll a condition with back-off until it holds, or fail naming it."""
from __future__ import annotations

import time


def wait_for(predicate, timeout=120, what="condition", delay=0.1, max_delay=1.0):
    """Poll `predicate` until it returns something true; TimeoutError naming `what` otherwise.
    The delay between polls grows from `delay` to `max_delay` (equal: a fixed rate, for a wait
    whose latency matters)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, max_delay)
