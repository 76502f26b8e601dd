"""`recsys-submit`: profiles, render, train/evaluate/benchmark/preprocess, status, logs, cancel,
requeue, study (scaling studies), tensorboard (jobs.tensorboard_cli). Every command goes through jobs.api, the API a program uses.
Errors are one line on stderr with a non-zero exit (2: bad input, nothing submitted; 1: Slurm
failed or a job failed). jobs.api is imported only once a command runs, so `--help` and
argument errors start fast on login nodes.

The package: `parser` (every flag), `job_commands` and `study_commands` (what each command does
through jobs.api); `main` here dispatches and turns the toolkit's errors into one line each.
"""

import contextlib
import sys
import warnings

from jobs import tensorboard_cli
from jobs.vocabulary import DATASETS
from jobs.vocabulary import KINDS as JOB_KINDS

from .job_commands import _cmd_cancel, _cmd_job, _cmd_logs, _cmd_profiles, _cmd_status, _split_engine_args
from .job_commands import requests_from_args
from .parser import PROG, _parser_for, build_parser
from .study_commands import _cmd_study

__all__ = ["main", "build_parser", "requests_from_args", "PROG", "DATASETS"]


@contextlib.contextmanager
def _unsaved_once():
    """Fresh results a command could not save (jobs.errors.ResultsNotSaved: a study or run the
    user may only read, a read-only mount, a full disk) are said in one line, once per command,
    and the command goes on; other warnings are shown as Python shows them."""
    from jobs.errors import ResultsNotSaved

    said = []

    def show(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, ResultsNotSaved):
            return shown(message, category, filename, lineno, file, line)
        if not said:
            said.append(message)
            print(f"{PROG}: warning: fresh results not saved ({message}); this command goes on without saving "
                  "them", file=sys.stderr, flush=True)

    with warnings.catch_warnings():
        shown = warnings.showwarning
        warnings.simplefilter("always", ResultsNotSaved)
        warnings.showwarning = show
        yield


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    own, engine_args = _split_engine_args(argv)
    args = _parser_for(own).parse_args(own)
    if args.command in JOB_KINDS:
        args.kind = args.command
    if args.command == "completion":       # generated from this parser: jobs.completion
        from jobs.completion import script

        print(script(build_parser(), PROG, args.shell), end="")
        return 0
    from jobs import api

    try:
        with _unsaved_once():      # every command: fresh results it could not save, said once
            if args.command == "profiles":
                return _cmd_profiles(api, args)
            if args.command == "render" or args.command in JOB_KINDS:
                return _cmd_job(api, args, engine_args)
            if args.command == "status":
                return _cmd_status(api, args)
            if args.command == "logs":
                return _cmd_logs(api, args)
            if args.command == "tensorboard":
                return tensorboard_cli.run(api, args)
            if args.command == "study":
                return _cmd_study(api, args, engine_args)
            return _cmd_cancel(api, args)
    except KeyboardInterrupt:
        return 130
    except (api.RequestError, api.ProfileError) as exc:     # one line for every error we know
        for problem in getattr(exc, "problems", None) or [exc]:    # a file's every mistake, a line each
            print(f"{PROG}: error: {problem}", file=sys.stderr)
        return 2
    except (api.SubmitError, api.SlurmCommandError, api.StorageError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
