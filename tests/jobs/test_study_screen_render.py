"""The node screen without a cluster (jobs.study.running.screen): its allocation's script runs one copy of
the benchmark per node, all at once, each on its own node; the test hook wraps the ranks only
when it is set; bad input is refused in one line before anything exists; and the table, the
flagged nodes and the --exclude line come from the nodes' own records (a recorded screen
directory as the allocation leaves it). The screen on the test cluster: test_study_screen.py."""

import json
import os
import re
from types import SimpleNamespace

import pytest

from jobs import cli
from jobs.schedulers import backend_for
from jobs.study.running import screen

pytestmark = pytest.mark.fast


def _drafts(tmp_path, **kwargs):
    sp = screen.plan_screen("ci", **kwargs)
    slots = [str(tmp_path / "nodes" / f"slot{i + 1}") for i in range(sp.count)]
    return sp, sp.drafts(backend_for(sp.profile), str(tmp_path), slots)


def test_every_node_runs_its_copy_at_once(tmp_path, monkeypatch):
    monkeypatch.delenv(screen.SLOW_NODE_ENV, raising=False)
    sp, (draft, nodes) = _drafts(tmp_path, nodes=4, gpus=1)
    text = draft.text
    assert "#SBATCH --nodes=4" in text and "--nodelist" not in text.split("set -uo pipefail")[0]
    lines = re.findall(r"^recsys_point (\S+) (\S+) main 1 \d+ (\d) &$", text, re.M)
    assert [(d, s, int(first)) for d, s, first in lines] == [(n.run_dir, n.script, i) for i, n in enumerate(nodes)]
    assert re.search(r"^wait$", text, re.M)
    assert sp.alloc.time_seconds == nodes[0].spec.time_seconds + 60      # at once: one benchmark's time
    for node in nodes:      # the study point's benchmark: ncf, 1 rank, its step on the node it is given
        assert "--run-mode benchmark" in node.text and "--factors 16 --layers 64,32,16" in node.text
        assert '${RECSYS_STEP_NODES:+"--nodelist=$RECSYS_STEP_NODES"}' in node.text
        assert "screen-rank.sh" not in node.text and screen.SLOW_NODE_ENV not in node.text
    _, (draft, _) = _drafts(tmp_path, nodelist="node[2-4]")
    assert "#SBATCH --nodelist=node[2-4]" in draft.text and "#SBATCH --nodes=3" in draft.text


def test_the_test_hook_wraps_the_ranks_only_when_set(tmp_path, monkeypatch):
    monkeypatch.setenv(screen.SLOW_NODE_ENV, "node3")
    sp, (_, nodes) = _drafts(tmp_path, nodes=2, gpus=1)
    assert sp.hook == {screen.SLOW_NODE_ENV: "node3", screen.SYNC_ENV: "2"}
    for node in nodes:
        assert "export RECSYS_TEST_SLOW_NODE=node3" in node.text and "export RECSYS_TEST_SYNC_COUNT=2" in node.text
        assert 'bash "$RECSYS_SLURM_DIR/screen-rank.sh" -- ' in node.text


@pytest.mark.parametrize("args, word", [
    (["--nodes", "1"], "--nodes: a screen compares nodes with their median: give 2 or more"),
    (["--nodes", "5"], "--nodes: 5 nodes, profile ci has max_nodes 4"),
    ([], "give --nodes N or --nodelist L"),
    (["--nodelist", "node[1-"], "--nodelist: 'node[1-' is not a Slurm host list"),
    (["--nodelist", "node1,node1"], "names a node twice"),
    (["--nodes", "2", "--margin", "1.5"], "--margin: a fraction between 0 and 1"),
    (["--nodes", "2", "--gpus", "3"], "--gpus: the GPUs of one node to use, 1 to 2 on profile ci"),
    (["--nodes", "2", "--profile", "local"], "--profile: a screen runs in one Slurm allocation"),
])
def test_bad_input_is_refused_before_anything_exists(tmp_path, capsys, args, word):
    runs = tmp_path / "runs"
    argv = ["study", "screen", "--runs-dir", str(runs)] + args
    if "--profile" not in args:
        argv += ["--profile", "ci"]
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.splitlines()) == 1 and word in err, err
    assert not runs.exists()


def _slot(screen_dir, index, node, job_id, throughput=None, exit_code="0", breakdown=None):
    """One node's run dir as its copy leaves it: the .info record and the engine log."""
    run_dir = os.path.join(screen_dir, "nodes", f"slot{index}")
    os.makedirs(os.path.join(run_dir, "logs"))
    if node is None:        # the allocation ended before this copy began
        return run_dir
    with open(os.path.join(run_dir, "logs", f"main-{job_id}.info"), "w") as handle:
        handle.write(f"job_id={job_id}\nnodelist={node}\nstart=1\n" + (f"exit_code={exit_code}\n" if exit_code else ""))
    if throughput is not None:
        summary = {"type": "summary", "mode": "benchmark", "model": "ncf", "world_size": 1,
                   "throughput_samples_per_s": throughput, "mean_step_time_ms": 4096e3 / throughput,
                   "summary_version": 2}
        if breakdown:
            summary["step_breakdown"] = {"version": 2, "mean": breakdown, "slowest_rank": breakdown}
        with open(os.path.join(run_dir, "logs", f"main-{job_id}.engine.jsonl"), "w") as handle:
            handle.write(json.dumps(summary) + "\n")
    return run_dir


def test_a_node_below_the_margin_is_flagged_and_an_unknown_one_is_not(tmp_path):
    job = SimpleNamespace(job_id="77", state="COMPLETED")
    split = {"step_ms": 10.0, "input_wait_ms": 1.0, "compute_ms": 7.0, "gradient_exchange_ms": 0.5,
             "optimizer_ms": 1.0, "remainder_ms": 0.5}
    slots = [_slot(str(tmp_path), 1, "node1", "77", 100_000.0, breakdown=split),
             _slot(str(tmp_path), 2, "node2", "77", 95_000.0),
             _slot(str(tmp_path), 3, "node3", "77", 30_000.0),
             _slot(str(tmp_path), 4, "node4", "77", 91_000.0),
             _slot(str(tmp_path), 5, "node5", "77", exit_code="1"),
             _slot(str(tmp_path), 6, None, "77")]
    with open(tmp_path / "screen-request.json", "w") as handle:
        json.dump({"version": 1, "profile": "ci", "model": "ncf", "gpus_per_node": 1, "steps": 100,
                   "warmup_steps": 10, "engine_args": ["--factors", "16"], "slots": slots, "margin": 0.1}, handle)
    data = screen.collect(str(tmp_path), job)
    rows = {r["node"]: r for r in data["nodes"]}
    assert data["median_throughput"] == 93_000.0           # of the 4 measured nodes
    assert [rows[n]["state"] for n in ("node1", "node2", "node3", "node4", "node5")] == \
        ["ok", "ok", "slow", "ok", "failed"]                # node4: 2% below the median, inside the margin
    assert rows["node3"]["vs_median"] == pytest.approx(30 / 93) and rows["node3"]["reason"] == "68% below the median"
    assert rows[None]["state"] == "unknown" and "cannot be told" in rows[None]["reason"]
    assert rows["node1"]["breakdown"]["compute"] == 7.0 and rows["node2"]["breakdown"] is None
    assert data["flagged"] == ["node3", "node5"] and data["exclude"] == "--exclude=node3,node5"
    with open(tmp_path / "screen.json") as handle:
        assert json.load(handle) == data
    text = (tmp_path / "screen.md").read_text()
    assert "| node3 | slow | 30,000 | 136.53 | 0.32 |" in text and "| compute (ms) |" in text
    assert "Exclude them: `--exclude=node3,node5`" in text
    data = screen.collect(str(tmp_path), job, margin=0.75)     # a wider margin flags none of the slow
    assert data["flagged"] == ["node5"]


def test_a_screen_submitted_before_is_collected_again(tmp_path, capsys):
    """`study screen SCREEN_DIR`: the table of a screen whose wait was interrupted (its job settled:
    no Slurm call)."""
    import time

    from jobs.backends.slurm.poll import StatusCache, TaskSeen
    from jobs.runs.records import SUBMITTED, JobRecord, RunRecord

    slots = [_slot(str(tmp_path), i + 1, f"node{i + 1}", "88", value) for i, value in
             enumerate((100_000.0, 98_000.0, 20_000.0, 101_000.0))]
    with open(tmp_path / "screen-request.json", "w") as handle:
        json.dump({"version": 1, "profile": "ci", "model": "ncf", "gpus_per_node": 1, "steps": 100,
                   "warmup_steps": 10, "engine_args": [], "slots": slots, "margin": 0.1}, handle)
    RunRecord(run_dir=str(tmp_path), profile="ci", profile_path=None, scheduler="slurm", state=SUBMITTED,
              jobs=[JobRecord(key="screen", name="screen-ci", job_id="88")]).save()
    StatusCache(tasks={"88": TaskSeen(state="COMPLETED", source="squeue", seen=time.time())}).write(str(tmp_path))
    rc = cli.main(["study", "screen", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 1, err
    assert out.splitlines()[-1] == "--exclude=node3" and "| node3 | slow | 20,000 |" in out
    rc = cli.main(["study", "screen", str(tmp_path / "nodes"), "--json"])
    _, err = capsys.readouterr()
    assert rc == 2 and "is not a screen directory" in err and len(err.splitlines()) == 1


def test_the_exclude_line_passes_on_to_a_study_allocation(tmp_path, capsys):
    """`study run --allocation --exclude` takes the screen's last line as printed."""
    from jobs.profiles import load_profile
    from jobs.study.running import allocation, run
    from jobs.study.running import record as study_record
    from jobs.study.spec import StudySpec, expand

    assert allocation.check_hostlist("--exclude", "--exclude=node3,node[5-6]") == \
        ("node3,node[5-6]", ["node3", "node5", "node6"])
    spec = StudySpec.from_dict(dict(name="ex", model="ncf", batch_size=512, warmup_steps=1, steps=2,
                                    breakdown_steps=0, time="00:05:00", points=[{"nodes": 1, "gpus_per_node": 1}]))
    prof = load_profile("ci")
    points = {p.id: p for p in expand(spec, prof)}
    study = study_record.StudyRecord(name="ex", study_dir=str(tmp_path), profile="ci", profile_path=None,
                            scheduler="slurm", spec={}, created=0.0)
    planned = allocation._plan_points(spec, prof, study, [study_record.PointRecord.from_point(p) for p in points.values()],
                                      points, run.point_request)
    draft, _ = backend_for(prof).allocation(allocation.allocation_spec(spec, planned),
                                            [(s, str(tmp_path / "p")) for _, _, s in planned], str(tmp_path / "a"),
                                            exclude="node3")
    assert "#SBATCH --exclude=node3" in draft.text
    runs = tmp_path / "runs"
    for args, word in ((["--allocation", "--exclude", "node3;rm"], "--exclude: 'node3;rm' is not a Slurm host list"),
                       (["--exclude", "node3"], "--exclude: leaves nodes out of a study's allocation")):
        rc = cli.main(["study", "run", "--profile", "ci", "--model", "ncf", "--gpus", "1", "--runs-dir", str(runs),
                       *args])
        out, err = capsys.readouterr()
        assert rc == 2 and len(err.splitlines()) == 1 and word in err, err
    assert not runs.exists()
