"""Embedding tables: where they live, and the layers that hold them.

Pure Python, planned before TensorFlow starts:

* ``tables``: what a table and a group of them are (each model's groups come from
  recsys.models.embedding_tables, the one builder of a model's table list);
* ``planner``: the memory-balanced placement of one table list on the ranks;
* ``placement``: the run's one decision, every group's plan and the memory check made on those
  plans, carried in the TrainConfig (``python -m recsys.placement`` prints it).

TensorFlow layers, built from those:

* ``group``: EmbeddingGroup, one group's tables replicated or model parallel (our alltoall layer,
  or NVIDIA distributed-embeddings when ``--embedding-implementation`` names it);
* ``de_adapter``: distributed-embeddings through its documented contract (tape, broadcast,
  combiner, equal batches, whole tables in and out);
* ``alltoall``: the model-parallel layer on Horovod alltoall, holding the placement's plan as it is;
* ``seeding``: table values from (seed, table, column, block of rows), identical on every rank;
* ``combine``: multi-hot rows summed or averaged;
* ``lockstep``: ranks stepping through evaluation together.

Nothing here imports recsys.models, and this package imports nothing itself:
``import recsys.embeddings.placement`` loads no TensorFlow.
"""
