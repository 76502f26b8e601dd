"""The training engine's command line as the submission layer sees it: the one reader of its
flags on this side (a flag's value, the checkpoint dir, paths made absolute, the flags
recsys-submit owns) and the one door to the engine's own parser and start-up checks
(recsys.train, pure Python: no TensorFlow), which are imported only when a submission is checked.
"""

import os

from jobs.errors import RequestError

from .argv import RunPath

# Engine flags the submission layer sets itself (jobs.planning.plan): given again after `--` they would
# render twice, the last one winning silently. flag -> what to use instead.
OWNED_FLAGS = {
    "recsys": {"--run-mode": "the subcommand (recsys-submit train | evaluate | benchmark)",
               "--mode": "the subcommand (recsys-submit train | evaluate | benchmark)",
               "--model": "recsys-submit's own --model"},
    "preproc": {"--input": "recsys-submit preprocess --input", "--output": "recsys-submit preprocess --output",
                "--engine": "recsys-submit preprocess --engine"},
}
# The engine's path flags: a job runs in its run dir, so a relative path is made absolute,
# relative to where recsys-submit runs (and where it is checked), as a user means it.
PATH_FLAGS = ("--data-path", "--feature-spec", "--checkpoint-dir", "--log-path", "--tensorboard-dir")
# The same for the preprocessing stages (`preproc tabular run --config FILE`).
PREPROC_PATH_FLAGS = ("--config",)


def flag_value(argv, flag):
    """The value of `flag` (`--flag V` or `--flag=V`) in an argv, the last one winning as in
    argparse; None when absent."""
    value = None
    args = list(argv)
    for index, arg in enumerate(args):
        if str(arg) == flag and index + 1 < len(args):
            value = args[index + 1]
        elif str(arg).startswith(flag + "="):
            value = str(arg)[len(flag) + 1:]
    return value


def has_flag(argv, flag):
    return any(str(a) == flag or str(a).startswith(flag + "=") for a in argv)


def checkpoint_dir(argv):
    """The `--checkpoint-dir` of an engine argv (a RunPath stays one), or None."""
    return flag_value(argv, "--checkpoint-dir") or None


def absolute(path):
    """A user's path as the job must see it (jobs run in their run dir); RunPaths stay as they are."""
    if isinstance(path, RunPath) or path is None:
        return path
    return os.path.abspath(os.path.expanduser(str(path)))


def absolute_paths(argv, flags=PATH_FLAGS):
    """The argv with the values of ``flags`` (default PATH_FLAGS) made absolute."""
    out, args = [], list(argv)
    for index, arg in enumerate(args):
        text = str(arg)
        if index and str(args[index - 1]) in flags:
            out.append(absolute(arg))
        elif "=" in text and text.split("=", 1)[0] in flags:
            flag, value = text.split("=", 1)
            out.append(f"{flag}={absolute(value)}")
        else:
            out.append(arg)
    return out


def refuse_owned(argv, engine):
    """Refuse engine arguments that the submission layer owns (one line naming what to use)."""
    owned = OWNED_FLAGS.get(engine, {})
    for arg in map(str, argv):
        flag = arg.split("=", 1)[0]
        if flag in owned:
            raise RequestError(f"engine argument {flag}: set by recsys-submit, not after `--`; "
                               f"use {owned[flag]}")


def check(argv, ranks, check_existence=True, produced=()):
    """A training job's engine argv checked with the engine's own parser and start-up checks
    (recsys.train.check_submission): unknown flags, bad values, a batch the job's `ranks` cannot
    split, no data named, a data directory or checkpoint missing on this host (unless under a
    path in `produced`, which an earlier job of the chain writes). RequestError with the engine's line."""
    from recsys.errors import EngineError
    from recsys.train import check_submission

    try:
        check_submission(argv, world_size=ranks, check_existence=check_existence, produced=produced)
    except EngineError as exc:
        raise RequestError(str(exc)) from None


def parser():
    """The engine's own argument parser (recsys.train.build_parser; no TensorFlow)."""
    from recsys.train import build_parser

    return build_parser()
