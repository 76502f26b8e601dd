"""Fault 9: `recsys-submit` killed (SIGKILL, no handler runs) at every point of the submission path.

A study run (one point at a time, and the parallel path of a profile whose nodes are not shared)
and a plain `recsys-submit benchmark` are killed by the submission layer's fault points
(jobs.faultpoints: RECSYS_FAULT_AT=NAME[:N] SIGKILLs the process the N-th time it reaches NAME):
after a job's intent is in jobs.json but before `sbatch`, after Slurm accepted the job but before
its id is recorded, and after the id is recorded. Then the same command runs again. What must
hold: every point of the study has exactly one job in Slurm (no duplicate, none lost), no job of
the study is in the queue that the study does not know, the study's status shows every point
pending (none unknown, failed or missing); a killed plain submission's job is shown by `status`
and removed by `cancel`. The jobs are submitted held (`sbatch --hold` from the test profile), so
no engine ever starts: the test measures the records, not training.
"""
from __future__ import annotations

import json
import os
import time

import pytest

from jobs import faultpoints
from tests.faults.record import FaultResult, record
from tests.jobs.study_helpers import TINY_NCF, write_spec

pytestmark = [pytest.mark.faults, pytest.mark.slurm]

GPUS = [1, 2, 4]        # three points
KILLED = -9


def held_profile(tmp_path, shared):
    path = tmp_path / f"held-{'shared' if shared else 'unshared'}.yaml"
    path.write_text("extends: ci\n"
                    "description: the ci cluster, every job submitted held (crash tests)\n"
                    f"shared_nodes: {'true' if shared else 'false'}\n"
                    "sbatch_extra: [\"--hold\"]\n")
    return path


def queue_by_token(cluster):
    """{token: [job ids]} of every job the controller knows whose comment is recsys:<token>."""
    out = {}
    proc = cluster.run(["squeue", "-h", "-a", "--states=all", "-o", "%i|%k"], check=True)
    for line in proc.stdout.splitlines():
        job_id, _, comment = line.partition("|")
        if comment.startswith("recsys:"):
            out.setdefault(comment[len("recsys:"):], []).append(job_id.strip())
    return out


def tokens_of(run_dir):
    """Every token a run's jobs.json names (its jobs' and a pending intent's)."""
    with open(os.path.join(run_dir, "jobs.json")) as handle:
        data = json.load(handle)
    jobs = data["jobs"] + ([data["intent"]] if data.get("intent") else [])
    return {j["token"] for j in jobs if j.get("token")}


def scripts_tokens(study):
    """The token of every script the study's point directories hold (what sbatch may have seen)."""
    out = set()
    points = os.path.join(study, "points")
    for run in os.listdir(points):
        for name in os.listdir(os.path.join(points, run)):
            if name.endswith(".sbatch"):
                with open(os.path.join(points, run, name)) as handle:
                    for line in handle:
                        if line.startswith("#SBATCH --comment=recsys:"):
                            out.add(line.strip().split("recsys:", 1)[1])
    return out


def cancel_all(cluster, tokens, queue):
    ids = [i for t in tokens for i in queue.get(t, [])]
    if ids:
        cluster.run(["scancel", *ids])


@pytest.mark.parametrize("shared", [True, False], ids=["one-at-a-time", "parallel"])
def test_a_study_killed_at_every_submission_point_ends_with_one_job_per_point(slurm_cluster, cli, tmp_path,
                                                                             shared):
    profile = held_profile(tmp_path, shared)
    duplicates = lost = orphans = survived = 0
    started = time.monotonic()
    for point in faultpoints.POINTS:
        name = f"crash-{point}-{'seq' if shared else 'par'}"
        spec = write_spec(tmp_path / f"{name}.yaml", version=1, name=name, model="ncf", scaling="weak",
                          batch_size=64, gpus=GPUS, warmup_steps=1, steps=2,
                          time="00:05:00", synthetic=True, engine_args=TINY_NCF)
        extra = ["--max-concurrent", "10"] if shared else []     # held jobs never free a slot
        killed = cli("study", "run", spec, "--profile", profile, *extra,
                     env=dict(cli.env, RECSYS_FAULT_AT=f"{point}:2"))
        assert killed.returncode == KILLED, (point, killed.returncode, killed.stderr)
        again = cli("study", "run", spec, "--profile", profile, *extra)
        assert again.returncode == 0, (point, again.stdout, again.stderr)
        study = os.path.join(cli.runs_dir, f"study-{name}")
        with open(os.path.join(study, "study.json")) as handle:
            points = json.load(handle)["points"]
        queue = queue_by_token(slurm_cluster)
        per_point = {p["id"]: [j for run in p["runs"] for t in tokens_of(run) for j in queue.get(t, [])]
                     for p in points}
        known = {t for p in points for run in p["runs"] for t in tokens_of(run)}
        stray = [t for t in scripts_tokens(study) if t in queue and t not in known]
        duplicates += sum(len(jobs) - 1 for jobs in per_point.values() if len(jobs) > 1)
        lost += sum(1 for jobs in per_point.values() if not jobs)
        orphans += len(stray)
        proc = cli("study", "status", study, "--json")
        states = sorted(p["state"] for p in json.loads(proc.stdout)["points"])
        ok = all(len(jobs) == 1 for jobs in per_point.values()) and not stray and states == ["pending"] * 3
        survived += ok
        cancel_all(slurm_cluster, known | set(stray), queue)
        assert ok, (point, per_point, stray, states, again.stderr)
    record(FaultResult(fault=f"study run SIGKILLed while submitting ({'one at a time' if shared else 'parallel'})",
                       trials=len(faultpoints.POINTS), survived=survived, data_lost=duplicates + lost + orphans,
                       recover_s=round((time.monotonic() - started) / len(faultpoints.POINTS), 1),
                       detail=f"killed at each of {', '.join(faultpoints.POINTS)} (2nd point), run again: "
                              "one job per point, no orphan, every point pending"))


def test_a_plain_submission_killed_after_sbatch_is_found_by_status_and_cancel(slurm_cluster, cli, tmp_path):
    profile = held_profile(tmp_path, True)
    killed = cli("benchmark", "--profile", profile, "--model", "hello", "--nodes", "1",
                 env=dict(cli.env, RECSYS_FAULT_AT="sbatch-returned"))
    assert killed.returncode == KILLED, killed.stderr
    (run,) = [os.path.join(cli.runs_dir, d) for d in os.listdir(cli.runs_dir)]
    (token,) = tokens_of(run)
    (job_id,) = queue_by_token(slurm_cluster)[token]
    with open(os.path.join(run, "jobs.json")) as handle:
        assert json.load(handle)["jobs"] == []          # the id never reached the record
    status = cli("status", run, "--json")
    assert status.returncode == 0, status.stderr
    jobs = json.loads(status.stdout)["jobs"]
    assert [(j["job_id"], j["state"]) for j in jobs] == [(job_id, "PENDING")], status.stdout
    cancel = cli("cancel", run)
    assert cancel.returncode == 0, cancel.stderr
    assert slurm_cluster.wait_job(job_id, timeout=60) == "CANCELLED"
    with open(os.path.join(run, "jobs.json")) as handle:
        settled = json.load(handle)
    assert settled["state"] == "submitted" and settled["intent"] is None
    assert [j["job_id"] for j in settled["jobs"]] == [job_id]
    record(FaultResult(fault="recsys-submit benchmark SIGKILLed between sbatch and its record", trials=1,
                       survived=1, data_lost=0, recover_s=None,
                       detail="status shows the job (found by its token), cancel removes it"))
