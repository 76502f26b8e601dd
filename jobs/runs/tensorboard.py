"""What a run directory holds for TensorBoard, and the command that opens it (docs/tensorboard.md).

The engine writes each job's event files and profiler traces under the run directory's
``logs/tensorboard/<job>/rank<k>/`` (recsys/monitoring/tensorboard.py: ``<job>`` is the name of the job's
engine log, ``<key>-<tag>``). This module finds them, names them for TensorBoard's
``--logdir_spec`` (a run's jobs by job name, a study's points by point id such as
``g8-n1x8-r0``) and writes the command and the ``ssh -L`` tunnel line. Pure Python: the login
node needs no TensorBoard to print them.
"""
from __future__ import annotations

import getpass
import os
import shlex
import socket

from ..errors import RequestError
from . import enginelog

SUBDIR = os.path.join("logs", "tensorboard")
DEFAULT_PORT = 6006
TRACE_SUFFIX = ".xplane.pb"


def job_dirs(run_dir):
    """``[(job, directory)]`` of every job of a run that wrote event files or traces, by name."""
    root = os.path.join(run_dir, SUBDIR)
    if not os.path.isdir(root):
        return []
    return [(name, os.path.join(root, name)) for name in sorted(os.listdir(root))
            if os.path.isdir(os.path.join(root, name))]


def rank_of(rank_dir_name):
    """``rank3`` -> 3; None for anything else."""
    return int(rank_dir_name[4:]) if rank_dir_name.startswith("rank") and rank_dir_name[4:].isdigit() else None


def traces(job_dir):
    """``{rank: [trace paths, oldest capture first]}`` of one job (``plugins/profile/<time>/<host>.xplane.pb``)."""
    out = {}
    if not os.path.isdir(job_dir):
        return out
    for name in sorted(os.listdir(job_dir)):
        rank = rank_of(name)
        profile = os.path.join(job_dir, name, "plugins", "profile")
        if rank is None or not os.path.isdir(profile):
            continue
        found = [os.path.join(profile, capture, f) for capture in sorted(os.listdir(profile))
                 if os.path.isdir(os.path.join(profile, capture))
                 for f in sorted(os.listdir(os.path.join(profile, capture))) if f.endswith(TRACE_SUFFIX)]
        if found:
            out[rank] = found
    return out


def has_events(job_dir):
    """Whether some rank directory of a job holds an event file."""
    for root, _, files in os.walk(job_dir):
        if any(f.startswith("events.out.tfevents.") for f in files):
            return True
    return False


def run_logdirs(run_dir):
    """``[(name, directory)]`` of a run: one per job, named by the job (``main-123``). A job whose
    engine wrote into another directory (a restored training continues its first attempt's
    TensorBoard run, which another run directory holds) is shown with that directory, so the
    attempts of one training are one TensorBoard run."""
    found = dict(job_dirs(run_dir))
    for job, path in enginelog.tensorboard_dirs(run_dir).items():
        if job not in found and os.path.isdir(path) and has_events(path):
            found[job] = path
    return sorted(found.items())


def point_logdirs(point_id, run_dir):
    """``[(name, directory)]`` of a study point's attempt: the point's id, with ``/<job>`` after it
    when the attempt ran more than one job."""
    found = job_dirs(run_dir) if run_dir else []
    if len(found) == 1:
        return [(point_id, found[0][1])]
    return [(f"{point_id}/{job}", path) for job, path in found]


def logdir_spec(named):
    """TensorBoard's ``--logdir_spec`` value, ``name:path,name:path``; a name or path it cannot
    carry (a comma, or a colon in a name) is refused with one line."""
    parts = []
    for name, path in named:
        if ":" in name or "," in name or "," in path:
            raise RequestError(f"tensorboard: cannot name {path!r} as {name!r} in --logdir_spec "
                               "(a comma in the path, or a colon or comma in the name)")
        parts.append(f"{name}:{path}")
    return ",".join(parts)


def command(named, port=DEFAULT_PORT, executable="tensorboard"):
    """The TensorBoard command line (a list) that shows every named directory side by side."""
    return [executable, "--logdir_spec", logdir_spec(named), "--port", str(int(port)), "--host", "localhost"]


def profile_command(named, port=DEFAULT_PORT, executable="tensorboard"):
    """The command for the Profile tab, or None when no named directory holds a trace: the profile
    plugin (2.15) looks for traces under ``--logdir`` only, never under ``--logdir_spec``'s
    directories, so this TensorBoard reads the named directories' common parent (its run names are
    the paths below it)."""
    if not any(traces(path) for _, path in named):
        return None
    paths = [path for _, path in named]
    common = os.path.commonpath(paths) if len(paths) > 1 else os.path.dirname(paths[0])
    return [executable, "--logdir", common, "--port", str(int(port)), "--host", "localhost"]


LOCAL_NAMES = ("localhost", "localhost.localdomain", "localhost6", "ip6-localhost")


def this_host(fqdn: str | None = None, hostname: str | None = None) -> str:
    """The name a laptop reaches this node by: the fully qualified name when the resolver knows one,
    else the host name (``getfqdn`` gives ``localhost`` where /etc/hosts maps the name to 127.0.1.1
    or to nothing), else ``LOGIN_NODE`` for the user to replace."""
    fqdn = socket.getfqdn() if fqdn is None else fqdn
    hostname = socket.gethostname() if hostname is None else hostname
    for name in (fqdn, hostname):
        if name and name.lower() not in LOCAL_NAMES:
            return name
    return "LOGIN_NODE"


def tunnel_line(port: int = DEFAULT_PORT, user: str | None = None, host: str | None = None) -> str:
    """What a user runs on their laptop to reach TensorBoard on this (login) node."""
    user = user or getpass.getuser()
    host = host or this_host()
    return (f"ssh -N -L {int(port)}:localhost:{int(port)} {shlex.quote(f'{user}@{host}')}"
            f"   # then open http://localhost:{int(port)}")


def shell_line(argv):
    return " ".join(shlex.quote(str(a)) for a in argv)
