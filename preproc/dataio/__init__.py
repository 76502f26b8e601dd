"""Data in and out of a stage, shared by the datasets: input checks and atomic outputs
(``output``), delimited text in and parquet out (``textio``), bad-row accounting (``bad_rows``).
Imports only ``preproc.errors`` (pyspark and pyarrow inside functions)."""
