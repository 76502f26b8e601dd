"""MovieLens ml-1m / ml-20m ratings -> NCF (user, item) parquet.

``cli`` (the stages on the command line) -> ``pipeline`` (the PySpark job) and
``generate`` (synthetic ratings), which share ``format`` (the file layouts).
"""
