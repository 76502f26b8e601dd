"""Helpers of the study tests on the local clusters (tests/jobs/test_study_*.py): the CLI's
study output, specs, and what the queue holds."""

import json
import os
import re

TINY_DLRM = ["--embedding-dim", "4", "--bottom-mlp", "8,4", "--top-mlp", "8,1", "--synthetic-rows", "4096"]
TINY_NCF = ["--factors", "4", "--layers", "16,8,4"]


def study_dir(proc):
    match = re.search(r"^study dir (.+)$", proc.stdout, re.M)
    assert match, proc.stdout + proc.stderr
    return match.group(1).strip()


def submitted(proc):
    match = re.search(r"^submitted (\d+) of (\d+) point", proc.stdout, re.M)
    assert match, proc.stdout + proc.stderr
    return int(match.group(1)), int(match.group(2))


def write_spec(path, **spec):
    import yaml

    path.write_text(yaml.safe_dump(spec))
    return path


def watch(cli, directory):
    proc = cli("study", "status", directory, "--watch", "--json", timeout=1200)
    return proc.returncode, json.loads(proc.stdout)


def status(cli, directory):
    proc = cli("study", "status", directory, "--json", timeout=120)
    return proc.returncode, json.loads(proc.stdout)


def report(cli, directory):
    proc = cli("study", "report", directory, timeout=300)
    with open(os.path.join(directory, "report", "scaling.json")) as handle:
        return proc, json.load(handle)


def record(directory):
    with open(os.path.join(directory, "study.json")) as handle:
        return json.load(handle)


def job_ids(run_dirs):
    out = []
    for run_dir in run_dirs:
        with open(os.path.join(run_dir, "jobs.json")) as handle:
            out += [j["job_id"] for j in json.load(handle)["jobs"]]
    return out


def queued(cluster, prefix):
    """{job id: (name, state)} of the queued or running jobs whose name starts with `prefix`, or
    whose batch script is in study `prefix` (on a shared-nodes profile a point's job name is the
    cluster's one study name, jobs.study.running.run.SHARED_NAME)."""
    out = {}
    for line in cluster.run(["squeue", "-h", "-o", "%i|%j|%T|%o"], check=True).stdout.splitlines():
        job_id, name, state, command = line.split("|", 3)
        if name.startswith(prefix) or f"/study-{prefix}/" in command:
            out[job_id] = (name, state)
    return out


def info(run_dir):
    """The batch script's exit record(s) of a point: {key: value} (last value wins)."""
    values = {}
    logs = os.path.join(run_dir, "logs")
    for name in sorted(os.listdir(logs)):
        if name.endswith(".info"):
            with open(os.path.join(logs, name)) as handle:
                values.update(line.rstrip("\n").split("=", 1) for line in handle if "=" in line)
    return values
