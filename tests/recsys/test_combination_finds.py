"""The combination matrix's first finds that its own runs cannot show (issue 45 section 1, issue 47
item 10): --amp training on at a NaN loss, a rank stuck before Horovod's initialisation, replicas
whose full weights differ where the sampled check does not look. The Wide & Deep --amp
model-parallel deadlock and the restored run's throughput are rows of the matrix itself
(tests/recsys/test_combinations.py)."""
from __future__ import annotations

import subprocess

import pytest

from tests.recsys.conftest import (REPO, SMALL, base_env, finish_all, mpirun_cmd, read_log, records, summary,
                                   train_cmd)


def _start(cmd, **env):
    full = base_env()
    full.update(env)
    return subprocess.Popen(cmd, env=full, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _errors(stderr):
    return [line for line in stderr.splitlines() if line.startswith("recsys-train: error:")]


def test_amp_nan_loss_fails(tiny_data, tmp_path):
    """--amp at a learning rate that makes the loss NaN: every step is skipped. Run long enough, the
    loss scale reaches its floor (1) while skipping; stopped earlier, the last loss is NaN. Both end
    non-zero with one line (before: exit 0, final_loss=nan)."""
    base = ["--model", "dlrm", "--data-path", tiny_data("dlrm"), *SMALL["dlrm"], "--lr", "1e5", "--amp",
            "--batch-size", "64",
            "--epochs", "1", "--log-every", "2"]
    floor, last = finish_all([_start(train_cmd(*base, "--max-steps", "24", "--log-path", tmp_path / "floor.jsonl")),
                              _start(train_cmd(*base, "--max-steps", "6", "--log-path", tmp_path / "last.jsonl"))],
                             timeout=240)
    for res in (floor, last):
        assert res.returncode == 1, res.stderr[-2000:]
        assert len(_errors(res.stderr)) == 1, res.stderr[-2000:]
    assert "loss scale at its floor (1): every step is skipped" in _errors(floor.stderr)[0]
    assert "the training loss of the last step is nan (--amp skipped it)" in _errors(last.stderr)[0]
    stopped = [r["step"] for r in records(read_log(tmp_path / "floor.jsonl"), "diverged")]
    assert len(stopped) == 1 and stopped[0] < 24, stopped          # at the floor, before --max-steps


def test_two_rank_finds(tiny_data, tmp_path):
    """Side by side: (a) rank 1 stopped before the engine starts: rank 0 waits in Horovod's
    initialisation, and its watchdog (armed before it, the start-up limit from
    $RECSYS_STARTUP_TIMEOUT, a profile's startup_timeout) names the rank within that limit (before:
    the watchdog started after hvd.init, which never returned). (b) A replicated run whose replicas
    differ in a row the sampled check does not read: the full digests differ and the run fails
    (before: exit 0)."""
    stopped = ["bash", "-c", 'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then kill -STOP $$; fi; exec "$@"', "rank",
               *train_cmd("--model", "dlrm", "--data-path", tiny_data("dlrm"), *SMALL["dlrm"], "--epochs", "1",
                          "--max-steps", "2", "--log-path", tmp_path / "stuck.jsonl")]
    cmd = mpirun_cmd(2, stopped)
    cmd[1:1] = ["-x", "RECSYS_STARTUP_TIMEOUT"]
    drift = mpirun_cmd(2, train_cmd("--model", "dlrm", "--data-path", tiny_data("dlrm"), *SMALL["dlrm"],
                                    "--epochs", "1", "--max-steps", "2", "--embedding-placement", "replicated",
                                    "--log-path", tmp_path / "drift.jsonl"))
    drift[1:1] = ["-x", "RECSYS_TEST_UNSAMPLED_DRIFT"]
    stuck, drifted = finish_all([_start(cmd, RECSYS_STARTUP_TIMEOUT="12"),
                                 _start(drift, RECSYS_TEST_UNSAMPLED_DRIFT="1")], timeout=240)
    assert stuck.returncode != 0
    line = _errors(stuck.stderr)
    assert len(line) == 1, stuck.stderr[-3000:]
    assert "hung: rank 0 waits in Horovod's initialisation" in line[0] and "(limit 12 s)" in line[0], line
    assert "waits for rank 1 (no heartbeat at all)" in line[0], line
    hang = records(read_log(tmp_path / "stuck.jsonl"), "hang")
    assert [h["waits_for"] for h in hang] == [[1]]

    assert drifted.returncode == 1, drifted.stderr[-3000:]
    assert any("full weight digests per rank" in e and "the sampled check passed" in e
               for e in _errors(drifted.stderr)), drifted.stderr[-3000:]
    s = summary(read_log(tmp_path / "drift.jsonl"))
    assert len(set(s["replica_state_digests"])) == 1 and len(set(s["replica_weight_digests"])) == 2


@pytest.mark.fast
def test_startup_limit_from_a_profile():
    """A profile's startup_timeout reaches the job as $RECSYS_STARTUP_TIMEOUT, which sets the
    watchdog's limit before the first step (default 30 min); a bad value is one line."""
    from jobs.profiles.schema import defaults_env
    from recsys.monitoring.watchdog import STARTUP_LIMIT_S, Watchdog, resolve_startup_limit
    assert defaults_env({"startup_timeout": 300, "hang_timeout": 900}) == {
        "RECSYS_STARTUP_TIMEOUT": "300", "RECSYS_HANG_TIMEOUT": "900"}
    assert resolve_startup_limit({}) == STARTUP_LIMIT_S == 1800.0
    assert resolve_startup_limit({"RECSYS_STARTUP_TIMEOUT": "300"}) == 300.0
    for bad in ("soon", "-1", "0"):
        with pytest.raises(ValueError, match=r"^\$RECSYS_STARTUP_TIMEOUT: "):
            resolve_startup_limit({"RECSYS_STARTUP_TIMEOUT": bad})
    dog = Watchdog(0, 1, None, startup_limit=300.0)
    assert dog.current_limit() == 300.0
    dog.step_done()
    assert dog.current_limit() == 60.0
