"""Bring-your-own tables (CSV or parquet + a small YAML) -> feature-spec datasets.

``cli`` (the stages) -> ``nvt`` (the NVTabular pipeline and ``apply``), which reads with
``read``, splits with ``split``, transforms with ``workflow`` and describes the output
with ``spec``; ``config`` is the YAML format (pure Python).
"""
