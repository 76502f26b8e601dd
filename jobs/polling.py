"""The one polling loop (with back-off) of runs, studies and the local backend's waits, so
none of them hammers a controller or spins on a process.

Backing off alone sees a job's end up to the ceiling late (a minute by default). A watcher can
also give a cheap local probe (jobs.runs.enginelog.activity: the files its jobs write): read every
few seconds between polls, a change there (a job's logs appear, an engine writes its summary)
brings the next poll forward and starts the back-off again, with no scheduler call meanwhile."""
from __future__ import annotations

import os
import time
from typing import Callable, Hashable, Optional, TypeVar

T = TypeVar("T")
WAKE_S = 2.0          # how often a watcher's probe is read between polls (a few stats, no scheduler call)


def poll_until(poll_once: Callable[[], T], done: Callable[[T], bool], on_poll: Optional[Callable[[T], object]] = None,
               first: Optional[float] = None, factor: float = 1.5, ceiling: Optional[float] = None,
               timeout: Optional[float] = None, wake: Optional[Callable[[], Hashable]] = None,
               wake_every: float = WAKE_S) -> T:
    """Call `poll_once()` until `done(result)` (or `timeout` s), backing off from `first` to
    `ceiling` seconds between polls (RECSYS_POLL_FIRST / RECSYS_POLL_MAX by default).

    `wake()`: a cheap probe, read every `wake_every` s while waiting; when its value differs from
    the one read after the last poll, the next poll is at once and the back-off restarts at
    `first` (what the probe watches has just changed, so the state may have too)."""
    first = float(first) if first else float(os.environ.get("RECSYS_POLL_FIRST") or "2")
    ceiling = float(ceiling) if ceiling else float(os.environ.get("RECSYS_POLL_MAX") or "60")
    delay, start = first, time.monotonic()
    while True:
        result = poll_once()
        if on_poll:
            on_poll(result)
        if done(result) or (timeout is not None and time.monotonic() - start > timeout):
            return result
        if wake is None:
            time.sleep(delay)
        elif _woken(wake, delay, wake_every):
            delay = first
            continue
        delay = min(ceiling, delay * factor)


def _woken(wake: Callable[[], Hashable], delay: float, every: float) -> bool:
    """Wait up to `delay` s; True as soon as `wake()` changes."""
    seen, end = wake(), time.monotonic() + delay
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(every, left))
        if wake() != seen:
            return True
