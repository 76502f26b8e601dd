"""``python -m preproc outbrain <stage>``: the Outbrain stages on the command line.

``generate`` writes small synthetic Kaggle tables (preproc.outbrain.generate);
``run`` checks the flags, the tables and the output before anything starts, then
runs the Spark engine (preproc.outbrain.pipeline, whose docstring says what it
computes) or the NVTabular one (preproc.outbrain.nvt, ``--engine nvtabular``).
"""
from __future__ import annotations

import argparse

from preproc.errors import PreprocError
from preproc.outbrain.features import (DEFAULT_FEATURE_SET, FEATURE_SETS, MULTIHOT, REFERENCE_BUCKETS,
                                       REFERENCE_MULTIHOT, default_sizes)
from preproc.outbrain.generate import generate
from preproc.outbrain.pipeline import run
from preproc.outbrain.tables import locate_tables

DESCRIPTION = "Outbrain Click Prediction tables -> Wide & Deep parquet + feature_spec.yaml"
EXAMPLES = {
    "generate": "python -m preproc outbrain generate --out /tmp/ob-raw --displays 5000 --seed 0",
    "run": "python -m preproc outbrain run --input /tmp/ob-raw --output /tmp/ob-wd --num-files 4",
}


# ---------------------------------------------------------------- flag values (no Spark)
def parse_sizes(text: str | None, defaults: dict, flag: str) -> dict:
    """'name=N,name=N' -> defaults updated; one-line error naming the flag."""
    sizes = dict(defaults)
    for item in filter(None, (text or "").split(",")):
        name, sep, value = item.partition("=")
        if not sep or name.strip() not in defaults or not value.strip().isdigit() or int(value) < 2:
            raise PreprocError(f"{flag}: bad entry {item!r} (expected name=N with N >= 2, names: "
                               f"{', '.join(sorted(defaults))})")
        sizes[name.strip()] = int(value)
    return sizes


# ---------------------------------------------------------------- command line
def add_arguments(stages) -> None:
    from preproc.dataio.bad_rows import add_bad_rows_argument
    from preproc.dataio.output import add_output_arguments
    from preproc.runtime.spark import add_spark_arguments

    gen = stages.add_parser("generate", help="write small synthetic Kaggle tables (all eight CSVs)")
    gen.add_argument("--out", required=True, help="directory for the CSV tables")
    gen.add_argument("--displays", type=int, default=2000, help="number of displays (default 2000)")
    gen.add_argument("--seed", type=int, default=0, help="seed of the generated tables (default 0)")
    gen.set_defaults(func=_generate)

    run_p = stages.add_parser("run", help="Kaggle tables -> Wide & Deep train/test parquet + feature_spec.yaml")
    run_p.add_argument("--input", required=True, help="directory holding the Kaggle CSV tables")
    add_output_arguments(run_p)
    run_p.add_argument("--num-files", type=int, default=8,
                       help="parquet files per mapping, at least the number of training ranks (default 8)")
    run_p.add_argument("--split-days", type=int, default=11,
                       help="days before this one are split train/eval, later days all eval (default 11)")
    run_p.add_argument("--train-fraction", type=float, default=0.8, help="train share of early days (default 0.8)")
    run_p.add_argument("--seed", type=int, default=0, help="seed of the split and the feature hashing")
    add_engine_argument(run_p)
    run_p.add_argument("--feature-set", choices=FEATURE_SETS, default=DEFAULT_FEATURE_SET,
                       help="reference: NVIDIA's W&D recipe set (13 numerical, 13 one-hot, 3 multi-hot; default); "
                            "legacy: 19 numerical, 13 one-hot, 6 multi-hot")
    run_p.add_argument("--ctr-min-views", type=int, default=None,
                       help="legacy set: views below which CTR is the prior (default 5)")
    run_p.add_argument("--ctr-smoothing", type=float, default=None,
                       help="legacy set: prior pseudo-views of the CTR (default 10)")
    run_p.add_argument("--buckets", default=None, metavar="NAME=N,...",
                       help="hash buckets per one-hot feature (reference defaults: " +
                            ", ".join(f"{k}={v}" for k, v in REFERENCE_BUCKETS.items()) + ")")
    run_p.add_argument("--hotness", default=None, metavar="NAME=H,...",
                       help="max_hotness per multi-hot feature (reference defaults: " +
                            ", ".join(f"{k}={v[1]}" for k, v in REFERENCE_MULTIHOT.items()) + ")")
    run_p.add_argument("--multihot-buckets", default=None, metavar="NAME=N,...",
                       help="hash buckets per multi-hot feature (reference defaults: " +
                            ", ".join(f"{k}={v[0]}" for k, v in REFERENCE_MULTIHOT.items()) + ")")
    add_bad_rows_argument(run_p)
    add_spark_arguments(run_p)
    run_p.set_defaults(func=_run)


def _generate(args: argparse.Namespace) -> int:
    try:
        generate(args.out, displays=args.displays, seed=args.seed)
    except ValueError as exc:
        raise PreprocError(str(exc)) from None
    print(args.out)
    return 0


ENGINES = ("spark", "nvtabular")


def add_engine_argument(parser) -> None:
    from preproc.runtime.dask_cluster import DEVICES

    parser.add_argument("--engine", choices=ENGINES, default="spark",
                        help="preprocessing engine: spark (default) or nvtabular (an nvtabular.Workflow, "
                             "saved next to the data); both build the same dataset")
    parser.add_argument("--device", choices=DEVICES, default="auto",
                        help="nvtabular: auto (GPU workers when a GPU and cudf are found, else CPU), cpu or gpu")


def multihot_from_args(hotness: str | None, mh_buckets: str | None, defaults: dict | None = None) -> dict:
    defaults = MULTIHOT if defaults is None else defaults
    h = parse_sizes(hotness, {k: v[1] for k, v in defaults.items()}, "--hotness")
    b = parse_sizes(mh_buckets, {k: v[0] for k, v in defaults.items()}, "--multihot-buckets")
    return {k: (b[k], h[k]) for k in defaults}


def _run(args: argparse.Namespace) -> int:
    from preproc.dataio.output import check_output_free

    if args.num_files < 1:
        raise PreprocError(f"--num-files: must be >= 1, got {args.num_files}")
    if not 0.0 < args.train_fraction < 1.0:
        raise PreprocError(f"--train-fraction: must be in (0, 1), got {args.train_fraction}")
    legacy_only = [f for f, v in (("--ctr-min-views", args.ctr_min_views), ("--ctr-smoothing", args.ctr_smoothing))
                   if v is not None]
    if args.feature_set != "legacy" and legacy_only:
        raise PreprocError(f"{legacy_only[0]}: applies to --feature-set legacy only (the reference set uses the "
                           "recipe's fixed CTR thresholds)")
    min_views = 5 if args.ctr_min_views is None else args.ctr_min_views
    smoothing = 10.0 if args.ctr_smoothing is None else args.ctr_smoothing
    if min_views < 0 or smoothing < 0:
        raise PreprocError("--ctr-min-views / --ctr-smoothing: must be >= 0")
    if args.engine == "nvtabular" and args.feature_set != "reference":
        raise PreprocError("--engine nvtabular: builds --feature-set reference only")
    default_buckets, default_multihot = default_sizes(args.feature_set)
    buckets = parse_sizes(args.buckets, default_buckets, "--buckets")
    multihot = multihot_from_args(args.hotness, args.multihot_buckets, default_multihot)
    paths = locate_tables(args.input)
    check_output_free(args.output, args.overwrite)
    plan = (f"plan: outbrain {args.input} -> {args.output} ({len(paths)} tables, engine={args.engine}, "
            f"feature_set={args.feature_set}, num_files={args.num_files}, split_days={args.split_days}, "
            f"train_fraction={args.train_fraction})")
    if args.engine == "nvtabular":
        return _run_nvtabular(args, plan, buckets, multihot)
    from preproc.runtime.spark import session_or_plan, settings_from_args

    spark = session_or_plan(settings_from_args(args), "preproc-outbrain", args.dry_run, [plan])
    if spark is None:
        return 0
    run(spark, args.input, args.output, args.num_files, args.split_days, args.train_fraction, args.seed,
        min_views, smoothing, buckets, multihot, args.bad_rows, args.overwrite, args.feature_set)
    return 0


def _run_nvtabular(args, plan: str, buckets: dict, multihot: dict) -> int:
    from preproc.runtime import dask_cluster
    from preproc.runtime.spark import detect_node

    cores, memory_gb = detect_node()
    runtime = dask_cluster.detect(args.device, args.node_cores or cores, args.node_memory_gb or memory_gb)
    if args.dry_run:
        print(f"# {plan}")
        print(f"# engine nvtabular: {runtime.describe()}")
        return 0
    try:
        from preproc.outbrain import nvt
    except ImportError as exc:
        raise PreprocError(f"--engine nvtabular: {exc.name or exc} is not installed (pip install .[nvtabular])") \
            from None
    nvt.run(args.input, args.output, args.num_files, args.split_days, args.train_fraction, args.seed,
            buckets, multihot, args.bad_rows, args.overwrite, runtime=runtime)
    return 0
