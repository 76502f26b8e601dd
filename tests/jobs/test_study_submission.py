"""Submitting a study from one process on the local Slurm cluster, counted: every point's script
is rendered once, and each record is written the fewest times that keep it crash-safe (jobs.json
when the run dir is made, with the job's intent before sbatch and with its id after; study.json
once at the start and once per point, with its run dir before its sbatch). The points go to a partition created DOWN for the test, so they stay pending and never
run; they are cancelled and the partition removed afterwards."""

import collections
import json
import os

import pytest

from jobs.api import run_study
from jobs.study.spec import spec_from_flags

pytestmark = pytest.mark.slurm


@pytest.fixture
def held_profile(slurm_env, tmp_path):
    """A profile like ci whose partition `held` is DOWN: submitted jobs stay pending. Its nodes
    are declared unshared, so a study submits every point at once (as on a real cluster) instead
    of waiting for each pending point to end."""
    slurm_env.run(["scontrol", "create", "PartitionName=held", "Nodes=ALL", "State=DOWN"], check=True)
    path = tmp_path / "held.yaml"
    path.write_text("extends: ci\npartition: held\nshared_nodes: false\n")
    try:
        yield str(path)
    finally:
        slurm_env.run(["scancel", "--partition=held"])
        slurm_env.run(["scontrol", "delete", "PartitionName=held"])


def test_study_renders_each_script_once_and_writes_records_the_fewest_times(held_profile, slurm_env, tmp_path,
                                                                             monkeypatch):
    import jobs.backends.slurm.backend
    import jobs.runs.atomic
    import jobs.runs.records
    import jobs.study.running.record

    renders, writes, durable = [], collections.Counter(), collections.Counter()
    real_render, real_write = jobs.backends.slurm.backend.render, jobs.runs.atomic.write_json

    def counting_render(spec, run_dir, *args, **kwargs):
        renders.append(run_dir)
        return real_render(spec, run_dir, *args, **kwargs)

    def counting_write(path, data, **kwargs):
        writes[os.path.basename(path)] += 1
        durable[os.path.basename(path)] += bool(kwargs.get("durable"))
        return real_write(path, data, **kwargs)

    monkeypatch.setattr(jobs.backends.slurm.backend, "render", counting_render)
    monkeypatch.setattr(jobs.runs.records, "write_json", counting_write)       # jobs.json, request.json
    monkeypatch.setattr(jobs.study.running.record, "write_json", counting_write)  # study.json, results.json
    spec = spec_from_flags("dlrm", "1,2,4", batch_size=512, variants=["precision=tf32,amp"], time="5",
                           name="counted")
    record, submitted = run_study(spec, held_profile, runs_dir=str(tmp_path / "runs"))

    points = len(record.points)
    assert points == 6 and sorted(submitted) == sorted(p.id for p in record.points)
    run_dirs = [p.runs[0] for p in record.points]
    assert sorted(renders) == sorted(run_dirs)                  # one render per script
    assert writes["request.json"] == points
    assert writes["jobs.json"] == 3 * points                    # created, the intent before sbatch, the id after
    assert writes["study.json"] == 1 + points                   # created, then each run dir before its sbatch
    assert +durable == {"jobs.json": points, "study.json": points}  # fsync: only what precedes an sbatch
    assert writes["results.json"] == 1
    tokens = {}
    for run_dir in run_dirs:
        with open(os.path.join(run_dir, "jobs.json")) as handle:
            run = json.load(handle)
        assert run["state"] == "submitted" and len(run["jobs"]) == 1, run
        job = run["jobs"][0]
        with open(job["script"]) as handle:
            assert f"#SBATCH --comment=recsys:{job['token']}\n" in handle.read()
        tokens[job["job_id"]] = job["token"]
    assert len(tokens) == points
    queued = slurm_env.run(["squeue", "-h", "-j", ",".join(tokens), "-o", "%i|%k|%P"], check=True).stdout
    seen = {line.split("|")[0]: line.split("|")[1:] for line in queued.split()}
    assert seen == {job_id: [f"recsys:{token}", "held"] for job_id, token in tokens.items()}
    with open(os.path.join(record.study_dir, "study.json")) as handle:
        assert {p["id"]: p["runs"] for p in json.load(handle)["points"]} == \
            {p.id: p.runs for p in record.points}
