"""The words a job request is made of (job kinds, models, datasets, binding modes, ...).

Their one home: the CLI builds its subcommands from KINDS without importing the request layer,
and the request and profile layers validate against the same tuples.
"""

KINDS = ("train", "evaluate", "predict", "benchmark", "preprocess")
MODELS = ("dlrm", "wide_deep", "ncf")
DATASETS = ("criteo", "movielens", "outbrain", "tabular")
PAYLOADS = ("recsys", "hello", "collectives")   # collectives: the fabric micro-benchmark
PREPROCESS_MODES = ("single", "array", "multinode")
# Preprocessing engines: Spark (every dataset) and NVTabular (`preproc <dataset> run --engine nvtabular`).
PREPROCESS_ENGINES = ("spark", "nvtabular")
NVTABULAR_DATASETS = ("criteo", "outbrain", "tabular")
# Datasets whose only engine is NVTabular: --engine defaults to it (`preproc tabular`: your own tables,
# described by a YAML given after `--` as --config FILE).
NVTABULAR_ONLY_DATASETS = ("tabular",)
BIND_MODES = ("exclusive", "numa", "interleave", "off")
MODEL_DATASET = {"dlrm": "criteo", "wide_deep": "outbrain", "ncf": "movielens"}
