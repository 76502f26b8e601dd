"""What the submission layer reads back from an engine log (jobs.runs.enginelog): the last
`summary` of a version it knows, whatever else the file holds. No cluster: the fast tier."""

import json

import pytest

from jobs.runs import enginelog

pytestmark = pytest.mark.fast


def _log(path, *records, torn=False):
    with open(path, "w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
        if torn:
            handle.write('{"type": "summary", "throughput_samples_per_s": 1')    # a killed job's last line
    return str(path)


def test_the_last_summary_of_a_known_version_counts(tmp_path):
    first = {"type": "summary", "summary_version": 1, "step": 10, "throughput_samples_per_s": 100.0}
    requeued = {"type": "summary", "summary_version": 2, "step": 20, "throughput_samples_per_s": 120.0}
    log = _log(tmp_path / "a.engine.jsonl", {"type": "params"}, first, {"type": "step", "step": 15}, requeued,
               torn=True)
    assert enginelog.summary([log]) == requeued


def test_a_later_summary_version_is_skipped_never_misread(tmp_path):
    """A field of a newer summary format may mean something else: the reader keeps the last
    record it understands (or none), as docs/engine-log.md says."""
    known = {"type": "summary", "summary_version": 1, "step": 10, "throughput_samples_per_s": 100.0}
    newer = {"type": "summary", "summary_version": enginelog.SUMMARY_VERSION + 1, "step": 20,
             "throughput_samples_per_s": 9e9}
    assert enginelog.summary([_log(tmp_path / "a.jsonl", known, newer)]) == known
    assert enginelog.summary([_log(tmp_path / "b.jsonl", newer)]) is None
    for bad in ("1", None, True, 0):
        assert enginelog.summary([_log(tmp_path / "c.jsonl", dict(known, summary_version=bad))]) is None


def test_the_reader_knows_versions_1_to_3(tmp_path):
    """2: the throughput of the slowest rank, and `provenance`; 3: `step_breakdown`, passed through
    (docs/engine-log.md)."""
    assert enginelog.SUMMARY_VERSION == 3
    for version in (1, 2, 3):
        record = {"type": "summary", "summary_version": version, "step": 5, "throughput_samples_per_s": 7.0}
        if version == 3:
            record["step_breakdown"] = {"version": 1, "steps": 5, "mean": {"step_ms": 2.0}}
        assert enginelog.summary([_log(tmp_path / f"v{version}.jsonl", record)]) == record


def test_a_summary_without_a_version_reads_as_version_1(tmp_path):
    old = {"type": "summary", "step": 3, "throughput_samples_per_s": 5.0}
    assert enginelog.summary([_log(tmp_path / "a.jsonl", old)]) == old
    assert enginelog.summary([str(tmp_path / "missing.jsonl")]) is None


def _beat(beats, rank, seconds_ago, phase="start-up", step=0):
    import time

    beats.mkdir(exist_ok=True)
    (beats / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "phase": phase, "step": step,
                                                        "time": time.time() - seconds_ago}))


def test_where_a_job_that_ran_out_of_time_was(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / "main-7.engine.jsonl"
    # a lone rank that wrote nothing: before Horovod's initialisation, rank 0 on its only node
    assert enginelog.stalled_where(str(tmp_path), "main", "7", ["node3"], 1) == \
        "before its first step (start-up, before Horovod's initialisation); rank 0 on node3"
    _log(log, {"type": "startup", "phase": "horovod_init"}, {"type": "startup", "phase": "data"})
    assert enginelog.stalled_where(str(tmp_path), "main", "7", ["node3"], 1).startswith(
        "before its first step (start-up, building its model)")
    # 4 ranks on 2 nodes without heartbeats: no rank named
    assert enginelog.stalled_where(str(tmp_path), "main", "7", ["n1", "n2"], 4) == \
        "before its first step (start-up, building its model)"
    # the rank whose heartbeat is oldest (none at all first) is the one that stopped, on its block's node
    beats = tmp_path / "logs" / "main-7.engine.jsonl.ranks"
    for rank in (0, 1, 3):
        _beat(beats, rank, 1)
    _beat(beats, 1, 40, phase="start-up")
    assert enginelog.stalled_where(str(tmp_path), "main", "7", ["n1", "n2"], 4).endswith("; rank 2 on n2")
    _beat(beats, 2, 2, phase="the fused step", step=5)
    _log(log, {"type": "startup", "phase": "model"}, {"type": "startup", "phase": "first_step"})
    assert enginelog.stalled_where(str(tmp_path), "main", "7", ["n1", "n2"], 4) == \
        "after its first step, in its steps; rank 1 on n1 (last heard in start-up at step 0)"
