"""A stuck point never costs the others in a study run in one allocation (issue 47 item 1), on the
local Slurm cluster:

- its own limit: each point's step has the point's time limit (srun --time); a point whose rank
  is stopped (SIGSTOP) before its first step is TIMEOUT at that limit, with its phase and the
  stopped rank and node, and the next point of the same allocation still COMPLETES;
- the allocation's end of time: the allocation's limit is cut short (scontrol) while its second
  point is stuck; its script's handler of the end-of-time signal (USR2, `--signal=B:USR2@60`,
  which came at once here; else SIGTERM at the limit) records that point as TIMEOUT (the
  allocation's limit), the point it did not reach stays unrun (missing, not failed), and the next `study run`
  submits only those two, never the finished one, and the unreached one runs exactly once.

The local cluster's KillWait is 5 s and OverTimeLimit 0; Slurm looks at time limits about every
30 s, so a 1-minute step ends 60-95 s after it began.
"""

import glob
import os
import signal
import time

import pytest

from study_helpers import TINY_NCF, info, record, report, status, study_dir, submitted, watch, write_spec
from submit_helpers import Cli
from tests.processes import engine_ranks
from tests.waiting import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.horovod, pytest.mark.slow]

BASE = dict(model="ncf", batch_size=512, warmup_steps=1, steps=2, breakdown_steps=0, engine_args=TINY_NCF,
            placement="allocation")
# the step's limit, the time-limit check's period (about 30 s) and KillWait, on a loaded 2-core box
LATE_S = 45


def _alloc_info(directory, point):
    """The allocation's own records ({key: value}, last wins) of the allocation `point` last ran in."""
    return info(point["allocation"][point["runs"][-1]])


def _started(directory):
    """Point ids in the order their scripts began in the (first) allocation."""
    points = record(directory)["points"]
    started = [(int(info(p["runs"][0])["start"]), p["id"]) for p in points
               if glob.glob(os.path.join(p["runs"][0], "logs", "*.info"))
               and "start" in info(p["runs"][0])]
    return [pid for _, pid in sorted(started)]


def _stop_rank(run_dir, rank=None):
    """SIGSTOP the point's rank `rank` (every rank: None) before its first step; its pids."""
    def found():
        pids = engine_ranks(run_dir)
        if rank is None:
            return pids
        return [pid for pid in pids if _procid(pid) == rank]

    pids = wait_for(found, timeout=300, what=f"rank {rank} of {run_dir}", max_delay=0.2)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


def _procid(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            env = dict(kv.split(b"=", 1) for kv in handle.read().split(b"\0") if b"=" in kv)
    except OSError:
        return None
    value = env.get(b"SLURM_PROCID")
    return int(value) if value is not None else None


def _resume(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def _first_step_reached(run_dir):
    for path in glob.glob(os.path.join(run_dir, "logs", "*.engine.jsonl")):
        with open(path) as handle:
            if '"first_step"' in handle.read():
                return True
    return False


def _by_id(st):
    return {p["id"]: p for p in st["points"]}


@pytest.fixture(scope="module")
def cli(slurm_cluster, tmp_path_factory):
    pytest.importorskip("horovod.tensorflow")
    return Cli(slurm_cluster.env, tmp_path_factory.mktemp("limits-runs"))


def test_a_point_stuck_before_its_first_step_times_out_and_the_next_point_completes(cli, tmp_path):
    spec = write_spec(tmp_path / "stuck.yaml", name="stuck", time="00:01:00", **BASE,
                      points=[{"nodes": 1, "gpus_per_node": 2}, {"nodes": 1, "gpus_per_node": 1}])
    directory = study_dir(cli("study", "run", spec, "--profile", "ci", check=True))
    stuck = wait_for(lambda: (_started(directory) or [None])[0], timeout=300, what="the first point to start")
    stuck_dir = _by_id({"points": record(directory)["points"]})[stuck]["runs"][0]
    pids = _stop_rank(stuck_dir, rank=1)
    stopped_at = time.time()
    try:
        assert not _first_step_reached(stuck_dir)
        rc, st = watch(cli, directory)
    finally:
        _resume(pids)
    points = _by_id(st)
    other = next(pid for pid in points if pid != stuck)
    values = info(stuck_dir)
    took = int(values["end"]) - stopped_at
    print(f"the stuck point ended {took:.0f} s after its rank was stopped (its limit 60 s); "
          f"the next point took {int(info(points[other]['run_dir'])['end']) - int(values['end'])} s")
    assert values["timed_out"] == "step" and values["limit_s"] == "60", values
    assert took <= 60 + LATE_S, took
    assert points[stuck]["state"] == "failed" and points[stuck]["job_state"] == "TIMEOUT", points[stuck]
    reason = points[stuck]["reason"]
    assert reason.startswith("TIMEOUT: its own 1-minute limit, before its first step (start-up"), reason
    assert "; rank 1 on node1" in reason, reason
    assert points[other]["state"] == "done" and points[other]["summary"]["world_size"] == 1, points[other]
    assert rc == 1                     # a failed point: the study says so
    # one allocation ran both (one job id), the stuck point first
    assert points[stuck]["job_id"] == points[other]["job_id"]
    assert _started(directory) == [stuck, other]
    alloc = _alloc_info(directory, record(directory)["points"][0])
    assert alloc["exit_code"] == "0" and "time_limit" not in alloc, alloc
    # the report lists it as a TIMEOUT failure with the same reason
    _, rep = report(cli, directory)
    assert [(f["point"], f["state"], f["reason"]) for f in rep["failures"]] == [(stuck, "TIMEOUT", reason)], rep


def test_the_allocations_end_of_time_times_out_the_running_point_and_leaves_the_rest_to_the_rerun(
        cli, slurm_cluster, tmp_path):
    spec = write_spec(tmp_path / "ending.yaml", name="ending", time="00:05:00", **BASE,
                      points=[{"nodes": 1, "gpus_per_node": 1}, {"nodes": 2, "gpus_per_node": 1},
                              {"nodes": 1, "gpus_per_node": 2}])
    directory = study_dir(cli("study", "run", spec, "--profile", "ci", check=True))
    second = wait_for(lambda: (_started(directory) + [None, None])[1], timeout=600,
                      what="the second point to start", max_delay=0.2)
    first, = [pid for pid in _started(directory) if pid != second]
    by_id = _by_id({"points": record(directory)["points"]})
    pids = _stop_rank(by_id[second]["runs"][0])
    try:
        assert not _first_step_reached(by_id[second]["runs"][0])
        alloc_dir = by_id[second]["allocation"][by_id[second]["runs"][0]]
        job = info(alloc_dir)["job_id"]
        # the allocation's limit cut to end within a minute: its end of time comes while the point is stuck
        minutes = (int(time.time()) - int(info(alloc_dir)["start"])) // 60 + 1
        slurm_cluster.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={minutes}"], check=True)
        wait_for(lambda: "exit_code" in info(alloc_dir), timeout=60 * minutes + 120,
                 what="the allocation's script to record its end")
    finally:
        _resume(pids)
    alloc = info(alloc_dir)
    assert "time_limit" in alloc and alloc["exit_code"] in ("140", "143"), alloc     # USR2 (or TERM) handled

    def settled():
        _, seen = status(cli, directory)
        return seen if not any(seen["counts"][k] for k in ("running", "pending", "unknown")) else None

    st = wait_for(settled, timeout=120, what="the study to see the allocation's end")
    points = _by_id(st)
    assert points[first]["state"] == "done", points[first]
    assert points[second]["state"] == "failed" and points[second]["job_state"] == "TIMEOUT", points[second]
    assert points[second]["reason"].startswith(
        f"TIMEOUT: the allocation's time limit (job {job}), before its first step"), points[second]
    third, = [pid for pid in points if pid not in (first, second)]
    assert points[third]["state"] == "missing" and points[third]["reason"].startswith("not reached"), points[third]
    assert not glob.glob(os.path.join(by_id[third]["runs"][0], "logs", "*.info"))    # never began

    rerun = cli("study", "run", spec, "--profile", "ci", check=True)
    assert submitted(rerun) == (2, 3) and first not in rerun.stdout, rerun.stdout
    rc, st = watch(cli, directory)
    assert rc == 0 and st["counts"]["done"] == 3, st
    runs = {p["id"]: p["runs"] for p in record(directory)["points"]}
    assert {pid: len(r) for pid, r in runs.items()} == {first: 1, second: 2, third: 2}, runs
    # the unreached point ran once: in the re-run's allocation only
    began = [r for r in runs[third] if glob.glob(os.path.join(r, "logs", "*.info"))]
    assert began == [runs[third][1]], began
