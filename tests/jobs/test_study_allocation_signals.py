"""The study allocation's script as rendered, run by bash without a cluster (its points' scripts
stood in by short shell scripts): a point that fails at its own limit is recorded as timed out
there and the next point runs; the end-of-time signal (USR2 from `--signal`, or a TERM at the
limit) records the running point as timed out and leaves the rest unrun; a TERM well before the
limit (scancel) is no time limit and records nothing of the kind. The fast tier."""

import os
import re
import signal
import subprocess

import pytest

from test_study_allocation_render import _drafts
from tests.waiting import wait_for

pytestmark = pytest.mark.fast


def _records(path):
    try:
        with open(path) as handle:
            return [line.rstrip("\n") for line in handle]
    except FileNotFoundError:
        return []


def _script(tmp_path, point_body, limit_s=None):
    """The allocation's script with every point's script replaced by `point_body` (its limit
    `limit_s` when given); (script path, allocation info path, [point info paths])."""
    _, (draft, points) = _drafts(tmp_path)
    text = draft.text
    if limit_s is not None:
        text = re.sub(r"^(recsys_point .* main \d) \d+$", rf"\g<1> {limit_s}", text, flags=re.M)
    for point in points:
        os.makedirs(os.path.join(point.run_dir, "logs"), exist_ok=True)
        with open(point.script, "w") as handle:
            handle.write(point_body)
    os.makedirs(os.path.join(draft.run_dir, "logs"), exist_ok=True)
    with open(draft.script, "w") as handle:
        handle.write(text)
    return (draft.script, os.path.join(draft.run_dir, "logs", "allocation-local.info"),
            [os.path.join(p.run_dir, "logs", "main-local.info") for p in points])


def _run(script, send=None, when=None):
    """bash SCRIPT (its own session, so its points' stand-ins go with it); `send` a signal once
    `when()` holds. Returns its exit status."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.Popen(["bash", script], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if send is not None:
            wait_for(when, timeout=30, what="the first point to start")
            proc.send_signal(send)
        return proc.wait(timeout=60)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)     # what its points left running
        except ProcessLookupError:
            pass


def test_a_point_that_fails_at_its_own_limit_timed_out_and_the_next_runs(tmp_path):
    # each stand-in records its start, then fails after the limit as a step killed by it would
    body = 'echo "start=$(date +%s)" >> "$(dirname "$0")/logs/main-local.info"; sleep 1.2; exit 143\n'
    script, alloc, points = _script(tmp_path, body, limit_s=1)
    assert _run(script) == 0
    for info in points:          # every point ran in turn, each timed out at its own limit
        assert _records(info)[-2:] == ["timed_out=step", "limit_s=1"], _records(info)
    assert "time_limit" not in "\n".join(_records(alloc)) and _records(alloc)[-1] == "exit_code=0"


def test_a_failure_before_the_limit_is_no_timeout(tmp_path):
    script, _, points = _script(tmp_path, "exit 3\n", limit_s=60)
    assert _run(script) == 0
    assert not any("timed_out" in line for info in points for line in _records(info))


@pytest.mark.parametrize("sig, status", [(signal.SIGUSR2, 140), (signal.SIGTERM, 143)])
def test_the_end_of_time_records_the_running_point_and_leaves_the_rest(tmp_path, sig, status):
    # USR2 comes N s before the limit; a TERM counts as the limit only near it (here: a 1 s limit)
    body = 'echo "start=$(date +%s)" >> "$(dirname "$0")/logs/main-local.info"; sleep 30\n'
    script, alloc, points = _script(tmp_path, body)
    if sig == signal.SIGTERM:
        with open(script) as handle:
            text = handle.read()
        with open(script, "w") as handle:
            handle.write(re.sub(r"^recsys_limit_s=\d+", "recsys_limit_s=1", text, flags=re.M))
    assert _run(script, sig, lambda: any(line.startswith("start=") for line in _records(points[0]))) == status
    records = _records(alloc)
    assert any(line.startswith("time_limit=") for line in records) and records[-1] == f"exit_code={status}"
    assert "timed_out=allocation" in _records(points[0])
    assert _records(points[1]) == [] and _records(points[2]) == []       # not reached: nothing of them ran


def test_a_term_well_before_the_limit_is_no_end_of_time(tmp_path):
    body = 'echo "start=$(date +%s)" >> "$(dirname "$0")/logs/main-local.info"; sleep 30\n'
    script, alloc, points = _script(tmp_path, body)
    assert _run(script, signal.SIGTERM, lambda: _records(points[0])) == 143
    assert not any("time_limit" in line for line in _records(alloc))
    assert "timed_out=allocation" not in _records(points[0])
