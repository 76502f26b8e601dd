"""Accounting of bad input rows: counted per file, reported, then skipped or fatal.

A pipeline counts, per input file, the rows it read and the rows it rejected
(wrong field count, unparsable number...), in whatever Spark pass it already
makes, and hands the counts to ``enforce``. ``enforce`` logs one line per file
with bad rows and, under ``--bad-rows fatal``, raises a one-line
``PreprocError`` naming the first such file (the full per-file list is in the
log). Under ``skip`` (the default) the rows are dropped and the counts end up in
the pipeline's report.
"""
from __future__ import annotations

import argparse
import logging
from typing import Mapping

from preproc.errors import PreprocError

log = logging.getLogger("preproc.bad_rows")
POLICIES = ("skip", "fatal")


def add_bad_rows_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bad-rows", choices=POLICIES, default="skip",
                        help="rows with a wrong field count or unparsable numbers: drop them and report per "
                             "file (skip, default) or stop with an error after counting them all (fatal)")


def enforce(counts: Mapping[str, tuple[int, int]], policy: str, what: str = "input") -> dict[str, dict]:
    """``counts``: {file: (bad rows, total rows)}. Log, apply ``policy``; return a JSON-able report."""
    if policy not in POLICIES:
        raise PreprocError(f"--bad-rows: {policy!r} is not one of {', '.join(POLICIES)}")
    report = {}
    for file in sorted(counts):
        bad, total = counts[file]
        report[file] = {"bad_rows": int(bad), "rows": int(total)}
        if bad:
            log.warning("%s: %s: %d of %d rows bad (%s)", what, file, bad, total,
                        "skipped" if policy == "skip" else "fatal")
    bad_files = [f for f in sorted(counts) if counts[f][0]]
    if bad_files and policy == "fatal":
        first = bad_files[0]
        total_bad = sum(counts[f][0] for f in bad_files)
        raise PreprocError(f"{first}: {counts[first][0]} bad rows (wrong field count or unparsable number); "
                           f"{total_bad} in {len(bad_files)} file(s) in all; --bad-rows skip drops them")
    return report
