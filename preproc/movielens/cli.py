"""``python -m preproc movielens <stage>``: the MovieLens stages on the command line.

``generate`` writes small synthetic ratings (preproc.movielens.generate);
``run`` checks the flags and the input before Spark starts, then runs the
pipeline (preproc.movielens.pipeline, whose docstring says what it computes).
"""
from __future__ import annotations

import argparse

from preproc.errors import PreprocError
from preproc.movielens.format import LAYOUTS
from preproc.movielens.generate import generate
from preproc.movielens.pipeline import locate_ratings, run

DESCRIPTION = "MovieLens ml-1m / ml-20m ratings -> NCF (user, item) parquet + feature_spec.yaml"
EXAMPLES = {
    "generate": "python -m preproc movielens generate --out /tmp/ml-raw --users 2000 --items 1000 --format ml-20m",
    "run": "python -m preproc movielens run --input /tmp/ml-raw --output /tmp/ml-ncf --num-files 2",
}


def add_arguments(stages) -> None:
    from preproc.dataio.bad_rows import add_bad_rows_argument
    from preproc.dataio.output import add_output_arguments
    from preproc.runtime.spark import add_spark_arguments

    gen = stages.add_parser("generate", help="write a small synthetic ratings file in the ml-1m or ml-20m layout")
    gen.add_argument("--out", required=True, help="directory to write ratings.dat / ratings.csv into")
    gen.add_argument("--users", type=int, default=1000, help="users (default 1000)")
    gen.add_argument("--items", type=int, default=500, help="items (default 500)")
    gen.add_argument("--format", choices=sorted(LAYOUTS), default="ml-1m",
                     help="ml-1m: ratings.dat (::-separated); ml-20m: ratings.csv (default ml-1m)")
    gen.add_argument("--seed", type=int, default=0, help="seed of the generated ratings (default 0)")
    gen.set_defaults(func=_generate)

    run_p = stages.add_parser("run", help="ratings -> NCF train/test parquet + feature_spec.yaml")
    run_p.add_argument("--input", required=True, help="ratings.dat / ratings.csv or a directory holding one")
    add_output_arguments(run_p)
    run_p.add_argument("--format", choices=sorted(LAYOUTS), default=None,
                       help="input layout (default: from the file name, .csv -> ml-20m)")
    run_p.add_argument("--min-ratings", type=int, default=20, help="drop users with fewer ratings (default 20)")
    run_p.add_argument("--test-negatives", type=int, default=0,
                       help="also write N sampled negatives per test user (default 0: recsys samples its own)")
    run_p.add_argument("--num-files", type=int, default=8,
                       help="parquet files per mapping, at least the number of training ranks (default 8)")
    run_p.add_argument("--seed", type=int, default=0, help="seed of the test negatives")
    run_p.add_argument("--validation", action="store_true",
                       help="leave two out: each user's second latest item is a validation positive, which "
                            "training judges its epochs on (the test set is then evaluated once)")
    add_bad_rows_argument(run_p)
    add_spark_arguments(run_p)
    run_p.set_defaults(func=_run)


def _generate(args: argparse.Namespace) -> int:
    try:
        path = generate(args.out, users=args.users, items=args.items, fmt=args.format, seed=args.seed)
    except ValueError as exc:
        raise PreprocError(str(exc)) from None
    print(path)
    return 0


def _run(args: argparse.Namespace) -> int:
    from preproc.dataio.output import check_output_free
    from preproc.runtime.spark import session_or_plan, settings_from_args

    if args.min_ratings < 1:
        raise PreprocError(f"--min-ratings: must be >= 1, got {args.min_ratings}")
    if args.num_files < 1:
        raise PreprocError(f"--num-files: must be >= 1, got {args.num_files}")
    if args.test_negatives < 0:
        raise PreprocError(f"--test-negatives: must be >= 0, got {args.test_negatives}")
    path, fmt = locate_ratings(args.input, args.format)
    check_output_free(args.output, args.overwrite)
    settings = settings_from_args(args)
    spark = session_or_plan(settings, "preproc-movielens", args.dry_run,
                            [f"plan: movielens {fmt} {path} -> {args.output} (min_ratings={args.min_ratings}, "
                             f"num_files={args.num_files}, test_negatives={args.test_negatives}, "
                             f"validation={args.validation})"])
    if spark is None:
        return 0
    run(spark, path, args.output, fmt, args.min_ratings, args.test_negatives, args.num_files, args.seed,
        args.bad_rows, args.overwrite, validation=args.validation)
    return 0
