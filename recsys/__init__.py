"""The training engine, one process per rank.

``train`` (the entry point) checks the command line into a frozen ``config`` before TensorFlow
starts, the embedding placement decided in it (``embeddings``); ``engine`` runs the loop over a
``models`` Task; ``data`` reads the datasets; ``checkpoint`` / ``sharded_checkpoint`` save and
restore; ``distributed`` wraps Horovod. ``placement`` is a command: where a model's tables would live.
"""
