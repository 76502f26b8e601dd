"""A study in one allocation, without a cluster: the allocation's script and its points' scripts
as rendered, the `placement` key, the allocation's size, a point's state from its own exit record
while the allocation lives on or after it ended, the report's node sets, and the one study job
name on a profile whose nodes share hardware (Slurm's singleton)."""

import dataclasses
import os
import re

import pytest

from jobs.profiles import load_profile
from jobs.runs.records import JobStatus
from jobs.schedulers import backend_for
from jobs.study.running import allocation, run
from jobs.study.analysis import report_table
from jobs.study.analysis import report_facts
from jobs.study.running import record as study_record
from jobs.study.spec import StudyError, StudySpec, expand, spec_yaml

pytestmark = pytest.mark.fast

SPEC = dict(name="alloc", model="ncf", batch_size=512, warmup_steps=1, steps=2, breakdown_steps=0,
            time="00:05:00", placement="allocation",
            points=[{"nodes": 1, "gpus_per_node": 1}, {"nodes": 2, "gpus_per_node": 1},
                    {"nodes": 1, "gpus_per_node": 2}])


def _drafts(tmp_path, nodes=None, profile="ci"):
    spec = StudySpec.from_dict(dict(SPEC))
    prof = load_profile(profile)
    points = {p.id: p for p in expand(spec, prof)}
    records = [study_record.PointRecord.from_point(p) for p in points.values()]
    study = study_record.StudyRecord(name="alloc", study_dir=str(tmp_path), profile="ci", profile_path=None,
                            scheduler="slurm", spec={}, created=0.0)
    planned = allocation._plan_points(spec, prof, study, records, points, run.point_request)
    alloc = allocation.allocation_spec(spec, planned, nodes)
    dirs = [str(tmp_path / "points" / p.id) for p in records]
    return alloc, backend_for(prof).allocation(alloc, [(s, d) for (_, _, s), d in zip(planned, dirs)],
                                               str(tmp_path / "alloc"), token="t0k3n")


def test_the_allocation_runs_each_points_own_script_on_its_first_nodes(tmp_path):
    alloc, (draft, points) = _drafts(tmp_path)
    assert alloc.nodes == 2 and alloc.ntasks_per_node == 2 and not alloc.requeue
    assert alloc.time_seconds == 3 * (300 + allocation.MARGIN_S)
    text = draft.text
    assert "#SBATCH --nodes=2" in text and "#SBATCH --comment=recsys:t0k3n" in text
    assert "#SBATCH --requeue" not in text
    lines = re.findall(r"^recsys_point (\S+) (\S+) main (\d) (\d+)$", text, re.M)
    # each point with its own limit (the spec's 00:05:00), which its step gets as srun --time
    assert [(d, s, int(n), int(limit)) for d, s, n, limit in lines] == [
        (p.run_dir, p.script, p.spec.nodes, 300) for p in points]
    # the allocation's own end of time is handled: its --signal's USR2, and the TERM at its limit
    assert "trap 'recsys_on_signal 143 TERM' TERM" in text and "trap 'recsys_on_signal 140 USR2' USR2" in text
    assert f"recsys_limit_s={3 * (300 + allocation.MARGIN_S)} " in text
    for point in points:        # the script a separate job runs, plus its node set and time limit, minus requeueing
        assert point.token == draft.token
        assert '${RECSYS_STEP_NODES:+"--nodelist=$RECSYS_STEP_NODES"}' in point.text
        assert re.search(r"^srun .* --time=5 \\$", point.text, re.M), point.text
        assert "recsys_requeue=no" in point.text


def test_an_allocation_smaller_than_the_largest_point_is_refused(tmp_path):
    with pytest.raises(StudyError, match=r"--nodes: .* largest point's 2 node"):
        _drafts(tmp_path, nodes=1)
    alloc, _ = _drafts(tmp_path, nodes=4)
    assert alloc.nodes == 4


def test_points_on_shared_nodes_share_one_singleton_job_name(tmp_path):
    _, (draft, points) = _drafts(tmp_path)
    for text in [draft.text] + [p.text for p in points]:
        assert f"#SBATCH --job-name={run.SHARED_NAME}" in text and "#SBATCH --dependency=singleton" in text
    unshared = tmp_path / "unshared.yaml"
    unshared.write_text("extends: ci\nshared_nodes: false\n")
    _, (draft, points) = _drafts(tmp_path, profile=str(unshared))
    assert "singleton" not in draft.text and "#SBATCH --job-name=alloc-allocation" in draft.text


def test_placement_is_checked_and_left_out_of_older_specs():
    with pytest.raises(StudyError, match=r"placement: .*jobs, allocation"):
        StudySpec.from_dict(dict(SPEC, placement="pod"))
    plain = StudySpec.from_dict({k: v for k, v in SPEC.items() if k != "placement"})
    assert "placement" not in plain.to_dict() and "placement" not in spec_yaml(plain)
    assert StudySpec.from_dict(dict(SPEC)).to_dict()["placement"] == "allocation"


def _point(tmp_path, lines, state):
    return study_record._in_allocation(*_job(tmp_path, lines, state))[:3]


def test_a_points_state_comes_from_its_own_record_and_the_allocations(tmp_path):
    assert _point(tmp_path, None, "PENDING")[0] == study_record.PENDING
    assert _point(tmp_path, None, "RUNNING")[0] == study_record.PENDING      # an earlier point runs
    assert _point(tmp_path, ["start=1"], "RUNNING")[0] == study_record.RUNNING
    state, reason, _ = _point(tmp_path, ["start=1"], "CANCELLED")
    assert state == study_record.FAILED and reason == "its allocation (job 7) ended CANCELLED while it ran"
    state, reason, _ = _point(tmp_path, None, "TIMEOUT")     # not reached before the allocation's end of time
    assert state == study_record.MISSING and reason.startswith("not reached: its allocation (job 7) ended at its time limit")
    state, reason, _ = _point(tmp_path, None, "NODE_FAIL")
    assert state == study_record.FAILED and reason == "its allocation (job 7) ended NODE_FAIL before it began"
    state, reason, _ = _point(tmp_path, ["start=1", "exit_code=0"], "RUNNING")
    assert state == study_record.FAILED and "no summary" in reason
    (tmp_path / "p" / "logs" / "main-7.engine.jsonl").write_text(
        '{"type": "summary", "throughput_samples_per_s": 5.0}\n')
    state, reason, summary = _point(tmp_path, ["start=1", "exit_code=0"], "RUNNING")
    assert state == study_record.DONE and summary["throughput_samples_per_s"] == 5.0
    state, reason, _ = _point(tmp_path, ["start=1", "exit_code=1"], "COMPLETED")
    assert state == study_record.FAILED and "exit 1" in reason
    assert _point(tmp_path, None, "UNKNOWN")[0] == study_record.UNKNOWN


def test_a_point_that_ran_out_of_time_is_timeout_with_whose_limit_and_its_phase(tmp_path):
    state, reason, _, job_state = study_record._in_allocation(*_job(tmp_path, ["start=1", "nodelist=node2", "exit_code=143",
                                                                      "timed_out=step", "limit_s=120"], "RUNNING"))
    assert (state, job_state) == (study_record.FAILED, "TIMEOUT")
    assert reason == ("TIMEOUT: its own 2-minute limit, before its first step (start-up, before Horovod's "
                      "initialisation)"), reason         # no run record here: the rank count is unknown
    state, reason, _, job_state = study_record._in_allocation(*_job(tmp_path, ["start=1", "timed_out=allocation"], "TIMEOUT"))
    assert state == study_record.FAILED and job_state == "TIMEOUT"
    assert reason.startswith("TIMEOUT: the allocation's time limit (job 7), before its first step"), reason
    # the allocation's script recorded its end of time; Slurm no longer says TIMEOUT (no accounting)
    alloc = tmp_path / "alloc"
    (alloc / "logs").mkdir(parents=True)
    (alloc / "logs" / "allocation-7.info").write_text("start=1\ntime_limit=9\n")
    job, run_dir = _job(tmp_path, None, "COMPLETED")
    assert study_record._in_allocation(job, run_dir, str(alloc))[0] == study_record.MISSING
    assert study_record._in_allocation(job, run_dir)[0] == study_record.FAILED          # any other end: failed, as before


def _job(tmp_path, lines, state):
    run_dir = tmp_path / "p"
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    info = run_dir / "logs" / "main-7.info"
    if lines is None:
        info.unlink(missing_ok=True)
    else:
        info.write_text("".join(f"{line}\n" for line in lines))
    return JobStatus(key="main", job_id="7", name="x", state=state, tasks={"7": state}), str(run_dir)


def test_the_report_says_whether_all_points_shared_one_node_set(tmp_path):
    from jobs.study.analysis import report_facts, report_table

    def point(pid, nodes, in_alloc=True):
        run_dir = tmp_path / pid
        (run_dir / "logs").mkdir(parents=True)
        (run_dir / "logs" / "main-1.info").write_text(f"nodelist={nodes}\n")
        rec = dataclasses.replace(_record(pid), runs=[str(run_dir)],
                                  allocation={str(run_dir): "a"} if in_alloc else {})
        st = study_record.PointStatus(id=pid, state=study_record.DONE, job_state="COMPLETED", run_dir=str(run_dir), job_id="1",
                             attempts=1)
        return rec, st

    pairs = [point("a", "node1"), point("b", "node1,node2")]
    sets = report_facts.node_sets(_study(pairs), _status(pairs))
    assert sets == {"points": {"a": "node1", "b": "node1,node2"}, "shared": True, "allocation": True}
    assert "one node set: every point ran on the first nodes of node1,node2 (in study allocations" in \
        report_table._node_sets_text(sets)
    pairs.append(point("c", "node3", in_alloc=False))
    sets = report_facts.node_sets(_study(pairs), _status(pairs))
    assert sets["shared"] is False and sets["allocation"] is False
    assert "NOT one node set" in report_table._node_sets_text(sets) and "c on node3" in report_table._node_sets_text(sets)


def _record(pid):
    return study_record.PointRecord(id=pid, nodes=1, gpus_per_node=1, gpus=1, batch_per_gpu=1, global_batch=1, variant={},
                           variant_label="default", repeat=0)


def _study(pairs):
    return study_record.StudyRecord(name="s", study_dir="/x", profile="ci", profile_path=None, scheduler="slurm", spec={},
                           created=0.0, points=[r for r, _ in pairs])


def _status(pairs):
    points = [s for _, s in pairs]
    return study_record.StudyStatus(study_dir="/x", points=points, counts=study_record.counts_of(points), done=True, calls=0,
                           elapsed_s=0.0)


def test_a_study_record_without_allocations_still_loads(tmp_path):
    import json

    (tmp_path / "study.json").write_text(json.dumps({
        "version": 1, "name": "s", "study_dir": str(tmp_path), "profile": "ci", "profile_path": None,
        "scheduler": "slurm", "spec": {}, "created": 0.0,
        "points": [{"id": "a", "nodes": 1, "gpus_per_node": 1, "gpus": 1, "batch_per_gpu": 1, "global_batch": 1,
                    "variant": {}, "variant_label": "default", "repeat": 0, "runs": []}]}))
    assert study_record.StudyRecord.load(str(tmp_path)).points[0].allocation == {}
    assert os.path.exists(tmp_path / "study.json")


@pytest.mark.parametrize("how", ["flag", "spec"])
def test_an_allocation_on_a_profile_that_cannot_run_one_is_refused_before_anything_exists(tmp_path, capsys, how):
    from jobs import cli

    runs = tmp_path / "runs"
    argv = ["study", "run", "--profile", "local", "--runs-dir", str(runs)]
    if how == "flag":
        argv += ["--allocation", "--model", "ncf", "--gpus", "1", "--batch-size", "512", "--steps", "2"]
    else:
        spec = tmp_path / "alloc.yaml"
        spec.write_text(spec_yaml(StudySpec.from_dict(dict(SPEC, points=[{"nodes": 1, "gpus_per_node": 1}]))))
        argv.insert(2, str(spec))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    where = "--allocation" if how == "flag" else f"{tmp_path / 'alloc.yaml'}: placement"
    assert len(err) == 1 and err[0].startswith(f"recsys-submit: error: {where}: profile 'local' schedules with local")
    assert not runs.exists()
