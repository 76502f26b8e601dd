"""Run directories: one per submission, holding the scripts, the request, the job ids, logs.

Layout: <runs_dir>/<name>-<YYYYmmdd-HHMMSS>/ with request.json (the requests and the profile as loaded), <key>.sbatch,
jobs.json (rewritten atomically after every sbatch, so a crash mid-chain still says what was
submitted) and logs/ (batch output, per-rank output, <key>-<jobid>.info records, and each job's
engine log <key>-<tag>.engine.jsonl).
"""

import os
import time

from jobs.errors import RequestError

ENGINE_LOG_SUFFIX = ".engine.jsonl"     # logs/<key>-<tag>.engine.jsonl: the engine's JSON-lines log of a job


def default_runs_dir(profile=None):
    env = os.environ.get("RECSYS_RUNS_DIR")
    if env:
        return env
    defaults = (profile.defaults if profile is not None else None) or {}
    return os.path.expanduser(defaults.get("runs_dir") or "recsys-runs")


def check_runs_dir(runs_dir):
    """Refuse (one line naming --runs-dir) a runs dir that is, or lies under, something other
    than a directory, before anything is rendered or created."""
    path = os.path.abspath(runs_dir)
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        what = ("exists and is not a directory" if probe == path
                else f"lies under {probe!r}, which is not a directory")
        raise RequestError(f"--runs-dir: {runs_dir!r} {what}")
    return path


def new_run_dir(runs_dir, name, create=True):
    """A fresh directory `<runs_dir>/<name>-<timestamp>[-n]` (created with logs/ when `create`)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = os.path.join(check_runs_dir(runs_dir), f"{name}-{stamp}")
    path, n = base, 1
    while True:
        if not create:
            if not os.path.exists(path):
                return path
        else:
            try:        # claim the name with one mkdir: concurrent submissions never share a run dir
                os.makedirs(path)
            except FileExistsError:
                pass
            except OSError as exc:
                raise RequestError(f"--runs-dir: cannot create {path!r}: {exc.strerror}") from None
            else:
                os.mkdir(os.path.join(path, "logs"))
                return path
        n += 1
        path = f"{base}-{n}"


def find_run(run=None, runs_dir=None):
    """Resolve a run argument: a path, a name under the runs dir, or (None) the newest run."""
    runs_dir = runs_dir or default_runs_dir()
    if run:
        for candidate in (run, os.path.join(runs_dir, run)):
            if os.path.isfile(os.path.join(candidate, "jobs.json")):
                return os.path.abspath(candidate)
        raise RequestError(f"run: {run!r} is not a run directory (no jobs.json; runs dir {runs_dir})")
    if os.path.isdir(runs_dir):
        runs = [os.path.join(runs_dir, d) for d in os.listdir(runs_dir)
                if os.path.isfile(os.path.join(runs_dir, d, "jobs.json"))]
        if runs:
            return os.path.abspath(max(runs, key=os.path.getmtime))
    raise RequestError(f"run: no runs under {runs_dir}; give a run directory")
