"""Keras models of the engine. Submodules import TensorFlow; this package does not.

``recsys.models.registry.get(name)`` returns the model's :class:`~recsys.models.registry.ModelTask`.
"""
