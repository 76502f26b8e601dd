"""Where a stage runs, shared by the datasets: Spark settings and session from the node
shape (``spark``, with the GPU discovery script ``gpu-discovery.sh``) and the dask runtime
of the NVTabular engines (``dask_cluster``) and the operators of their fitted workflows
(``workflow_ops``). Imports only ``preproc.errors``; pyspark and
dask are imported when a stage really starts."""
