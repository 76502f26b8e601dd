"""What the configured columns of a user's table hold, checked in the scan's one pass over the
good rows, before anything is fitted: a column without a single value is refused (it teaches
nothing, and a numerical one gets NaN statistics in the feature spec); a numerical column with one
value is refused for the same reason; a constant numerical column and a categorical column with
about one distinct value per row (an id: the test rows' values are never seen in training) are
warned about, since a run can still be meant that way."""
from __future__ import annotations

from preproc.errors import PreprocError
from preproc.tabular.config import TabularConfig

ID_LIKE_SHARE = 0.9     # distinct values per row above this share: an id column
ID_LIKE_MIN_ROWS = 50   # below this a table is too small to tell an id from a rich categorical


def tasks(good, config: TabularConfig) -> dict:
    """The dask figures :func:`check` reads, to compute in the scan's pass: per categorical column
    its values and approximate distinct values, per numerical column its values, min and max."""
    out = {}
    for c in config.categorical:
        values = good[c.column].dropna()
        out[c.column] = {"kind": "categorical", "count": values.count(), "distinct": values.nunique_approx()}
    for n in config.numerical:
        values = good[n.column]
        out[n.column] = {"kind": "numerical", "count": values.count(), "min": values.min(), "max": values.max()}
    return out


def check(figures: dict, rows: int, config: TabularConfig) -> list[str]:
    """One line (PreprocError) for a column that cannot train; the warnings for the others' oddities."""
    warnings = []
    for column, f in figures.items():
        kind, count = f["kind"], int(f["count"])
        key = "categorical" if kind == "categorical" else "numerical"
        if count == 0:
            raise PreprocError(f"{config.source}: {kind} column {column!r} has no value in any of the {rows} "
                               f"usable rows (every one missing): remove it from `{key}`")
        if kind == "numerical":
            if count == 1:
                raise PreprocError(f"{config.source}: numerical column {column!r} has a value in 1 of {rows} "
                                   f"usable rows: nothing to scale or learn from: remove it from `numerical`")
            if float(f["min"]) == float(f["max"]):
                warnings.append(f"numerical column {column!r} is constant ({float(f['min']):g} in all {count} "
                                f"rows with a value): it carries no information (remove it from `numerical`)")
        elif count >= ID_LIKE_MIN_ROWS and int(f["distinct"]) >= ID_LIKE_SHARE * count:
            warnings.append(f"categorical column {column!r} has about {int(f['distinct'])} distinct values in "
                            f"{count} rows, about one per row (an id?): test rows' values are unseen in "
                            "training and all get id 0; remove it from `categorical` unless it repeats")
    return warnings
