"""`recsys-submit tensorboard [RUN|STUDY]`: the TensorBoard command that shows a run's jobs or a
study's points side by side, and the tunnel line for a laptop; with `--start`, TensorBoard itself
where it is installed (`pip install '.[tensorboard]'`). Goes through jobs.api, as jobs.cli does."""
from __future__ import annotations

import importlib.util
import os
import sys

HELP = "print (or start) the TensorBoard command for a run's jobs or a study's points"
EPILOG = ("examples:\n  recsys-submit tensorboard\n  recsys-submit tensorboard study-dlrm-strong\n"
          "  recsys-submit tensorboard RUN --port 6007 --start")


def add_parser(sub, make):
    """The `tensorboard` subcommand; `make(sub, name, help, epilog=...)` is jobs.cli's builder."""
    tb = make(sub, "tensorboard", HELP, epilog=EPILOG)
    tb.add_argument("target", nargs="?", metavar="RUN|STUDY",
                    help="a run or study directory, or its name under the runs dir (default: the newest run)")
    tb.add_argument("--port", type=int, default=6006, help="TensorBoard's port on this node")
    tb.add_argument("--start", action="store_true",
                    help="start TensorBoard here (in the foreground) instead of printing its command")
    tb.add_argument("--runs-dir", help="where runs are (default $RECSYS_RUNS_DIR or ./recsys-runs)")
    return tb


def run(api, args, out=None):
    out = out or sys.stdout
    if not 0 < args.port < 65536:
        raise api.RequestError(f"--port {args.port}: not a TCP port (1-65535)")
    kind, where, named = api.tensorboard_logdirs(args.target, args.runs_dir)
    argv, line, tunnel, profile = api.tensorboard_command(named, args.port)
    if args.start:
        if importlib.util.find_spec("tensorboard") is None:
            raise api.RequestError("--start: TensorBoard is not installed here; pip install '.[tensorboard]' "
                                   "(or run the printed command where it is)")
        argv = [sys.executable, "-m", "tensorboard.main", *argv[1:]]
        print(f"# {kind} {where}: {len(named)} TensorBoard run(s); from your laptop:\n{tunnel}", file=out)
        if profile:                     # this one's Profile tab cannot see them (see below)
            print(f"# its Profile tab shows no traces (--logdir_spec); for them run instead:\n{profile}", file=out)
        out.flush()
        os.execv(argv[0], argv)         # TensorBoard in this process's place: Ctrl-C stops it
    print(f"# {kind} {where}: {len(named)} TensorBoard run(s) (" + ", ".join(n for n, _ in named) + ")", file=out)
    print(line, file=out)
    if profile:
        print("# the Profile tab (traces; TensorBoard 2.15's profile plugin reads only --logdir):", file=out)
        print(profile, file=out)
    print("# from your laptop, for a login node:", file=out)
    print(tunnel, file=out)
    return 0
