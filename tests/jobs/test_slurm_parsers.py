"""The Slurm backend's parsers and state map on outputs recorded from the real test cluster
(tests/jobs/recorded/, made by tests/jobs/record_slurm_outputs.py from jobs in known states), and
the one-call status poll fed those outputs. No cluster: the fast tier."""

import json
import subprocess
from pathlib import Path

import pytest

from jobs import states
from jobs.backends.slurm import commands, poll, queries
from jobs.backends.slurm.states import STATE_MAP, to_state
from jobs.runs.records import JobRecord, RunRecord

pytestmark = pytest.mark.fast

RECORDED = Path(__file__).resolve().parent / "recorded"
MANIFEST = json.loads((RECORDED / "manifest.json").read_text())
TAGS = ("noacct", "acct")


def _text(name):
    return (RECORDED / f"{name}.txt").read_text()


def _expected(tag):
    """{task id: toolkit state} of every job the recorder made, from how it made them."""
    jobs, expect = MANIFEST[tag]["jobs"], MANIFEST["expect"]
    out = {jobs[label]: expect[label] for label in ("ok", "bad", "never", "cancelled", "running")}
    out.update({f"{jobs['array']}_{i}": expect[f"array_{i}"] for i in range(4)})
    return out


@pytest.mark.parametrize("tag", TAGS)
def test_squeue_states_of_every_job_and_array_task(tag):
    found, never = queries.parse_squeue(_text(f"{tag}-squeue-states"))
    assert found == _expected(tag)
    assert never == {MANIFEST[tag]["jobs"]["never"]}


def test_sacct_states_expand_a_pending_array_range():
    """sacct prints the throttled tasks as one row `6_[1-3%1]`; each task gets its state, and
    `CANCELLED by 0` is CANCELLED."""
    text = _text("acct-sacct-states")
    assert "_[1-3%1]|PENDING" in text and "CANCELLED by 0" in text
    assert queries.parse_sacct(text) == _expected("acct")


def test_sacct_without_accounting_fails_so_status_falls_back_to_squeue():
    assert MANIFEST["noacct"]["outputs"]["noacct-sacct-states"]["returncode"] != 0
    assert "accounting storage is disabled" in MANIFEST["noacct"]["outputs"]["noacct-sacct-states"]["stderr"]


@pytest.mark.parametrize("tag", TAGS)
def test_scontrol_show_job(tag):
    assert queries.parse_scontrol_job(_text(f"{tag}-scontrol-job-completed")) == states.COMPLETED
    assert queries.parse_scontrol_job(_text(f"{tag}-scontrol-job-array-task")) == states.PENDING
    assert queries.parse_scontrol_job("") is None


@pytest.mark.parametrize("name", ["noacct-squeue-ids", "acct-squeue-ids", "acct-sacct-ids"])
def test_known_ids_for_after_checks(name):
    """The ids `--after` may name: every job, every array task and the array as a whole; the
    unknown id the recorder asked for is not among them."""
    tag = name.split("-")[0]
    jobs = MANIFEST[tag]["jobs"]
    known = queries.parse_known_ids(_text(name))
    assert set(jobs.values()) <= known
    assert {f"{jobs['array']}_{i}" for i in range(4)} <= known
    assert MANIFEST["unknown_id"] not in known


@pytest.mark.parametrize("tag", TAGS)
def test_squeue_of_only_unknown_ids_is_an_error_the_backend_reads_as_missing(tag):
    out = MANIFEST[tag]["outputs"][f"{tag}-squeue-ids-unknown"]
    assert out["returncode"] != 0 and "invalid job id" in out["stderr"].lower()
    assert _text(f"{tag}-squeue-ids-unknown") == ""


@pytest.mark.parametrize("tag", TAGS)
def test_token_lookup_finds_the_job_submitted_with_it(tag):
    text = _text(f"{tag}-squeue-token")
    assert commands.job_with_token(text, MANIFEST["token"]) == MANIFEST[tag]["jobs"]["running"]
    assert commands.job_with_token(text, "f" * 16) is None


@pytest.mark.parametrize("tag", TAGS)
def test_config_says_whether_accounting_is_on(tag):
    config = commands.parse_config(_text(f"{tag}-scontrol-config"))
    storage = config["AccountingStorageType"]
    assert storage.endswith("/none") == (tag == "noacct"), storage
    assert config["MaxArraySize"].isdigit()


def test_every_slurm_word_maps_to_a_toolkit_state():
    assert set(STATE_MAP.values()) <= states.STATES
    assert all(to_state(word) in states.ACTIVE for word in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING",
                                                             "REQUEUED", "SUSPENDED", "REQUEUE_HOLD"))
    assert all(to_state(word) in states.TERMINAL for word in ("COMPLETED", "FAILED", "CANCELLED by 1234", "TIMEOUT",
                                                               "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                                                               "DEADLINE", "COMPLETED+"))
    # a word this Slurm does not print, or nothing at all: unknown, never a failure
    assert to_state("EXPLODED") == to_state("") == to_state(None) == states.UNKNOWN
    assert states.UNKNOWN not in states.TERMINAL | states.ACTIVE


def test_one_poll_reads_the_recorded_squeue_once_for_every_run(tmp_path, monkeypatch):
    """The poll logic on the recorded answer: two runs, one squeue call, states per task, the job
    that can never start makes its run done-and-failed, and terminal states are cached so the
    next poll asks about the unfinished jobs only."""
    jobs = MANIFEST["noacct"]["jobs"]
    calls = []

    def recorded_squeue(args):
        calls.append(args)
        assert args[:len(queries.SQUEUE_STATES)] == queries.SQUEUE_STATES
        return subprocess.CompletedProcess(args, 0, _text("noacct-squeue-states"), "")

    monkeypatch.setattr(queries, "_call", recorded_squeue)
    runs = []
    for name, keys in (("a", ("ok", "bad", "never")), ("b", ("running", "array"))):
        run_dir = tmp_path / name
        (run_dir / "logs").mkdir(parents=True)
        record = RunRecord(run_dir=str(run_dir), profile="ci", profile_path=None, scheduler="slurm",
                           jobs=[JobRecord(key=k, name=k, job_id=jobs[k], array_size=4 if k == "array" else 0)
                                 for k in keys])
        runs.append((str(run_dir), record))
    first, second = poll.poll_many(runs)
    assert len(calls) == 1 and set(calls[0][-1].split(",")) == {jobs[k] for k in ("ok", "bad", "never", "running", "array")}
    assert [j.state for j in first.jobs] == ["COMPLETED", "FAILED", "PENDING"]
    assert first.done and "DependencyNeverSatisfied" in first.jobs[2].reason
    assert [j.state for j in second.jobs] == ["RUNNING", "3 PENDING, 1 RUNNING"] and not second.done
    cached = json.loads((tmp_path / "a" / "status.json").read_text())
    assert cached["version"] == poll.CACHE_VERSION
    assert {t: seen["state"] for t, seen in cached["tasks"].items()} == \
        {jobs["ok"]: "COMPLETED", jobs["bad"]: "FAILED", jobs["never"]: "PENDING"}
    poll.poll_many(runs)
    assert set(calls[1][-1].split(",")) == {jobs[k] for k in ("never", "running", "array")}


# scontrol's answer about a job it has no record of, as recorded from the test cluster
INVALID_JOB = MANIFEST["noacct"]["outputs"]["noacct-scontrol-job-unknown"]["stderr"] + "\n"


def _one_job_run(tmp_path, name="r", accounting=False, job_id="7"):
    run_dir = tmp_path / name
    (run_dir / "logs").mkdir(parents=True)
    return str(run_dir), RunRecord(run_dir=str(run_dir), profile="ci", profile_path=None, scheduler="slurm",
                                   accounting=accounting, jobs=[JobRecord(key="main", name="m", job_id=job_id)])


def _answers(monkeypatch, table):
    """Feed queries._call from {command name: CompletedProcess or callable(args)}; log the calls."""
    calls = []

    def call(args):
        calls.append(args[0])
        queries.CALLS["count"] += 1
        answer = table[args[0]]
        return answer(args) if callable(answer) else answer

    monkeypatch.setattr(queries, "_call", call)
    return calls


def _proc(stdout="", returncode=0, stderr=""):
    return subprocess.CompletedProcess([], returncode, stdout, stderr)


def test_a_job_sacct_has_not_heard_of_is_asked_of_the_queue(tmp_path, monkeypatch):
    """sacct learns of a job seconds after sbatch: the job is then absent from its answer (the
    recorded header alone), so the same poll asks squeue, which has it PENDING. Once sacct knows,
    a poll is one call again."""
    header = _text("acct-sacct-states").splitlines()[0] + "\n"
    calls = _answers(monkeypatch, {"sacct": _proc(header), "squeue": _proc("7|PENDING|Priority\n")})
    result, = poll.poll_many([_one_job_run(tmp_path, accounting=True)])
    assert calls == ["sacct", "squeue"] and result.calls == 2 and result.source == "sacct+squeue"
    assert result.jobs[0].state == states.PENDING and not result.done
    calls = _answers(monkeypatch, {"sacct": _proc(header + "7|RUNNING|0:0|node1\n")})
    result, = poll.poll_many([_one_job_run(tmp_path, name="r2", accounting=True)])
    assert calls == ["sacct"] and result.jobs[0].state == states.RUNNING


def test_a_job_no_source_knows_yet_is_unknown_not_failed(tmp_path, monkeypatch):
    """Nothing answers for it (sacct lag, squeue and scontrol silent): UNKNOWN, not done."""
    _answers(monkeypatch, {"sacct": _proc(""), "squeue": _proc(""), "scontrol": _proc("")})
    result, = poll.poll_many([_one_job_run(tmp_path, accounting=True)])
    assert result.jobs[0].state == states.UNKNOWN and not result.done


def test_a_forgotten_job_keeps_the_state_a_poll_saw_and_is_not_asked_again(tmp_path, monkeypatch):
    """No accounting: a job seen CANCELLED, then purged by Slurm (MinJobAge), keeps CANCELLED;
    the next polls ask nothing about it."""
    item = _one_job_run(tmp_path)
    calls = _answers(monkeypatch, {"squeue": _proc("7|CANCELLED|None\n")})
    assert poll.poll_many([item])[0].jobs[0].state == states.CANCELLED
    calls = _answers(monkeypatch, {"squeue": _proc("", 1, INVALID_JOB), "scontrol": _proc("", 1, INVALID_JOB)})
    for _ in range(3):
        result, = poll.poll_many([item])
        assert result.jobs[0].state == states.CANCELLED and result.done and result.calls == 0
    assert calls == []


def test_a_job_that_ended_unseen_and_was_forgotten_is_settled_once(tmp_path, monkeypatch):
    """Last seen PENDING, then gone from Slurm with no exit record: failed with that reason, asked
    once (squeue + scontrol), never again."""
    item = _one_job_run(tmp_path)
    _answers(monkeypatch, {"squeue": _proc("7|PENDING|Priority\n")})
    assert poll.poll_many([item])[0].jobs[0].state == states.PENDING
    calls = _answers(monkeypatch, {"squeue": _proc("", 1, INVALID_JOB), "scontrol": _proc("", 1, INVALID_JOB)})
    result, = poll.poll_many([item])
    assert calls == ["squeue", "scontrol"]
    assert result.jobs[0].state == states.FAILED and result.done
    assert "no longer knows job 7" in result.jobs[0].reason and "logs/main-7.info" in result.jobs[0].reason
    assert poll.poll_many([item])[0].calls == 0 and calls == ["squeue", "scontrol"]


def test_an_exit_record_settles_a_job_the_queue_forgot(tmp_path, monkeypatch):
    run_dir, record = item = _one_job_run(tmp_path)
    Path(run_dir, "logs", "main-7.info").write_text("start=1\nexit_code=0\n")
    calls = _answers(monkeypatch, {"squeue": _proc("", 1, INVALID_JOB)})
    assert poll.poll_many([item])[0].jobs[0].state == states.COMPLETED and calls == ["squeue"]


def test_an_unreachable_controller_is_an_error_not_a_forgotten_job(tmp_path, monkeypatch):
    from jobs.errors import SlurmCommandError

    item = _one_job_run(tmp_path)
    _answers(monkeypatch, {"squeue": _proc("", 1, INVALID_JOB),
                           "scontrol": _proc("", 1, "slurm_load_jobs error: Unable to contact slurm controller "
                                                    "(connect failure)\n")})
    with pytest.raises(SlurmCommandError) as caught:
        poll.poll_many([item])
    assert caught.value.transient
    assert not Path(item[0], "status.json").exists()


def test_a_cache_of_the_first_format_is_read(tmp_path, monkeypatch):
    run_dir, _ = item = _one_job_run(tmp_path)
    Path(run_dir, "status.json").write_text(json.dumps({"7": "TIMEOUT"}))
    calls = _answers(monkeypatch, {})
    assert poll.poll_many([item])[0].jobs[0].state == states.TIMEOUT and calls == []


def test_recorded_outputs_are_of_the_commands_the_backend_runs():
    """A query changed without re-recording would test stale text: the argv must still match."""
    for tag in TAGS:
        outputs = MANIFEST[tag]["outputs"]
        assert outputs[f"{tag}-squeue-states"]["argv"][:len(queries.SQUEUE_STATES)] == queries.SQUEUE_STATES
        assert outputs[f"{tag}-squeue-ids"]["argv"][:len(queries.SQUEUE_IDS)] == queries.SQUEUE_IDS
        assert outputs[f"{tag}-squeue-token"]["argv"] == commands.SQUEUE_TOKENS
    assert MANIFEST["acct"]["outputs"]["acct-sacct-states"]["argv"][:len(queries.SACCT_STATES)] == queries.SACCT_STATES
    assert MANIFEST["acct"]["outputs"]["acct-sacct-ids"]["argv"][:len(queries.SACCT_IDS)] == queries.SACCT_IDS


def test_with_accounting_a_purged_job_sacct_has_not_recorded_yet_stays_unknown(tmp_path, monkeypatch):
    """The controller forgot it before sacct recorded it: sacct will, so it is not settled."""
    header = _text("acct-sacct-states").splitlines()[0] + "\n"
    _answers(monkeypatch, {"sacct": _proc(header), "squeue": _proc("", 1, INVALID_JOB),
                           "scontrol": _proc("", 1, INVALID_JOB)})
    run_dir, _ = item = _one_job_run(tmp_path, accounting=True)
    result, = poll.poll_many([item])
    assert result.jobs[0].state == states.UNKNOWN and not result.done
    assert not Path(run_dir, "status.json").exists()


def test_the_shared_study_name_of_every_user_from_squeue():
    """Jobs of the shared study name from two users (record_shared_name): each one's user,
    state, pending reason and batch script; a job of another name is not asked for."""
    shared = MANIFEST["shared_name"]
    assert shared["outputs"]["noacct-squeue-named"]["argv"] == queries.SQUEUE_NAMED + ["--name=recsys-study-shared"]
    found = {j.job_id: j for j in queries.parse_named(_text("noacct-squeue-named"))}
    jobs, users = shared["jobs"], shared["users"]
    assert set(found) == {jobs[k] for k in ("mine", "mine_next", "theirs", "theirs_held")}
    for label, state in shared["expect"].items():
        job = found[jobs[label]]
        assert job.state == state and job.user == users[label.split("_")[0]], job
    assert found[jobs["mine_next"]].reason == "Dependency" and found[jobs["theirs_held"]].reason == "JobHeldUser"
    assert found[jobs["mine"]].reason == "" and found[jobs["theirs"]].reason == ""
    assert found[jobs["theirs"]].script == f"{shared['runs_dir']}/study-theirs/allocations/allocation-1/allocation.sbatch"
