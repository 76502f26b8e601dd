"""Print the reliability table from the fault tests' results.

    python -m tests.faults.report [RESULTS.jsonl] [--markdown]

Reads the lines tests/faults/ wrote (`RECSYS_FAULT_RESULTS`, default `.fault-results.jsonl` at the
repository root) and exits 1 if any fault lost data or any trial did not survive.
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="?", type=Path, default=None,
                        help=f"results file (default: {results_path()})")
    args = parser.parse_args(argv)
    results = load(args.results)
    if not results:
        print(f"{args.results or results_path()}: no fault results (run: bash tests/run.sh -m faults)",
              file=sys.stderr)
        return 2
    print(markdown(results))
    bad = [r.fault for r in results if r.data_lost or r.survived < r.trials]
    if bad:
        print("faults that lost data or did not survive: " + ", ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
