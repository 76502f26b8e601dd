"""Your own table (CSV or parquet) -> feature-spec dataset for DLRM, Wide & Deep or NCF.

``python -m preproc tabular <stage>``:

``run --input IN --config FILE --output OUT``
    read, split, fit the NVTabular workflow on the training rows, write the dataset
    (preproc.tabular.nvt; the YAML format is in preproc.tabular.config).
``apply --dataset OUT --input NEW --output OUT2``
    the saved workflow of OUT applied to new rows with the same columns (the label
    column may be left out: ``labels: false``, for ``--run-mode predict``): a dataset
    with one mapping, ``test``, and OUT's ids and statistics.

The only engine is NVTabular (``--engine nvtabular``, the default); it runs on CPU
(pandas), on the node's GPUs (cudf, ``--device``), or on the dask cluster of a
multinode job (``$RECSYS_DASK_SCHEDULER_FILE``, from slurm/dask-cluster.sh).
Config, input and output are checked before any data is read.
"""
from __future__ import annotations

import argparse
import json
import logging

from preproc.errors import PreprocError

DESCRIPTION = "your own CSV/parquet table + a small YAML -> DLRM / Wide & Deep / NCF dataset (NVTabular)"
EXAMPLES = {
    "run": "python -m preproc tabular run --input adult.parquet --config adult.yaml --output adult-data",
    "apply": "python -m preproc tabular apply --dataset adult-data --input new-rows.csv --output new-data",
}
ENGINES = ("nvtabular",)
log = logging.getLogger("preproc.tabular")


def add_arguments(stages: argparse._SubParsersAction) -> None:
    from preproc.dataio.bad_rows import add_bad_rows_argument, add_max_bad_rows_argument
    from preproc.dataio.output import add_output_arguments

    run = stages.add_parser("run", help="table + YAML config -> train/test parquet, feature specs, fitted workflow")
    run.add_argument("--input", required=True, help="a CSV or parquet file, or a directory of them")
    run.add_argument("--config", required=True, help="the YAML naming the label and feature columns")
    add_output_arguments(run)
    _common(run)
    add_bad_rows_argument(run)
    add_max_bad_rows_argument(run)
    run.set_defaults(func=cmd_run)

    apply = stages.add_parser("apply", help="new rows through a dataset's saved workflow -> a test-only dataset")
    apply.add_argument("--dataset", required=True, help="a dataset written by `tabular run` (its workflow/)")
    apply.add_argument("--input", required=True,
                       help="CSV or parquet rows with the same columns (without the label: a dataset to predict on)")
    add_output_arguments(apply)
    _common(apply)
    add_bad_rows_argument(apply)
    add_max_bad_rows_argument(apply)
    apply.set_defaults(func=cmd_apply)


def _common(parser: argparse.ArgumentParser) -> None:
    from preproc.runtime.dask_cluster import DEVICES

    parser.add_argument("--num-files", type=int, default=1,
                        help="parquet files per mapping, at least the number of training ranks (default 1)")
    group = parser.add_argument_group("engine", "an NVTabular workflow on dask (docs/preprocessing.md)")
    group.add_argument("--engine", choices=ENGINES, default="nvtabular", help="nvtabular (the only engine)")
    group.add_argument("--device", choices=DEVICES, default="auto",
                       help="auto (GPU workers when a GPU and cudf are found, else CPU), cpu or gpu")
    group.add_argument("--nodes", type=int, default=None,
                       help="nodes of a multinode job (its dask cluster is found by $RECSYS_DASK_SCHEDULER_FILE)")
    group.add_argument("--node-cores", type=int, default=None, help="cores for the CPU runtime (default: this node's)")
    group.add_argument("--node-memory-gb", type=float, default=None, help="memory per node (default: this node's)")
    group.add_argument("--dry-run", action="store_true", help="check the flags and the config, print the plan")


def _runtime(args):
    from preproc.runtime import dask_cluster
    from preproc.runtime.spark import detect_node

    if args.num_files < 1:
        raise PreprocError(f"--num-files: must be >= 1, got {args.num_files}")
    if not 0 <= args.max_bad_rows <= 1:
        raise PreprocError(f"--max-bad-rows: a share of the rows in [0, 1], got {args.max_bad_rows:g}")
    cores, memory_gb = detect_node()
    return dask_cluster.detect(args.device, args.node_cores or cores, args.node_memory_gb or memory_gb)


# What importing NVTabular prints on a CPU node, every run, none of it the user's business: merlin's
# warnings that its optional PyTorch and Triton dtype maps did not load (merlin/dtypes/mappings/
# torch.py, triton.py), and TensorFlow's INFO lines (oneDNN, CPU instructions), which merlin's import
# of TensorFlow prints.
IMPORT_NOISE = r"(PyTorch|Triton) dtype mappings did not load"


def _import_nvt():
    """NVTabular and the pipeline, imported without the noise above: the warnings are ignored for
    this import only, and TensorFlow's C++ INFO lines are hidden unless TF_CPP_MIN_LOG_LEVEL is set
    (TensorFlow reads it once, at its first log line, which its import prints)."""
    import os
    import warnings

    set_level = "TF_CPP_MIN_LOG_LEVEL" not in os.environ
    if set_level:
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "1"
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=IMPORT_NOISE, category=UserWarning)
            import nvtabular  # noqa: F401

            from preproc.tabular import nvt
    except ImportError as exc:
        raise PreprocError(f"--engine nvtabular: {exc.name or exc} does not import "
                           "(pip install '.[nvtabular]')") from None
    finally:
        if set_level:
            del os.environ["TF_CPP_MIN_LOG_LEVEL"]     # child processes see the user's environment
    return nvt


def cmd_run(args) -> int:
    from preproc.dataio.output import check_output_free, input_files
    from preproc.tabular.config import load_config

    config = load_config(args.config)
    files = input_files(args.input)
    check_output_free(args.output, args.overwrite)
    runtime = _runtime(args)
    plan = [f"tabular: {len(files)} input file(s) -> {args.output} (models {', '.join(config.models)}, "
            f"{args.num_files} file(s) per mapping)", f"engine nvtabular: {runtime.describe()}",
            f"split: {config.split_method}, test fraction {config.test_fraction}, seed {config.seed}"]
    if args.dry_run:
        print("\n".join(plan))
        return 0
    nvt = _import_nvt()
    for line in plan:
        log.info("%s", line)
    report = nvt.run(args.input, config, args.output, num_files=args.num_files, overwrite=args.overwrite,
                     bad_row_policy=args.bad_rows, runtime=runtime, max_bad_rows=args.max_bad_rows)
    print(json.dumps({k: report[k] for k in ("rows", "cardinalities", "bad_rows", "models", "warnings", "timings_s")}))
    return 0


def cmd_apply(args) -> int:
    from preproc.dataio.output import check_output_free, input_files

    input_files(args.input)
    check_output_free(args.output, args.overwrite)
    runtime = _runtime(args)
    if args.dry_run:
        print(f"tabular apply: {args.dataset} workflow on {args.input} -> {args.output}; {runtime.describe()}")
        return 0
    nvt = _import_nvt()
    report = nvt.apply(args.dataset, args.input, args.output, num_files=args.num_files, overwrite=args.overwrite,
                       bad_row_policy=args.bad_rows, runtime=runtime, max_bad_rows=args.max_bad_rows)
    print(json.dumps(report))
    return 0
