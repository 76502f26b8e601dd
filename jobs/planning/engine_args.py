"""The training engine's command line as the submission layer sees it: the one reader of its
flags on this side (a flag's value, the checkpoint dir, paths made absolute, the flags
recsys-submit owns) and the one door to the engine's own parser and start-up checks
(recsys.train, pure Python: no TensorFlow), imported only when a job is planned: submit,
--dry-run, render and a study's points make the same check. Also: whether the interpreter a job
would run has TensorFlow at all (check_interpreter).
"""

import importlib.util
import os
import sys

from jobs.errors import RequestError

from .argv import RunPath

# Engine flags the submission layer sets itself (jobs.planning.plan): given again after `--` they would
# render twice, the last one winning silently. flag -> what to use instead.
OWNED_FLAGS = {
    "recsys": {"--run-mode": "the subcommand (recsys-submit train | evaluate | predict | benchmark)",
               "--mode": "the subcommand (recsys-submit train | evaluate | predict | benchmark)",
               "--model": "recsys-submit's own --model"},
    "preproc": {"--input": "recsys-submit preprocess --input", "--output": "recsys-submit preprocess --output",
                "--engine": "recsys-submit preprocess --engine"},
}
# The engine's path flags: a job runs in its run dir, so a relative path is made absolute,
# relative to where recsys-submit runs (and where it is checked), as a user means it.
PATH_FLAGS = ("--data-path", "--feature-spec", "--checkpoint-dir", "--log-path", "--tensorboard-dir", "--predictions")
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


def check(argv, ranks, check_data=True, check_existence=True, produced=()):
    """A training job's engine argv checked with the engine's own parser and start-up checks
    (recsys.train.check_submission): unknown flags, bad values, a batch the job's `ranks` cannot
    split; with `check_data`, no data named; with `check_existence` too, a data directory or
    checkpoint missing on this host (unless under a path in `produced`, which an earlier job of the
    chain writes). The one check of submit, --dry-run and render. RequestError with the engine's line."""
    from recsys.errors import EngineError
    from recsys.train import check_submission

    try:
        check_submission(argv, world_size=ranks, check_data=check_data, check_existence=check_existence,
                         produced=produced)
    except EngineError as exc:
        raise RequestError(str(exc)) from None


def check_interpreter(profile, override=None):
    """Refuse, before anything is submitted, a TensorFlow job that would run the submitting Python
    (a profile without `python:` or `container:`; jobs.planning.argv.job_python) when that Python
    has no TensorFlow: the login-node install, whose job would fail on the node (issue 48). Looks
    for the package without importing it."""
    if override or profile.python or profile.container is not None:
        return
    if importlib.util.find_spec("tensorflow") is not None:
        return
    where = f" ({profile.path})" if profile.path else ""
    raise RequestError(f"profile {profile.name}{where}: without `python:` or `container:` its jobs run this "
                       f"Python ({sys.executable}), which has no TensorFlow: pip install 'recsys-submit[train]' "
                       f"here ('recsys-submit[gpu]' for GPUs), or give the profile `python:` (an interpreter with "
                       f"TensorFlow on the nodes) or `container:`")
