"""The polling loop's wake-up (issue 48 item 8: a watch reported a study's end ~40 s late): a watcher
reads a cheap probe of the files its jobs write between polls, and polls at once when a job's logs
appear or its engine writes its summary, while steady logging leaves the back-off alone."""
import json
import threading
import time

import pytest

from jobs.backends.local.states import _newest_line, progress_line
from jobs.polling import poll_until
from jobs.runs import enginelog
from jobs.runs.records import JobRecord

pytestmark = pytest.mark.fast


def _engine_log(run_dir, *records):
    path = run_dir / "logs" / "main-1.engine.jsonl"
    with open(path, "a") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    return path


def test_activity_changes_when_logs_appear_and_a_summary_ends_a_log_not_at_each_step(tmp_path):
    (tmp_path / "logs").mkdir()
    empty = enginelog.activity([str(tmp_path)])
    path = _engine_log(tmp_path, {"type": "startup"})
    started = enginelog.activity([str(tmp_path)])
    assert started != empty                                    # a log appeared: the job started
    _engine_log(tmp_path, {"type": "step", "step": 1}, {"type": "step", "step": 2})
    assert enginelog.activity([str(tmp_path)]) == started      # steady logging: no wake-up
    with open(path, "a") as handle:
        handle.write('{"type": "summary", "step"')            # a torn summary is not an end yet
    assert enginelog.activity([str(tmp_path)]) == started and not enginelog.ends_with_summary(path)
    with open(path, "a") as handle:
        handle.write(': 2}\n')
    assert enginelog.ends_with_summary(path)
    assert enginelog.activity([str(tmp_path)]) != started
    assert enginelog.activity([str(tmp_path / "missing")]) == enginelog.activity([str(tmp_path / "missing")])


def test_a_summary_written_between_polls_is_seen_at_once_not_after_the_back_off(tmp_path):
    """Polls back off 0.05, 0.5, 5, 50 s apart (at 0, 0.05, 0.55, 5.55 s ...); the job ends 1 s in.
    Without the probe the end is seen at 5.55 s; with it, within a probe interval (0.1 s)."""
    (tmp_path / "logs").mkdir()
    path = _engine_log(tmp_path, {"type": "startup"})
    polls = []

    def poll():
        polls.append(time.monotonic())
        return enginelog.ends_with_summary(path)

    timer = threading.Timer(1.0, _engine_log, (tmp_path, {"type": "summary", "step": 9}))   # the "job"
    t0 = time.monotonic()
    timer.start()
    try:
        done = poll_until(poll, bool, first=0.05, factor=10.0, ceiling=60.0, timeout=120,
                          wake=lambda: enginelog.activity([str(tmp_path)]), wake_every=0.1)
    finally:
        timer.cancel()
    assert done
    assert len(polls) == 4, [round(p - t0, 2) for p in polls]  # 3 backing off, then the one the end woke
    assert polls[-1] - t0 < 3, [round(p - t0, 2) for p in polls]


def test_a_foreground_local_jobs_progress_line(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "main-local42.rank0.log").write_bytes(b"loading\nstage 1 \x1b[31m10%\x1b[0m\rstage 1 90%\r\n\n")
    job = JobRecord(key="main", name="preprocess", job_id="42", task_index=None, ntasks=1)
    line = progress_line(str(tmp_path), job, 95.4)
    assert line == "local job main (pid 42) running 0:01:35; last output: stage 1 90%"
    assert progress_line(str(tmp_path / "none"), job, 5) == "local job main (pid 42) running 0:00:05"
    (logs / "main-local42.rank0.log").write_text("x" * 500)
    assert len(_newest_line([str(logs / "main-local42.rank0.log")])) == 160
