"""The Python every layer of the toolkit shares: ``jobs`` (login node), ``recsys`` and ``preproc``
(inside a job) import it, and it imports none of them (contract ``slurm-is-a-leaf``, setup.cfg).

Named ``common`` for what it is, the code in common to all three; it lives in ``slurm/`` because
that directory is already shipped beside every job (a job runs the toolkit's own ``slurm/``).
Pure Python, the standard library and pyyaml only: ``errors`` (the one base exception),
``environment`` (every ``RECSYS_*`` variable), ``yamlfile`` (the YAML reader with limits),
``checker`` (every mistake of a file a user wrote), ``cpulist``, ``hostlist``, ``node_memory``,
``spark_layout`` and ``atomicfile``. Scripts a job runs by path (``slurm/hwsample.py``,
``slurm/sparkrapids.py``) stay beside the shell helpers.
"""
