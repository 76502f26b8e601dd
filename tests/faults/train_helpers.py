"""Shared pieces of the training fault tests (tests/faults/test_train_*.py): a tiny dataset, the
engine command line, the engine's JSON log, and polling with a deadline (never a bare sleep)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from tests.waiting import wait_for  # noqa: F401  (the fault tests import it from here)

REPO = Path(__file__).resolve().parents[2]
# A small DLRM (as tests/recsys): 8192 training rows, batch 256 -> 32 steps per epoch.
DLRM = ["--model", "dlrm", "--embedding-dim", "8", "--bottom-mlp", "16,8", "--top-mlp", "32,16,1",
        "--batch-size", "256", "--eval-batch-size", "1024", "--lr", "0.5", "--warmup-steps", "4",
        "--decay-start-step", "1000", "--decay-steps", "0"]
ROWS_SMALL = {"train": 8192, "test": 1024}
# The jobs of the Slurm fault tests: 16384 rows, batch 512 -> 32 steps per epoch, 3 epochs (a
# checkpoint after each), every step logged.
ENGINE = [*DLRM[2:], "--batch-size", "512", "--bottom-mlp", "64,32,8", "--top-mlp", "128,64,1",
          "--epochs", "3", "--log-every", "1"]
ROWS = {"train": 16384, "test": 1024}
STEPS = 96


def make_data(out, model="dlrm", rows=None):
    """A small synthetic dataset in `out` (feature_spec.yaml and its files)."""
    from recsys.data import synthetic
    spec = synthetic.default_spec(model, num_files=2)
    synthetic.generate(spec, str(out), rows or ROWS_SMALL, seed=7)
    return Path(out)


def engine_env(base=None):
    env = dict(base or os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    for var in [k for k in env if k.startswith(("OMPI_COMM_WORLD", "PMIX_RANK", "SLURM_JOB", "SLURM_STEP"))]:
        env.pop(var)
    return env


def run_engine(args, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "recsys.train", *map(str, args)], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout, env=env or engine_env())


def submit(cli, *args):
    """`recsys-submit` through tests/jobs' Cli: (run dir, jobs.json, stderr with its warnings)."""
    proc = cli(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = re.search(r"^run dir (.+)$", proc.stdout, re.M).group(1).strip()
    with open(os.path.join(run_dir, "jobs.json")) as handle:
        return run_dir, json.load(handle), proc.stderr


def read_log(path):
    """Records of an engine JSON-lines log (a torn last line of a killed rank is skipped)."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return out


def step_history(records):
    """Check the step records of a (possibly requeued) run's log: steps rise by one, and a step
    is trained again only right after a `restored ... at step N` record that says so (N below
    it). Returns (problems, repeated steps, restores)."""
    problems, repeated, restores = [], 0, []
    last = None
    restored_at = None
    for rec in records:
        if rec.get("type") == "info" and "restored_step" in rec:
            restored_at = rec["restored_step"]
            restores.append(restored_at)
            continue
        if rec.get("type") != "step":
            continue
        step = rec["step"]
        if restored_at is not None:
            if step != restored_at + 1:
                problems.append(f"step {step} after a restore at step {restored_at}")
            if last is not None and step <= last:
                repeated += last - step + 1
            restored_at = None
        elif last is not None and step != last + 1:
            problems.append(f"step {step} follows step {last} with no restore between")
        last = step
    return problems, repeated, restores


# Slurm revokes a requeued job's credential; an attempt allocated within the same second is killed
# at launch ("Killing non-startable batch job: Job credential revoked"), which is why Slurm sets a
# requeued job's BeginTime ahead. A release waits this long after first seeing the job pending.
REQUEUE_SETTLE_S = 2.0
_pending_since = {}


def release_requeued(cluster, job_id):
    """Slurm holds a requeued job back (its BeginTime a while ahead): let it start now, but only
    once its previous attempt is gone: pending for REQUEUE_SETTLE_S (its old credential revoked in
    an earlier second), no step of it still completing, no slurmstepd of it left on this host (an
    attempt started while the previous attempt's step is being torn down on the same node can see
    its srun return at once). A requeued job Slurm holds (e.g. 'launch failed requeued held') is
    released. Returns the job's fields as seen (for the caller's checks and a timeout's message)."""
    fields = job_fields(cluster, job_id)
    if fields.get("JobState") != "PENDING":
        _pending_since.pop(job_id, None)
        return fields
    since = _pending_since.setdefault(job_id, time.monotonic())
    raw = fields.get("JobId", job_id)
    completing = cluster.run(["squeue", "-h", "-t", "CG", "-o", "%A"]).stdout.split()
    if time.monotonic() - since < REQUEUE_SETTLE_S or raw in completing or _stepd_alive(raw):
        return fields
    if "held" in fields.get("Reason", "").lower() or fields.get("Priority") == "0":
        cluster.run(["scontrol", "release", str(job_id)])
    cluster.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
    return fields


def cluster_picture(cluster, job_id):
    """The job's scheduling fields and the nodes' states, for a timeout's message."""
    fields = job_fields(cluster, job_id)
    keep = ("JobState", "Reason", "Restarts", "StartTime", "Priority", "NodeList", "BatchHost")
    nodes = cluster.run(["sinfo", "-h", "-N", "-o", "%N:%T"]).stdout.split()
    return (f"{job_id}: " + " ".join(f"{k}={fields.get(k)}" for k in keep) + f"; nodes {' '.join(nodes)}; "
            f"completing {cluster.run(['squeue', '-h', '-t', 'CG', '-o', '%A']).stdout.split()}; "
            f"stepd alive {_stepd_alive(fields.get('JobId', job_id))}")


def _stepd_alive(raw_id):
    """Whether a slurmstepd of job `raw_id` still runs on this host (the emulated nodes all do)."""
    mark = f"slurmstepd: [{raw_id}.".encode()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(mark):
                    return True
        except OSError:
            continue
    return False


def job_fields(cluster, job_id):
    words = cluster.run(["scontrol", "-o", "show", "job", str(job_id)]).stdout.split()
    return dict(w.split("=", 1) for w in words if "=" in w)
