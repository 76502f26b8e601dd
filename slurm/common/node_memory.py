"""How much of a node's memory the workers started inside an allocation may fill together.

Why here: the submission layer (``jobs``: the multinode NVTabular plan hands slurm/dask-cluster.sh
the node's share), the preprocessing runtimes (``preproc.runtime``: Spark executors with their
driver, dask workers) and the shell helper ``default_worker_memory_gb`` of
slurm/allocation-cluster.sh (its twin, held equal by tests/preproc/test_dask_runtime_memory.py)
must agree, and ``jobs`` may not import ``preproc``. The rest of the node is left to the OS, the
job's driver and pinned memory. Pure, stdlib only.
"""

NODE_MEMORY_PERCENT = 85
NODE_MEMORY_SHARE = NODE_MEMORY_PERCENT / 100
