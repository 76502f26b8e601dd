"""The engine's models: Keras models and the Tasks that train them.

``tasks.TASKS[name]`` is a model's Task (its model, optimizers, data and metric); ``dlrm``,
``wide_deep`` and ``ncf`` are the Keras models and import TensorFlow. ``defaults`` (reference
sizes) and ``embedding_tables`` (the one builder of a model's table list) are pure Python, read
before TensorFlow starts; this package imports nothing itself.
"""
