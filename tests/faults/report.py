"""Print the reliability table from the fault tests' results.

    python -m tests.faults.report [RESULTS.jsonl] [--markdown]

Reads the lines tests/faults/ wrote (`RECSYS_FAULT_RESULTS`, default `.fault-results.jsonl` at the
repository root) and exits 1 if any fault lost data or any trial did not survive, 2 if there are no
results or the file is not one this version reads. Without --markdown the table is aligned text.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tests.faults.record import load, results_path

HEADER = ("fault", "trials", "survived", "data lost", "time to recover", "what was checked")


def rows(results) -> list:
    out = []
    for r in results:
        recover = "-" if r.recover_s is None else f"{r.recover_s:.1f} s"
        out.append((r.fault, str(r.trials), str(r.survived), str(r.data_lost), recover, r.detail))
    return out


def markdown(results) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(results)]
    return "\n".join(lines)


def text(results) -> str:
    """The table aligned for a terminal."""
    table = [HEADER] + rows(results)
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER) - 1)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1]
                     for row in table)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=Path, default=None,
                        help=f"results file (default: {results_path()})")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table (for the README)")
    args = parser.parse_args(argv)
    try:
        results = load(args.results)
    except (ValueError, TypeError) as exc:
        print(f"{args.results or results_path()}: {exc}", file=sys.stderr)
        return 2
    if not results:
        print(f"{args.results or results_path()}: no fault results (run: bash tests/run.sh -m faults)",
              file=sys.stderr)
        return 2
    print(markdown(results) if args.markdown else text(results))
    bad = [r.fault for r in results if r.data_lost or r.survived < r.trials]
    if bad:
        print("faults that lost data or did not survive: " + ", ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
