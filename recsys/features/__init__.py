"""A dataset's features: ``spec`` reads and checks feature_spec.yaml (channels, files, cardinalities).

Imports nothing else of recsys, so the data readers, the configuration and the placement all stand on
it (``python -m recsys.features.spec`` checks a dataset's spec)."""
