"""Criteo 1TB click logs -> DLRM split-binary dataset (command-line stages).

``python -m preproc criteo <stage>``:

``generate --out DIR [--rows N] [--days D] [--seed S]``
    small raw day files in the real layout (preproc.criteo.generate).
``dictionary --input IN --output OUT [--threshold T|col:T,...] [--days D] [rules]``
    value -> id tables (preproc.criteo.dictionary). The rules
    (``--dictionary-days all|train --train-order shuffle|input --seed S
    --numerical reference|clamp --spec-layout reference|combined``, defaults =
    NVIDIA's reference, docs/criteo.md) are recorded in dictionary.json and
    followed by the later stages.
``transform --output OUT [--shard I --num-shards N]``
    one array task: the day files of shard I (preproc.criteo.transform). I
    defaults to $RECSYS_TASK_INDEX, else $SLURM_ARRAY_TASK_ID; N to
    $RECSYS_TASK_COUNT, else $SLURM_ARRAY_TASK_COUNT, else 1.
``finalize --output OUT``
    assemble + verify + feature_spec.yaml + size report (preproc.criteo.finalize);
    needs no Spark.
``run --input IN --output OUT``
    the three stages in one Spark application (preproc.criteo.pipeline), or with
    ``--engine nvtabular`` one NVTabular workflow (preproc.criteo.nvt).

Intermediate results live in ``OUT.stages/`` (next to OUT) and are removed by
finalize (and by a failed ``run``, which never resumes from them). Every stage writes to a temporary directory, verifies it and renames
it, so re-running any stage (a failed or requeued array task) is safe. The
semantics (split, dictionary order, numerical formula, dtypes, shuffle) are in
preproc.criteo.layout.
"""
from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from preproc.criteo import layout, pipeline
from preproc.dataio.bad_rows import add_bad_rows_argument
from preproc.dataio.output import add_output_arguments, check_output_free, input_files
from preproc.errors import PreprocError
from preproc.runtime.spark import add_spark_arguments, settings_from_args

DESCRIPTION = "Criteo 1TB click logs -> DLRM split-binary dataset"
EXAMPLES = {
    "generate": "python -m preproc criteo generate --out /tmp/criteo_raw --rows 20000 --days 4 --seed 0",
    "dictionary": "python -m preproc criteo dictionary --input /data/criteo/raw --output /data/criteo/dlrm --threshold 15",
    "transform": "python -m preproc criteo transform --output /data/criteo/dlrm --shard 0 --num-shards 24",
    "finalize": "python -m preproc criteo finalize --output /data/criteo/dlrm",
    "run": "python -m preproc criteo run --input /tmp/criteo_raw --output /tmp/criteo_dlrm --threshold 3\n"
           "  python -m preproc criteo run --input /data/criteo/raw --output /data/criteo/dlrm --dry-run "
           "--nodes 4 --node-cores 80 --node-memory-gb 1500",
}
log = logging.getLogger("preproc.criteo")


def add_arguments(stages: argparse._SubParsersAction) -> None:
    gen = stages.add_parser("generate", help="write small Criteo-like raw day files")
    gen.add_argument("--out", required=True, help="directory for day_0 .. day_<D-1>")
    gen.add_argument("--rows", type=int, default=100_000, help="rows over all days (default 100000)")
    gen.add_argument("--days", type=int, default=24, help="day files (default 24, as the real set)")
    gen.add_argument("--seed", type=int, default=0, help="seed of the generated values (default 0)")
    gen.add_argument("--overwrite", action="store_true", help="replace day files already in --out")
    gen.set_defaults(func=cmd_generate)

    dictionary = stages.add_parser("dictionary", help="build the per-column dictionaries (array stage 1)")
    _input_arguments(dictionary)
    add_output_arguments(dictionary)
    _dictionary_arguments(dictionary)
    add_bad_rows_argument(dictionary)
    add_spark_arguments(dictionary)
    dictionary.set_defaults(func=cmd_dictionary)

    transform = stages.add_parser("transform", help="transform one shard of day files (array stage 2)")
    transform.add_argument("--input", default=None, help="optional: must be the dictionary stage's input")
    add_output_arguments(transform)
    transform.add_argument("--shard", type=int, default=None,
                           help="shard index (default $RECSYS_TASK_INDEX, else $SLURM_ARRAY_TASK_ID)")
    transform.add_argument("--num-shards", type=int, default=None,
                           help="shard count (default $RECSYS_TASK_COUNT, else $SLURM_ARRAY_TASK_COUNT, else 1)")
    add_bad_rows_argument(transform)
    add_spark_arguments(transform)
    transform.set_defaults(func=cmd_transform)

    finalize = stages.add_parser("finalize", help="assemble, verify and publish the dataset (array stage 3)")
    add_output_arguments(finalize)
    finalize.add_argument("--keep-stages", action="store_true", help="keep OUT.stages/ after publishing")
    finalize.set_defaults(func=cmd_finalize)

    run = stages.add_parser("run", help="dictionary + transform + finalize in one Spark application "
                                        "(or one NVTabular workflow with --engine nvtabular)")
    _input_arguments(run)
    add_output_arguments(run)
    _dictionary_arguments(run)
    run.add_argument("--keep-stages", action="store_true", help="keep OUT.stages/ after publishing")
    add_bad_rows_argument(run)
    add_spark_arguments(run)
    _engine_arguments(run)
    run.set_defaults(func=cmd_run)


def _input_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", required=True, help="directory of day_<d> files")
    parser.add_argument("--days", type=int, default=None,
                        help="use days 0..D-1 (default: every day file); the last one is split test/validation")


def _dictionary_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--threshold", default=str(layout.DEFAULT_THRESHOLD),
                        help="frequency threshold: values seen fewer than T times map to 0; global T and/or "
                             "per column col:T (cat_<i> or C<k>), e.g. '15,C3:2' (default 15)")
    parser.add_argument("--dictionary-days", choices=layout.DICTIONARY_DAYS, default="all",
                        help="count values over all days, the test day included (all, the reference) or the "
                             "training days only (train: no test-day leak)")
    parser.add_argument("--train-order", choices=layout.TRAIN_ORDERS, default="shuffle",
                        help="training rows shuffled, deterministic for --seed (shuffle, the reference) or in "
                             "input order (input)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the training-row shuffle (default 0)")
    parser.add_argument("--numerical", choices=tuple(layout.NUMERICAL_RULES), default="reference",
                        help="reference: ln(x+3), 0 if missing or x <= -3; clamp: ln(3+max(x,0)), missing = ln 3")
    parser.add_argument("--spec-layout", choices=layout.SPEC_LAYOUTS, default="reference",
                        help="reference: feature_spec.yaml with train/test (NVIDIA's loaders) + "
                             f"{layout.VALIDATION_SPEC}; combined: one spec with train/test/validation")


def _engine_arguments(parser: argparse.ArgumentParser) -> None:
    from preproc.runtime.dask_cluster import DEVICES

    group = parser.add_argument_group("engine", "--engine nvtabular: an NVTabular workflow on dask "
                                      "(docs/preprocessing.md); the cluster-shape flags above size it")
    group.add_argument("--engine", choices=ENGINES, default="spark",
                       help="spark (default: split-binary output) or nvtabular (parquet output + the fitted "
                            "workflow; needs pip install .[nvtabular])")
    group.add_argument("--device", choices=DEVICES, default="auto",
                       help="nvtabular: auto (GPU workers when a GPU and cudf are found, else CPU), cpu or gpu")
    group.add_argument("--part-rows", type=int, default=None,
                       help="nvtabular: at most this many rows per parquet file (default 1048576)")


ENGINES = ("spark", "nvtabular")


def rules_from_args(args) -> layout.Rules:
    return layout.Rules(dictionary_days=args.dictionary_days, train_order=args.train_order, seed=args.seed,
                        numerical=args.numerical, spec_layout=args.spec_layout)


def _env_int(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise PreprocError(f"${name}: {value!r} is not an integer") from None
    return None


def _shard_arguments(args) -> tuple[int, int]:
    shard = args.shard if args.shard is not None else _env_int("RECSYS_TASK_INDEX", "SLURM_ARRAY_TASK_ID")
    count = args.num_shards if args.num_shards is not None else _env_int("RECSYS_TASK_COUNT",
                                                                          "SLURM_ARRAY_TASK_COUNT")
    shard = 0 if shard is None else shard
    count = 1 if count is None else count
    if count < 1:
        raise PreprocError(f"--num-shards: must be >= 1, got {count}")
    if not 0 <= shard < count:
        raise PreprocError(f"--shard: {shard} is not in 0..{count - 1} (--num-shards {count})")
    return shard, count


def _plan(args) -> tuple[list[tuple[int, int, Path]] | None, int | None, list[int]]:
    """Checks that need no Spark: input days, thresholds, rules, output. Returns (files, last day, thresholds).

    A --dry-run checks only the flags: an input that is not here (yet) gives (None, None,
    thresholds), and an existing output is noted by the plan, not refused."""
    thresholds = layout.parse_thresholds(args.threshold)
    rules_from_args(args)
    if args.dry_run and not Path(args.input).exists():
        return None, None, thresholds
    days = layout.day_files(input_files(args.input), args.days)
    if not args.dry_run:
        check_output_free(args.output, args.overwrite)
    files = [(idx, day, path) for idx, (day, path) in enumerate(days)]
    return files, days[-1][0], thresholds


def _input_bytes(files) -> int | None:
    return None if files is None else sum(p.stat().st_size for _, _, p in files)


def _describe_files(args, files, last_day) -> list[str]:
    notes = []
    if Path(args.output).exists() and not args.overwrite:
        notes.append(f"note: --output {args.output} exists: the run needs --overwrite")
    if files is None:
        return notes + [f"input {args.input}: not here (days and input size unknown; the run checks them)"]
    train = [p.name for _, d, p in files if d < last_day]
    return notes + [f"train days 0..{last_day - 1}: {', '.join(train)}",
                    f"last day {last_day} ({files[-1][2].name}): first half test, second half validation"]


def cmd_generate(args) -> int:
    from preproc.criteo.generate import generate

    if args.rows < args.days:
        raise PreprocError(f"--rows: {args.rows} rows cannot fill {args.days} days")
    if args.days < 1:
        raise PreprocError(f"--days: must be >= 1, got {args.days}")
    paths = generate(args.out, args.rows, args.days, args.seed, args.overwrite)
    print(f"wrote {len(paths)} day files, {args.rows} rows, to {args.out}")
    return 0


def cmd_dictionary(args) -> int:
    from preproc.criteo.dictionary import build_dictionary
    from preproc.runtime.spark import session_or_plan

    files, last_day, thresholds = _plan(args)
    settings = settings_from_args(args, input_bytes=_input_bytes(files))
    spark = session_or_plan(settings, "criteo-dictionary", args.dry_run,
                            ["stage dictionary", f"thresholds {thresholds}", f"rules {rules_from_args(args)}"]
                            + _describe_files(args, files, last_day))
    if spark is None:
        return 0
    build_dictionary(spark, layout.Staging(args.output), files, last_day, thresholds, args.bad_rows,
                     rules_from_args(args))
    return 0


def cmd_transform(args) -> int:
    from preproc.criteo.dictionary import load_dictionary_meta
    from preproc.criteo.transform import transform_shard
    from preproc.runtime.spark import session_or_plan

    shard, count = _shard_arguments(args)
    staging = layout.Staging(args.output)
    meta = load_dictionary_meta(staging)
    if args.input is not None:
        inputs = {str(Path(f["path"]).parent.resolve()) for f in meta["files"]}
        if str(Path(args.input).resolve()) not in inputs:
            raise PreprocError(f"--input: {args.input}: the dictionary in {staging.dictionary} was built from "
                               f"{', '.join(sorted(inputs))}")
    mine = [f for f in meta["files"] if layout.shard_of(f["file_idx"], count) == shard]
    settings = settings_from_args(args, input_bytes=sum(f["bytes"] for f in mine))
    paths = ", ".join(f["path"] for f in mine) or "no files"
    spark = session_or_plan(settings, f"criteo-transform-{shard}-of-{count}", args.dry_run,
                            [f"stage transform shard {shard} of {count}: {paths}"])
    if spark is None:
        return 0
    transform_shard(spark, staging, meta, shard, count, args.bad_rows)
    return 0


def cmd_finalize(args) -> int:
    from preproc.criteo.finalize import finalize, format_report

    check_output_free(args.output, args.overwrite)
    report = finalize(layout.Staging(args.output), args.overwrite, args.keep_stages)
    print(format_report(report))
    return 0


def cmd_run(args) -> int:
    from preproc.criteo.finalize import format_report
    from preproc.runtime.spark import session_or_plan

    if getattr(args, "engine", "spark") == "nvtabular":
        return cmd_run_nvtabular(args)
    files, last_day, thresholds = _plan(args)
    settings = settings_from_args(args, input_bytes=_input_bytes(files))
    spark = session_or_plan(settings, "criteo-run", args.dry_run,
                            ["stages dictionary, transform (1 shard), finalize", f"thresholds {thresholds}",
                             f"rules {rules_from_args(args)}"] + _describe_files(args, files, last_day))
    if spark is None:
        return 0
    report = pipeline.run(spark, files, last_day, thresholds, args.output, overwrite=args.overwrite,
                          bad_row_policy=args.bad_rows, keep_stages=args.keep_stages, rules=rules_from_args(args))
    print(format_report(report))
    return 0


def cmd_run_nvtabular(args) -> int:
    """``run --engine nvtabular``: the same checks first, then preproc.criteo.nvt on the chosen dask runtime."""
    from preproc.runtime import dask_cluster
    from preproc.runtime.spark import detect_node

    files, last_day, thresholds = _plan(args)
    if args.part_rows is not None and args.part_rows < 1:
        raise PreprocError(f"--part-rows: must be >= 1, got {args.part_rows}")
    cores, memory_gb = detect_node()
    runtime = dask_cluster.detect(args.device, args.node_cores or cores, args.node_memory_gb or memory_gb)
    plan = [f"engine nvtabular: {runtime.describe()}", f"thresholds {thresholds}", f"rules {rules_from_args(args)}"]
    plan += _describe_files(args, files, last_day)
    if args.dry_run:
        print("\n".join(plan))
        return 0
    try:
        from preproc.criteo import nvt
        import nvtabular  # noqa: F401
    except ImportError as exc:
        raise PreprocError(f"--engine nvtabular: {exc.name or exc} does not import "
                           "(pip install '.[nvtabular]')") from None
    for line in plan:
        log.info("%s", line)
    report = nvt.run(files, last_day, thresholds, args.output, overwrite=args.overwrite,
                     bad_row_policy=args.bad_rows, rules=rules_from_args(args), runtime=runtime,
                     part_rows=args.part_rows or nvt.PART_ROWS)
    print(nvt.format_report(report))
    return 0

