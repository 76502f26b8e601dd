"""Slurm time-limit strings: parse them as sbatch does, and format them back.

sbatch accepts "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
"days-hours:minutes" and "days-hours:minutes:seconds" (plus "infinite"/"unlimited"), every field
a non-negative integer; anything else is rejected by sbatch at submission time, so we reject it
here first. A limit of zero means "no limit" to Slurm; we refuse it because the job's
checkpoint signal (--signal=B:USR2@s) needs a real end time.
"""

import re

from .errors import RequestError

_UNLIMITED = {"infinite", "unlimited"}
_NUM = r"(\d+)"
_FORMS = [
    (re.compile(rf"^{_NUM}$"), ("m",)),
    (re.compile(rf"^{_NUM}:{_NUM}$"), ("m", "s")),
    (re.compile(rf"^{_NUM}:{_NUM}:{_NUM}$"), ("h", "m", "s")),
    (re.compile(rf"^{_NUM}-{_NUM}$"), ("d", "h")),
    (re.compile(rf"^{_NUM}-{_NUM}:{_NUM}$"), ("d", "h", "m")),
    (re.compile(rf"^{_NUM}-{_NUM}:{_NUM}:{_NUM}$"), ("d", "h", "m", "s")),
]
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_time(text, what="--time"):
    """Seconds of a Slurm time limit; None for unlimited. Raises RequestError naming `what`."""
    value = str(text).strip()
    if value.lower() in _UNLIMITED:
        return None
    for pattern, units in _FORMS:
        match = pattern.match(value)
        if match:
            seconds = sum(int(v) * _SECONDS[u] for v, u in zip(match.groups(), units))
            if seconds <= 0:
                raise RequestError(f"{what}: time limit {text!r} is zero; give a positive limit")
            return seconds
    raise RequestError(
        f"{what}: {text!r} is not a Slurm time limit "
        "(use MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS)")


def elapsed_clock(seconds):
    """`H:MM:SS` of an elapsed time (progress lines: `elapsed 0:02:51`)."""
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def format_time(seconds):
    """`D-HH:MM:SS` (or `HH:MM:SS` under a day) for #SBATCH --time; UNLIMITED for None."""
    if seconds is None:
        return "UNLIMITED"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock
