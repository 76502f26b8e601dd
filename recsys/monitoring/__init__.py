"""What a run tells the people watching it: the JSON-lines engine log (``logger``), TensorBoard
scalars (``tensorboard``), the no-progress watchdog (``watchdog``) and the provenance record of
what ran where (``provenance``). Each imports nothing else of recsys."""
