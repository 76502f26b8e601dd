"""The submission defects of issue 8, each refused or fixed on the real local cluster: values
sbatch cannot take, --time UNLIMITED, a runs dir that is a file, render vs submission run
dirs, --no-wait with Slurm, a missing --model; and the versioned, backend-independent records."""

import json
import os
import re

import pytest

from jobs.api import JobRequest, submit
from jobs.errors import RequestError
from jobs.runs.records import RECORD_VERSION, JobRecord, RunRecord

from submit_helpers import Cli

pytestmark = pytest.mark.slurm
HELLO = ["--profile", "ci", "--model", "hello", "--nodes", "1", "--gpus-per-node", "1", "--time", "5"]


def _queued(cluster):
    return set(cluster.run(["squeue", "-h", "-o", "%i"]).stdout.split())


def _refused(proc, needle):
    """One `recsys-submit: error:` line naming `needle`, exit 2, nothing on stdout."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("recsys-submit: error:"), proc.stderr
    assert needle in lines[0], lines[0]
    assert proc.stdout == ""
    return lines[0]


def test_runs_dir_sbatch_cannot_take_is_refused_naming_runs_dir(slurm_cluster, tmp_path):
    runs_dir = tmp_path / 'runs "quoted"'
    cli = Cli(slurm_cluster.env, runs_dir)
    before = _queued(slurm_cluster)
    line = _refused(cli("train", *HELLO, "--runs-dir", runs_dir), "--runs-dir")
    assert "--output" not in line
    assert not runs_dir.exists()                  # no run dir (nor runs dir) left behind
    assert _queued(slurm_cluster) <= before


def test_profile_account_with_command_and_newline_is_refused_before_the_run_dir(cli, slurm_cluster, tmp_path):
    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil.yaml"
    evil.write_text(f'extends: ci\naccount: "acct$(touch {marker})\\nsecond"\n')
    before = _queued(slurm_cluster)
    line = _refused(cli("train", *HELLO[2:], "--profile", str(evil)), "account")
    assert f"{evil}: account: has the control character" in line and "--output" not in line   # refused on load
    assert not os.path.exists(cli.runs_dir)
    assert not marker.exists()
    assert _queued(slurm_cluster) <= before


def test_time_unlimited_is_refused_on_the_command_line_as_in_a_profile(cli, slurm_cluster, tmp_path):
    for spelling in ("UNLIMITED", "infinite"):
        _refused(cli("train", *HELLO, "--time", spelling), "--time")
    profile = tmp_path / "forever.yaml"
    profile.write_text("extends: ci\ndefaults:\n  time: UNLIMITED\n")
    proc = cli("train", "--profile", str(profile), "--model", "hello", "--nodes", "1")
    assert proc.returncode == 2 and "defaults.time" in proc.stderr
    assert not os.path.exists(cli.runs_dir)


@pytest.mark.parametrize("below", ["", "sub"])
def test_runs_dir_that_is_a_file_is_one_line(slurm_cluster, tmp_path, below):
    path = tmp_path / "a-file"
    path.write_text("not a directory\n")
    cli = Cli(slurm_cluster.env, tmp_path / "unused")
    proc = cli("train", *HELLO, "--runs-dir", path / below if below else path)
    assert "Traceback" not in proc.stderr
    _refused(proc, "--runs-dir")
    assert path.read_text() == "not a directory\n"


def _run_dir_line(text):
    [line] = [ln for ln in text.splitlines() if ln.startswith("export RECSYS_RUN_DIR=")]
    return line.split("=", 1)[1]


def _stampless(path):
    return re.sub(r"-\d{8}-\d{6}(-\d+)?$", "-<stamp>", path)


def test_render_and_dry_run_use_runs_dir_like_a_submission(slurm_cluster, tmp_path):
    cli = Cli(slurm_cluster.env, tmp_path / "env-runs")    # $RECSYS_RUNS_DIR, overridden by the flag
    runs_dir = tmp_path / "flag-runs"
    rendered = cli("render", "benchmark", *HELLO, "--runs-dir", runs_dir, check=True).stdout
    dry = cli("benchmark", *HELLO, "--runs-dir", runs_dir, "--dry-run", check=True).stdout
    assert not runs_dir.exists() and not os.path.exists(cli.runs_dir)
    run_dir, record = cli.submit("benchmark", *HELLO, "--runs-dir", runs_dir)
    assert slurm_cluster.wait_job(record["jobs"][0]["job_id"]) == "COMPLETED"
    submitted = _run_dir_line(open(os.path.join(run_dir, "main.sbatch")).read())
    assert submitted == run_dir and os.path.dirname(run_dir) == str(runs_dir)
    for text in (rendered, dry):
        assert _stampless(_run_dir_line(text)) == _stampless(submitted)


def test_no_wait_with_slurm_is_refused_and_missing_model_is_named(cli, slurm_cluster):
    before = _queued(slurm_cluster)
    _refused(cli("benchmark", *HELLO, "--no-wait"), "--no-wait")
    line = _refused(cli("train", "--profile", "ci"), "--model: required for train")
    assert "None" not in line
    line = _refused(cli("preprocess", "--profile", "ci", "--input", "a", "--output", "b"),
                    "--dataset: required for preprocess")
    assert "None" not in line
    assert not os.path.exists(cli.runs_dir)
    assert _queued(slurm_cluster) <= before


def test_records_have_one_versioned_schema_for_slurm_and_local(slurm_env, tmp_path, monkeypatch):
    for var in ("OMPI_MCA_btl", "OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include"):
        monkeypatch.setenv(var, slurm_env.env.get(var, "lo"))
    hello = dict(model="hello", gpus_per_node=1, time="5")
    slurm = submit([JobRequest(kind="benchmark", nodes=1, **hello)], "ci", runs_dir=str(tmp_path / "s"))
    local = submit([JobRequest(kind="benchmark", **hello)], "local", runs_dir=str(tmp_path / "l"), log=None)
    assert slurm_env.wait_job(slurm.jobs[0].job_id) == "COMPLETED"
    assert local.error is None and local.foreground and not slurm.foreground
    records = [json.load(open(os.path.join(r.run_dir, "jobs.json"))) for r in (slurm, local)]
    assert set(records[0]) == set(records[1]) and records[0]["version"] == RECORD_VERSION
    assert set(records[0]["jobs"][0]) == set(records[1]["jobs"][0]) == set(JobRecord._keys())
    assert [r["scheduler"] for r in records] == ["slurm", "local"]
    for run in (slurm, local):
        request = json.load(open(os.path.join(run.run_dir, "request.json")))
        assert request["version"] == RECORD_VERSION and request["profile"]["name"] == run.profile
        assert request["requests"][0]["payload"] == "hello"


def test_unknown_record_version_is_one_line(cli, tmp_path):
    run_dir = tmp_path / "runs" / "old-run"
    os.makedirs(run_dir / "logs")
    RunRecord(run_dir=str(run_dir), profile="ci", profile_path=None, scheduler="slurm",
              version=RECORD_VERSION + 98).save()
    with pytest.raises(RequestError, match="record version 99"):
        RunRecord.load(str(run_dir))
    line = _refused(cli("status", str(run_dir)), "record version 99")
    assert "jobs.json" in line


def test_record_written_before_versioning_still_reads(tmp_path):
    """jobs.json of the previous release (no version; local entries with tag/submitit_folder)."""
    legacy = {"run_dir": str(tmp_path), "profile": "local", "profile_path": None, "scheduler": "local",
              "accounting": False, "state": "submitted",
              "jobs": [{"key": "main", "name": "benchmark-hello", "job_id": "4242", "tag": "local1",
                        "task_index": None, "submitit_folder": str(tmp_path / "submitit"), "ntasks": 2,
                        "array_size": 0}]}
    (tmp_path / "jobs.json").write_text(json.dumps(legacy))
    record = RunRecord.load(str(tmp_path))
    assert record.version == RECORD_VERSION and record.scheduler == "local"
    assert (record.jobs[0].job_id, record.jobs[0].ntasks, record.jobs[0].outcome) == ("4242", 2, "submitted")
    assert record["jobs"][0]["key"] == "main" and "tag" not in record.jobs[0].to_dict()
