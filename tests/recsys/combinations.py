"""Pairwise (all-pairs) combinations of the engine's choices, generated greedily.

Every value of every factor is paired with every value of every other factor in at least one row
(pairwise coverage: most faults that combinations cause need two choices together), in far fewer
rows than the full product. The factors come from the engine's own argparse parser
(:func:`parser_factors`), so a new choice value joins the matrix by itself.
"""
from __future__ import annotations

import argparse
import itertools
from typing import Callable, Dict, Iterable, List, Sequence, Set, Tuple

Row = Dict[str, object]
Pair = Tuple[Tuple[str, object], Tuple[str, object]]


def parser_factors(parser: argparse.ArgumentParser, dests: Sequence[str]) -> Dict[str, List[object]]:
    """{dest: values} of the parser's options ``dests``: an option's choices, or (False, True) for
    a flag (store_true)."""
    by_dest = {a.dest: a for a in parser._actions}
    out = {}
    for dest in dests:
        action = by_dest[dest]
        if action.choices:
            out[dest] = list(action.choices)
        elif isinstance(action, argparse._StoreTrueAction):
            out[dest] = [False, True]
        else:
            raise ValueError(f"{dest}: neither choices nor a flag")
    return out


def row_pairs(row: Row) -> Set[Pair]:
    """Every pair of (factor, value) in ``row`` (factors in sorted order)."""
    items = sorted(row.items(), key=lambda kv: kv[0])
    return {(a, b) for a, b in itertools.combinations(items, 2)}


def all_pairs(factors: Dict[str, List[object]]) -> Set[Pair]:
    names = sorted(factors)
    return {((a, va), (b, vb)) for a, b in itertools.combinations(names, 2)
            for va in factors[a] for vb in factors[b]}


def pairwise(factors: Dict[str, List[object]], seeds: Iterable[Row] = (),
             covers: Callable[[Row], Set[Pair]] = row_pairs) -> List[Row]:
    """Rows (the ``seeds`` first) whose ``covers`` together hold every pair of ``factors``' values.

    ``covers(row)``: the pairs a row really exercises (all of them by default; a row the engine
    refuses exercises only the pairs of the value it refuses). Greedy: each new row starts from the
    first pair not yet covered, then takes, factor by factor, the value that covers the most new
    pairs with the values already chosen (ties: the first value), as in the allpairs/IPO method.
    """
    names = sorted(factors)
    rows = [dict(s) for s in seeds]
    todo = all_pairs(factors)
    for r in rows:
        todo -= covers(r)
    while todo:
        first = min(todo, key=lambda p: (names.index(p[0][0]), names.index(p[1][0]),
                                         factors[p[0][0]].index(p[0][1]), factors[p[1][0]].index(p[1][1])))
        (fa, va), (fb, vb) = first
        row: Row = {fa: va, fb: vb}
        for name in names:
            if name in row:
                continue
            row[name] = max(factors[name], key=lambda v: (        # the first pair stays exercised
                first in covers({**row, name: v}), len(covers({**row, name: v}) & todo), -factors[name].index(v)))
        gained = covers(row) & todo
        if not gained:
            raise ValueError(f"no row covers {(fa, va), (fb, vb)} (check covers())")
        todo -= gained
        rows.append(row)
    return rows
