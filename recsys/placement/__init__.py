"""Placement: which embedding table (or column slice of one) lives on which rank, decided before
TensorFlow starts. The one place the word names:

* ``tables``: what a table and a group of them are, the unit placed (each model's groups come from
  recsys.models.embedding_tables, the one builder of a model's table list);
* ``planner``: plans: the memory-balanced placement of one table list on the ranks (and NVIDIA
  distributed-embeddings' own layout, reproduced);
* ``decision``: decides: the run's one placement, every group's plan and the memory check made on
  those plans, carried in the TrainConfig.

``python -m recsys.place_tables`` prints the decision; ``python -m recsys.plan_tables`` gives it as
JSON for N ranks. Pure Python that imports nothing else of recsys: ``import recsys.placement.decision``
loads no TensorFlow, and the embedding layers (recsys.embeddings) use its plans as they are.
"""
