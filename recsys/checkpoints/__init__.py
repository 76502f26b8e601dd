"""Checkpoints: how a run's state reaches disk and comes back, whole or sharded over ranks.

* ``atomic``: the replicated checkpoint, written under a temporary name then published, and the
  attempt record a resumed job reads;
* ``sharded``: the model-parallel checkpoint (each rank its own table pieces), built on ``atomic``;
* ``pieces``: the table slices a sharded checkpoint holds, read back and assembled whole;
* ``graph``: the TF object graph a checkpoint's dense part is saved under;
* ``contents``: what a checkpoint holds by name, whatever its layout (tests and tools).
"""
