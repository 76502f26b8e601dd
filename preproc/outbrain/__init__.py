"""Outbrain Click Prediction tables -> Wide & Deep parquet.

``cli`` (the stages on the command line) -> ``pipeline`` (the Spark engine) and
``nvt`` (the NVTabular engine), which build the same dataset from ``tables`` (the
Kaggle input tables) and ``features`` (the feature sets); ``generate`` writes
synthetic tables.
"""
