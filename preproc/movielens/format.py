"""The MovieLens ratings file layouts (ml-1m, ml-20m): file name, separator, header, columns.

Shared by the pipeline (preproc.movielens.pipeline reads them) and the synthetic
generator (preproc.movielens.generate writes them); pure Python.
"""
from __future__ import annotations

RATING_COLUMNS = [("user", "bigint", True), ("item", "bigint", True),
                  ("rating", "double", True), ("timestamp", "bigint", True)]
LAYOUTS = {  # format: (file name, separator, header line)
    "ml-1m": ("ratings.dat", "::", None),
    "ml-20m": ("ratings.csv", ",", "userId,movieId,rating,timestamp"),
}
