"""The no-progress watchdog (recsys.monitoring.watchdog) on a fake clock: its limits, what a rank says when it
fires (itself, its phase, the peer whose heartbeat went stale), a pause of its own process not
counted, and the records the submission layer reads back (jobs.runs.enginelog.hang_reason, the
batch script's hang exit code). The real thing, a stopped rank under srun: tests/jobs/test_hang_slurm.py."""

import json
import os
import re
import time
from pathlib import Path

import pytest

from jobs.runs.enginelog import hang_reason, with_state
from jobs.profiles.schema import defaults_env
from recsys.monitoring import watchdog
from recsys.monitoring.watchdog import HANG_EXIT_CODE, Watchdog, resolve_limit

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _dog(tmp_path, rank=0, size=2, limit=None):
    clock, exits = Clock(), []
    out = open(tmp_path / f"rank{rank}.log", "w+")      # faulthandler writes to a real file
    dog = Watchdog(rank, size, limit, str(tmp_path / "main-7.engine.jsonl"), stream=out, clock=clock,
                   exit=exits.append)
    os.makedirs(dog.beats, exist_ok=True)
    return dog, clock, exits, out


def test_limits_long_before_the_first_step_then_scaled_or_given():
    dog = Watchdog(0, 1, None, clock=Clock())
    assert dog.current_limit() == watchdog.STARTUP_LIMIT_S          # start-up: tracing, compiling
    dog.step_done()
    dog._clock.now += 0.5
    dog.step_done()
    assert dog.slowest == pytest.approx(0.5)
    assert dog.current_limit() == watchdog.HANG_FLOOR_S              # max(60 s, 20 x 0.5 s)
    dog._clock.now += 10
    dog.step_done()
    assert dog.current_limit() == pytest.approx(200.0)              # 20 x the slowest step
    dog.outside_steps("the epoch's checkpoint and evaluation")
    assert dog.current_limit() == watchdog.STARTUP_LIMIT_S
    given = Watchdog(0, 1, 8.0, clock=Clock())
    given.step_done()
    assert given.current_limit() == 8.0


def test_limit_from_flag_then_environment_and_bad_values_one_line():
    assert resolve_limit(5.0, {"RECSYS_HANG_TIMEOUT": "30"}) == 5.0
    assert resolve_limit(None, {"RECSYS_HANG_TIMEOUT": "30"}) == 30.0
    assert resolve_limit(None, {}) is None
    assert resolve_limit(0.0, {}) == 0.0
    for bad in ("soon", "-3", "inf"):
        with pytest.raises(ValueError, match=r"^\$RECSYS_HANG_TIMEOUT: "):
            resolve_limit(None, {"RECSYS_HANG_TIMEOUT": bad})


def test_fires_naming_itself_its_phase_and_the_stopped_peer(tmp_path, monkeypatch):
    marker = tmp_path / "main-7.hung"
    monkeypatch.setenv("RECSYS_HANG_MARKER", str(marker))
    dog, clock, exits, out = _dog(tmp_path, limit=8.0)
    dog.step_done(41)
    dog.phase(watchdog.FUSED_STEP)
    # rank 1's heartbeat: written 30 s ago (its process stopped since)
    (Path(dog.beats) / "rank1.json").write_text(json.dumps({"rank": 1, "phase": watchdog.INPUT, "step": 40,
                                                            "time": time.time() - 30}))
    clock.now += 5
    assert not dog.tick(clock.now - 1, 0.8) and exits == []
    clock.now += 4
    assert dog.tick(clock.now - 1, 0.8) and exits == [HANG_EXIT_CODE]
    text = (tmp_path / "rank0.log").read_text()
    first = text.splitlines()[0]
    assert first.startswith(f"recsys-train: error: hung: rank 0 waits in {watchdog.FUSED_STEP} at step 41: "
                            "no step completed for 9 s (limit 8 s); waits for rank 1 (no heartbeat for 30 s")
    assert "most recent call first" in text                      # faulthandler's stack dump
    (record,) = [json.loads(line) for line in open(dog.log_path)]
    assert record["type"] == "hang" and record["rank"] == 0 and record["waits_for"] == [1]
    assert marker.exists()
    # its own heartbeat was written on each tick
    assert json.loads((Path(dog.beats) / "rank0.json").read_text())["step"] == 41


def test_every_peer_alive_is_a_deadlock_not_a_stopped_rank(tmp_path):
    dog, clock, exits, out = _dog(tmp_path, rank=1, limit=8.0)
    dog.step_done(3)
    dog.phase("gradient exchange (allreduce/allgather), split step")
    (Path(dog.beats) / "rank0.json").write_text(json.dumps({"rank": 0, "phase": "optimizer, split step",
                                                            "step": 3, "time": time.time()}))
    clock.now += 9
    dog.tick(clock.now - 0.8, 0.8)
    line = (tmp_path / "rank1.log").read_text().splitlines()[0]
    assert "hung: rank 1 waits in gradient exchange" in line
    assert "every other rank is alive (a deadlock, not a stopped rank): rank 0 alive, in optimizer" in line


def test_time_this_process_was_not_running_is_not_counted(tmp_path):
    """A stopped rank resumed only to be killed (or a suspended job resumed) does not fire."""
    dog, clock, exits, out = _dog(tmp_path, limit=8.0)
    dog.step_done(5)
    previous = clock.now
    clock.now += 60                     # one tick 60 s late: the process itself was stopped
    assert not dog.tick(previous, 0.8)
    assert exits == [] and clock.now - dog._last < 8


def test_hang_reason_prefers_the_rank_that_names_a_peer_and_only_the_last_start(tmp_path):
    log = tmp_path / "main-7.engine.jsonl"
    lines = [{"type": "startup", "phase": "horovod_init"},
             {"type": "hang", "rank": 0, "waits_for": [], "message": "hung: rank 0 old attempt"},
             {"type": "startup", "phase": "horovod_init"},
             {"type": "hang", "rank": 0, "waits_for": [], "message": "hung: rank 0 waits in x"},
             {"type": "hang", "rank": 2, "waits_for": [1], "message": "hung: rank 2 waits in y; waits for rank 1"}]
    log.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"type": "hang", "ra')   # torn last line
    assert hang_reason([str(log)]) == "hung: rank 2 waits in y; waits for rank 1"
    assert hang_reason([str(tmp_path / "absent.jsonl")]) is None


def test_state_said_once_in_a_reason():
    assert with_state("CANCELLED", "CANCELLED: rank 1: slurmstepd: error: ...") == "CANCELLED: rank 1: slurmstepd: error: ..."
    assert with_state("HUNG", "hung: rank 0 waits in x") == "hung: rank 0 waits in x"
    assert with_state("FAILED", "rank 0: boom") == "FAILED: rank 0: boom"
    assert with_state(None, "why") == "why" and with_state("TIMEOUT", None) == "TIMEOUT"


def test_batch_script_knows_the_engines_hang_exit_code_and_profile_defaults_reach_the_job():
    template = (REPO / "slurm" / "job.sbatch.tmpl").read_text()
    assert re.search(r"^recsys_hang_exit=(\d+)", template, re.M).group(1) == str(HANG_EXIT_CODE)
    assert defaults_env({"hang_timeout": 900, "horovod_stall_check_seconds": 120,
                         "horovod_stall_shutdown_seconds": 600, "binding": "off"}) == {
        "RECSYS_HANG_TIMEOUT": "900", "HOROVOD_STALL_CHECK_TIME_SECONDS": "120",
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "600"}
