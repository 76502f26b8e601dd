"""Preprocessing of recommender datasets into feature-spec datasets for recsys-train.

Layers, each importing only the ones below it (imports inside functions included):

* ``preproc.cli`` (and ``__main__``): ``python -m preproc <dataset> <stage>``;
  finds a dataset's command line by name (``DATASETS``), so it imports none.
* ``preproc.criteo``, ``preproc.movielens``, ``preproc.outbrain``: one package
  per dataset (its command line, pipeline, input layout, generator and
  NVTabular engine), independent of each other; ``preproc.tabular``: your own
  CSV or parquet table described by a small YAML (NVTabular).
* ``preproc.dataio`` (input checks, atomic outputs, text and parquet IO, bad-row
  accounting) and ``preproc.runtime`` (Spark settings and session, the dask
  runtime of NVTabular): what the datasets share, independent of each other.
* ``preproc.errors``: the one user-facing exception.
"""
