"""Embedding layers: the TensorFlow layers that hold a model's tables where recsys.placement put them.

The layers hold the plans recsys.placement made (its ``decision``), as they are.

The layers:

* ``group``: EmbeddingGroup, one group's tables replicated or model parallel (our alltoall layer,
  or NVIDIA distributed-embeddings when ``--embedding-implementation`` names it);
* ``de_adapter``: distributed-embeddings through its documented contract (tape, broadcast,
  combiner, equal batches, whole tables in and out);
* ``alltoall``: the model-parallel layer on Horovod alltoall, holding the placement's plan as it is;
* ``seeding``: table values from (seed, table, column, block of rows), identical on every rank;
* ``combine``: multi-hot rows summed or averaged;
* ``lockstep``: ranks stepping through evaluation together.

Nothing here imports recsys.models, and this package imports nothing itself.
"""
