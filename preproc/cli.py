"""``python -m preproc <dataset> <stage> [flags]``: dispatch to the dataset packages.

Dataset protocol (how a dataset plugs in)
-----------------------------------------
``DATASETS`` maps a dataset name to the dotted path of its command-line module
(``preproc.<dataset>.cli``). The module is
imported only when that dataset is named on the command line (so a broken or
missing dataset never hurts the others, and nothing imports pyspark until a
stage really runs). The module provides:

``add_arguments(stages)``
    ``stages`` is the ``argparse`` sub-parsers action of the dataset; add one
    sub-parser per stage (``generate``, ``run``, and for Criteo ``dictionary``,
    ``transform``, ``finalize``) and give each ``set_defaults(func=<callable>)``.
    The callable takes the parsed ``argparse.Namespace`` and returns an exit
    status (``None`` means 0).
``DESCRIPTION`` (optional)
    One line shown by ``python -m preproc --help`` (which lists every dataset and
    the ``help`` of each of its stages).
``EXAMPLES`` (optional)
    ``{stage: command line}``: shown at the end of that stage's ``--help``.

Stage functions raise ``preproc.errors.PreprocError`` for anything the user can
fix; ``main`` prints it as ONE line and exits 2 (``OutputError``, e.g. a full disk: exit 1). Shared flag groups live next to
the code they configure: ``preproc.runtime.spark.add_spark_arguments`` (cluster shape,
``--dry-run``), ``preproc.dataio.output.add_output_arguments`` (``--output``,
``--overwrite``) and ``preproc.dataio.bad_rows.add_bad_rows_argument``. Check inputs
and outputs (``preproc.dataio.output.input_files`` / ``check_output_free``) before
calling ``preproc.runtime.spark.get_session`` so bad input fails before Spark starts.

To add a dataset: write a package ``preproc/<name>/`` whose ``cli.py`` has
``add_arguments`` and add one line to ``DATASETS``. The dataset packages import
``preproc.dataio``, ``preproc.runtime`` and ``preproc.errors``, never each other
or this module (the layers are listed in ``preproc/__init__.py``).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from preproc.errors import PreprocError

DATASETS: dict[str, str] = {
    "criteo": "preproc.criteo.cli",
    "movielens": "preproc.movielens.cli",
    "outbrain": "preproc.outbrain.cli",
    "tabular": "preproc.tabular.cli",
}

log = logging.getLogger("preproc")


def _load(dataset: str):
    if dataset not in DATASETS:
        raise PreprocError(f"unknown dataset {dataset!r}: choose one of {', '.join(sorted(DATASETS))}")
    module = DATASETS[dataset]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module or module.startswith(f"{exc.name}."):  # the module or its dataset package
            raise PreprocError(f"dataset {dataset!r} is not available in this installation "
                               f"(module {module} missing)") from None
        raise


def build_parser(dataset: str) -> argparse.ArgumentParser:
    """The parser of one dataset: ``python -m preproc <dataset> <stage> ...``."""
    module = _load(dataset)
    parser = argparse.ArgumentParser(prog=f"python -m preproc {dataset}",
                                     description=getattr(module, "DESCRIPTION", None),
                                     epilog=f"each stage: python -m preproc {dataset} STAGE --help")
    stages = parser.add_subparsers(dest="stage", metavar="STAGE", required=True)
    module.add_arguments(stages)
    _describe_stages(stages, getattr(module, "EXAMPLES", {}))
    return parser


def _describe_stages(stages: argparse._SubParsersAction, examples: dict) -> None:
    """Each stage's --help opens with its one-line description and ends with the module's
    example command for it (``EXAMPLES``: stage -> command line)."""
    helps = {choice.dest: choice.help for choice in stages._choices_actions}
    for name, stage in stages.choices.items():
        stage.description = stage.description or helps.get(name)
        if name in examples and not stage.epilog:
            stage.epilog = "example:\n  " + examples[name]
            stage.formatter_class = argparse.RawDescriptionHelpFormatter


def stage_list(dataset: str) -> list[tuple[str, str]]:
    """[(stage, one-line description)] of a dataset, in the order its module adds them."""
    parser = build_parser(dataset)
    stages = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [(choice.dest, choice.help or "") for choice in stages._choices_actions]


def usage() -> str:
    """What ``python -m preproc --help`` prints: the datasets and the one-line help of each stage."""
    lines = ["usage: python -m preproc DATASET STAGE [flags]",
             "Preprocess a recommender dataset with Spark into a feature-spec dataset for recsys-train.",
             "Help of one dataset: python -m preproc DATASET --help; of one stage: python -m preproc DATASET STAGE --help",
             "", "datasets and their stages:"]
    for dataset in sorted(DATASETS):
        try:
            module = _load(dataset)
            stages = stage_list(dataset)
        except PreprocError as exc:
            lines.append(f"  {dataset:<10} ({exc})")
            continue
        lines.append(f"  {dataset:<10} {getattr(module, 'DESCRIPTION', '')}")
        lines += [f"    {name:<12} {text}" for name, text in stages]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    try:
        parser = build_parser(argv[0])
        args = parser.parse_args(argv[1:])
        status = args.func(args)
    except PreprocError as exc:
        for problem in getattr(exc, "problems", None) or [exc]:     # a config's every mistake, a line each
            print(f"preproc: error: {problem}", file=sys.stderr)
        return getattr(exc, "exit_status", 2)
    except KeyboardInterrupt:
        print("preproc: interrupted", file=sys.stderr)
        return 130
    return 0 if status is None else int(status)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
