"""A hang caught (issue 35, item 4): one rank of a 2-rank study point is stopped (SIGSTOP) in its
timed steps on the local Slurm cluster. The other rank's watchdog (recsys.monitoring.watchdog, the profile's
hang_timeout 8 s) names itself, where it waits and the stopped rank; the job ends within the limit
plus a margin, Slurm says FAILED, status and the study say HUNG / hung, and the report lists the
point as hung. The same job runs the hardware sampler (slurm/hwsample.py, item 5) beside its step.

One run serves every assertion (a module fixture): one 2-rank start-up is the test's cost.
"""

import glob
import json
import os
import signal
import time

import pytest

from study_helpers import TINY_NCF, info, report as _report, study_dir as _study_dir, watch as _watch, \
    write_spec as _write_spec
from submit_helpers import Cli
from tests.processes import engine_ranks
from tests.waiting import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.horovod]

LIMIT_S = 8
# watchdog ticks (<= 1 s), the heartbeat staleness it reads, srun's --kill-on-bad-exit of the
# stopped rank and the batch script's end record, on a loaded 2-core box
MARGIN_S = 30


def _rank_pid(point_dir, rank):
    """The pid of rank `rank` of the point's job (its environment says SLURM_PROCID)."""
    for pid in engine_ranks(point_dir):
        try:
            with open(f"/proc/{pid}/environ", "rb") as handle:
                env = dict(kv.split(b"=", 1) for kv in handle.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"SLURM_PROCID") == str(rank).encode():
            return pid
    return None


PROFILE = f"""extends: ci
defaults:
  hang_timeout: {LIMIT_S}                  # RECSYS_HANG_TIMEOUT: the engine's limit, no flag given
  horovod_stall_check_seconds: 3
  hw_sample: true                    # the hardware sampler beside the step, on every node
"""


@pytest.fixture(scope="module")
def hung_point(slurm_cluster, tmp_path_factory):
    pytest.importorskip("horovod.tensorflow")
    cli = Cli(slurm_cluster.env, tmp_path_factory.mktemp("hang-runs"))
    spec_dir = tmp_path_factory.mktemp("spec")
    profile = spec_dir / "ci-watched.yaml"
    profile.write_text(PROFILE)
    spec = _write_spec(spec_dir / "hang.yaml", name="hang", model="ncf",
                       batch_size=1024, gpus=[2], warmup_steps=5, steps=10_000_000, time="00:05:00",
                       engine_args=TINY_NCF)
    proc = cli("study", "run", spec, "--profile", profile, check=True)
    directory = _study_dir(proc)
    points = os.path.join(directory, "points")

    def first_step():
        for log in glob.glob(os.path.join(points, "*", "logs", "*.engine.jsonl")):
            with open(log) as handle:
                if '"first_step"' in handle.read():
                    return log
        return None

    log = wait_for(first_step, timeout=600, what="the point's first step", max_delay=0.2)
    point_dir = os.path.dirname(os.path.dirname(log))
    pid = wait_for(lambda: _rank_pid(point_dir, 1), timeout=30, what="rank 1's process")
    stopped_at = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        rc, status = _watch(cli, directory)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    report = _report(cli, directory)
    job = json.loads(cli("status", point_dir, "--json", check=False).stdout)["jobs"][0]
    return dict(cli=cli, dir=directory, point_dir=point_dir, log=log, stopped_at=stopped_at, rc=rc,
                status=status, report=report, job=job)


def test_a_stopped_rank_ends_the_job_within_the_limit_naming_it(hung_point):
    values = info(hung_point["point_dir"])
    assert values["exit_code"] == "86", values                  # recsys.monitoring.watchdog.HANG_EXIT_CODE
    assert "hung" in values, values                              # the batch script saw the hang: no requeue
    took = int(values["end"]) - hung_point["stopped_at"]
    print(f"the job ended {took:.1f} s after rank 1 was stopped (limit {LIMIT_S} s)")
    assert took <= LIMIT_S + MARGIN_S, f"the job ended {took:.0f} s after the stop (limit {LIMIT_S} s)"
    with open(hung_point["log"]) as handle:
        hangs = [json.loads(line) for line in handle if '"type": "hang"' in line]
    # rank 1 was stopped: it cannot speak; rank 0 names itself, where it waits, and rank 1
    assert [h["rank"] for h in hangs] == [0], hangs
    assert hangs[0]["waits_for"] == [1] and hangs[0]["limit_s"] == LIMIT_S, hangs
    assert "training step" in hangs[0]["phase"], hangs
    rank0 = glob.glob(os.path.join(hung_point["point_dir"], "logs", "*.rank0.log"))
    text = open(rank0[0]).read()
    assert "recsys-train: error: hung: rank 0 " in text and "waits for rank 1" in text
    assert "most recent call first" in text and "in benchmark" in text     # faulthandler's stack dump


def test_the_hung_point_shows_hung_in_status_and_report(hung_point):
    assert hung_point["rc"] == 1
    (point,) = hung_point["status"]["points"]
    assert point["state"] == "failed" and point["job_state"] == "HUNG", point
    assert point["reason"].startswith("hung: rank 0 waits in the training step") and "rank 1" in point["reason"]
    assert hung_point["job"]["state"] == "HUNG" and hung_point["job"]["reason"] == point["reason"]
    proc, report = hung_point["report"]
    assert proc.returncode == 1
    (failure,) = report["failures"]
    assert failure["state"] == "HUNG" and failure["reason"] == point["reason"]
    text = open(os.path.join(hung_point["dir"], "report", "scaling.md")).read()
    assert f"`{point['id']}` hung: rank 0 waits in" in text     # the state said once


def test_the_profile_settings_reach_the_job_and_the_sampler_ran_beside_the_step(hung_point):
    script = open(glob.glob(os.path.join(hung_point["point_dir"], "*.sbatch"))[0]).read()
    assert f"export RECSYS_HANG_TIMEOUT={LIMIT_S}" in script
    assert "export HOROVOD_STALL_CHECK_TIME_SECONDS=3" in script
    (path,) = glob.glob(os.path.join(hung_point["point_dir"], "logs", "main-*.hw", "*.json"))
    with open(path) as handle:
        samples = json.load(handle)
    assert samples["version"] == 1 and samples["host"] == "node1"
    times = [s["t"] for s in samples["samples"]]
    values = info(hung_point["point_dir"])
    # about one a second, from the step's start to its end (written whole at the end: USR1 through srun)
    assert len(times) >= 5 and int(values["start"]) - 2 <= times[0] and times[-1] <= int(values["end"]) + 2
    # stopped after the step, it wrote its last samples (end= is recorded once the sampler has exited)
    assert times[-1] >= int(values["end"]) - 3, (times[-1], values["end"])
    assert "Killed" not in open(path.rsplit(".hw", 1)[0] + ".hw.log").read()
    assert all(0 <= s["cpu_busy_pct"] <= 100 and s["mem_used_gib"] > 0 for s in samples["samples"])
