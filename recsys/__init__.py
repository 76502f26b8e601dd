"""The training engine, one process per rank.

``train`` (the entry point) checks the command line (``configuration``) into a frozen TrainConfig
before TensorFlow starts, the embedding placement decided in it (``placement``); ``engine`` runs
the loop over a ``models`` Task whose tables the ``embeddings`` layers hold; ``data`` reads the
datasets (``features``: their spec); ``checkpoints`` save and restore; ``runtime`` is the machine
and Horovod; ``monitoring`` the log, TensorBoard and the watchdog. ``place_tables`` and
``plan_tables`` are commands: where a model's tables would live, printed or as JSON.
"""
