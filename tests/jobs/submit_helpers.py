"""Helpers for the submission-layer tests (tests/jobs): the CLI as a subprocess, HELLO parsing."""

import glob
import json
import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Cli:
    """`recsys-submit` as a subprocess, with the cluster's environment and a private runs dir."""

    def __init__(self, env, runs_dir):
        self.env = dict(env)
        self.env.update(RECSYS_RUNS_DIR=str(runs_dir), RECSYS_POLL_FIRST="0.3", RECSYS_POLL_MAX="2",
                        RECSYS_SBATCH_BACKOFF="0.2")
        self.runs_dir = str(runs_dir)

    def __call__(self, *args, timeout=300, check=False, env=None):
        proc = subprocess.run([sys.executable, "-m", "jobs.cli", *map(str, args)], cwd=REPO,
                              env=env or self.env, text=True, capture_output=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"recsys-submit {' '.join(map(str, args))} exited {proc.returncode}:\n"
                                 f"{proc.stdout}\n{proc.stderr}")
        return proc

    def submit(self, *args, **kw):
        """Submit; returns (run_dir, jobs.json record)."""
        proc = self(*args, check=True, **kw)
        match = re.search(r"^run dir (.+)$", proc.stdout, re.M)
        assert match, proc.stdout
        run_dir = match.group(1).strip()
        with open(os.path.join(run_dir, "jobs.json")) as handle:
            return run_dir, json.load(handle)


def hello_lines(run_dir, pattern="*.rank*.log"):
    """The parsed HELLO records of every rank log of a run."""
    out = []
    for path in sorted(glob.glob(os.path.join(run_dir, "logs", pattern))):
        with open(path) as handle:
            for line in handle:
                if line.startswith("HELLO "):
                    out.append(json.loads(line[6:]))
    return out




def ci_raw():
    """The built-in ci profile as plain YAML data (to write variants of it)."""
    import yaml

    from jobs.profiles import builtin_dir

    with open(builtin_dir() / "ci.yaml") as handle:
        return yaml.safe_load(handle)
