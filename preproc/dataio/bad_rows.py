"""Accounting of bad input rows: counted per file, reported, then skipped or fatal.

A pipeline counts, per input file, the rows it read and the rows it rejected
(wrong field count, unparsable number...), in whatever Spark pass it already
makes, and hands the counts to ``enforce``. ``enforce`` logs one line per file
with bad rows and, under ``--bad-rows fatal``, raises a one-line
``PreprocError`` naming the first such file (the full per-file list is in the
log). Under ``skip`` (the default) the rows are dropped and the counts end up in
the pipeline's report, unless they are more than ``max_share`` of the rows (a
pipeline that passes it, e.g. ``preproc tabular --max-bad-rows``): a table whose
bad rows are a large share is not one to train on silently. A pipeline that
knows why rows are bad passes ``details`` (columns, reasons, first rows), which
the messages then give instead of the generic reason.
"""
from __future__ import annotations

import argparse
import logging
from typing import Mapping, Optional

from preproc.errors import PreprocError

log = logging.getLogger("preproc.bad_rows")
POLICIES = ("skip", "fatal")
MAX_SHARE = 0.01        # the default --max-bad-rows: dropping more than 1 % of a table is not routine


def add_bad_rows_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bad-rows", choices=POLICIES, default="skip",
                        help="rows with a wrong field count or unparsable numbers: drop them and report per "
                             "file (skip, default) or stop with an error after counting them all (fatal)")


def add_max_bad_rows_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-bad-rows", type=float, default=MAX_SHARE, metavar="SHARE",
                        help="the largest share of the rows that --bad-rows skip may drop; more fails the run "
                             f"(default {MAX_SHARE:g}, " + f"{MAX_SHARE:.0%}".replace("%", "%%") + ")")


def enforce(counts: Mapping[str, tuple[int, int]], policy: str, what: str = "input",
            max_share: Optional[float] = None, details: str = "") -> dict[str, dict]:
    """``counts``: {file: (bad rows, total rows)}. Log, apply ``policy`` (and ``max_share`` of all
    rows under skip); return a JSON-able report."""
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
    why = details or "wrong field count or unparsable number"
    if details and bad_files:
        log.warning("%s: bad rows: %s", what, details)
    if bad_files and policy == "fatal":
        first = bad_files[0]
        total_bad = sum(counts[f][0] for f in bad_files)
        raise PreprocError(f"{first}: {counts[first][0]} bad rows ({why}); "
                           f"{total_bad} in {len(bad_files)} file(s) in all; --bad-rows skip drops them")
    total_bad, total = sum(b for b, _ in counts.values()), sum(n for _, n in counts.values())
    if bad_files and max_share is not None and total_bad > max_share * total:
        raise PreprocError(f"{what}: {total_bad} of {total} rows bad ({total_bad / total:.1%}), more than "
                           f"--max-bad-rows {max_share:g} of the rows that --bad-rows skip may drop ({why}); "
                           f"fix the input, or raise --max-bad-rows")
    return report
