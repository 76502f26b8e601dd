"""Fixtures of the engine tests: tiny synthetic datasets and a runner for `python -m recsys.train`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mpi_env import MPI_ENV

REPO = Path(__file__).resolve().parents[2]
# Rows of the tiny datasets: a few dozen steps, enough for the synthetic signal to be learnt.
ROWS = {"dlrm": {"train": 8192, "test": 4096}, "wide_deep": {"train": 8192, "test": 4096},
        "ncf": {"train": 6000}}
# Small model flags for the tests (2 CPU cores shared with other work).
SMALL = {
    "dlrm": ["--embedding-dim", "8", "--bottom-mlp", "16,8", "--top-mlp", "32,16,1", "--batch-size", "256",
             "--eval-batch-size", "1024", "--lr", "0.5", "--warmup-steps", "4", "--decay-start-step", "1000",
             "--decay-steps", "0"],
    "wide_deep": ["--embedding-dim", "8", "--deep-hidden-units", "32,32", "--batch-size", "256",
                  "--eval-batch-size", "1024", "--lr", "0.003", "--linear-lr", "0.1", "--deep-warmup-epochs", "0.25"],
    "ncf": ["--factors", "8", "--layers", "32,16,8", "--batch-size", "1024", "--eval-batch-size", "8192",
            "--lr", "0.01", "--beta1", "0.9", "--beta2", "0.999", "--dropout", "0"],
}


def base_env():
    env = dict(os.environ)
    env.update(MPI_ENV)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    for var in [k for k in env if k.startswith(("OMPI_COMM_WORLD", "PMIX_RANK", "SLURM_"))]:
        env.pop(var)
    env.pop("WORLD_SIZE", None)
    return env


def train_cmd(*args):
    return [sys.executable, "-m", "recsys.train", *map(str, args)]


def run_train(args, timeout=240, env=None, **kw):
    return subprocess.run(train_cmd(*args), env=env or base_env(), text=True, capture_output=True,
                          timeout=timeout, cwd=REPO, **kw)


def mpirun_cmd(np_, cmd):
    env_names = sorted(set(MPI_ENV) | {"PATH", "PYTHONPATH", "TF_CPP_MIN_LOG_LEVEL"})
    out = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), "--bind-to", "none"]
    for name in env_names:
        out += ["-x", name]
    return out + cmd


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def records(log, kind):
    return [r for r in log if r["type"] == kind]


def summary(log):
    s = records(log, "summary")
    assert s, f"no summary record in {[r['type'] for r in log]}"
    return s[-1]


def in_process_task(argv, log_path=None, **overrides):
    """(config, task, dist, log) of a one-rank run of ``recsys-train argv`` in this process: the
    configuration resolved as the CLI resolves it, then ``overrides`` (TrainConfig fields) applied."""
    import dataclasses
    from recsys.features.spec import FeatureSpec
    from recsys.models.tasks import TASKS
    from recsys.monitoring.logger import RunLogger
    from recsys.runtime.distributed import Distributed
    from recsys.train import build_parser, resolve
    config = dataclasses.replace(resolve(build_parser().parse_args([str(a) for a in argv])), **overrides)
    dist = Distributed(use_horovod=False)
    log = RunLogger(str(log_path) if log_path else None, enabled=bool(log_path))
    return config, TASKS[config.model](config, FeatureSpec.from_yaml(config.feature_spec), dist, log), dist, log


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """``tiny_data(model)`` -> directory of a small synthetic dataset (generated once per session)."""
    from recsys.data import synthetic
    made = {}

    def get(model):
        if model not in made:
            out = tmp_path_factory.mktemp(f"data-{model}")
            spec = synthetic.default_spec(model, num_files=2)
            synthetic.generate(spec, str(out), ROWS[model], seed=7)
            made[model] = out
        return made[model]
    return get


@pytest.fixture(scope="session")
def dlrm_one_rank(tiny_data, tmp_path_factory):
    """Summary of a 1-rank DLRM run, the reference for the multi-rank runs."""
    out = tmp_path_factory.mktemp("dlrm-1rank")
    log = out / "log.jsonl"
    res = run_train(["--model", "dlrm", "--data-path", tiny_data("dlrm"), *SMALL["dlrm"], "--epochs", "1",
                     "--max-steps", "16", "--log-path", log, "--log-every", "4"])
    assert res.returncode == 0, res.stderr[-3000:]
    return summary(read_log(log))


def start_train(ranks, args):
    """An engine run (1 rank: the engine alone; more: under mpirun), started and not waited for."""
    cmd = train_cmd(*args) if ranks == 1 else mpirun_cmd(ranks, train_cmd(*args))
    return subprocess.Popen(cmd, env=base_env(), cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)


def finish(proc, timeout=300):
    """A started run waited for (killed on timeout), as a CompletedProcess."""
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def finish_all(procs, timeout=300):
    """Runs started side by side (they share nothing but read-only data: on CI's 2 cores one's
    start-up and waits fill what the other leaves idle), each waited for; what is left of them
    after a failure is killed. [CompletedProcess] in the order given."""
    try:
        return [finish(p, timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
