"""The network half of a node screen without a cluster (jobs.study.network_screen, issue 47 item 2):
every node pair exactly once in rounds of pairs on disjoint nodes, the allocation's script running
each round's pairs at once on their two nodes (the script itself run through bash), the whole set
last; the pairs judged against the median of each node's fastest pair on recorded fabric files, a
node slow with most of its partners folded into the screen's one --exclude line, a slow link
between two fine nodes listed and not excluded; bad flags refused in one line before anything
exists. On the test cluster, with a link slowed in the kernel: test_study_screen_network.py."""

import itertools
import json
import os
import re
import subprocess
from types import SimpleNamespace

import pytest
import yaml

from jobs import cli
from jobs.schedulers import backend_for
from jobs.study.running import allocation
from jobs.study.running import network_screen as N
from jobs.study.running import screen

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("count", [3, 4, 5, 8, 9, 16])
def test_every_pair_once_in_rounds_of_disjoint_pairs(count):
    rounds = N.pair_rounds(count)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == list(itertools.combinations(range(count), 2))
    assert len(rounds) == (count - 1 if count % 2 == 0 else count)
    for r in rounds:
        nodes = [n for p in r for n in p]
        assert len(nodes) == len(set(nodes)) and len(r) == count // 2


def _plan(tmp_path, **kwargs):
    sp = screen.plan_screen("ci", nodes=4, gpus=1, network=True, **kwargs)
    slots = N.slots(sp.profile, sp.network, str(tmp_path))
    dirs = [str(tmp_path / "nodes" / f"slot{i + 1}") for i in range(sp.count)]
    return sp, slots, sp.drafts(backend_for(sp.profile), str(tmp_path), dirs, slots)


def test_the_allocation_runs_the_nodes_then_the_pair_rounds_then_the_whole_set(tmp_path):
    sp, slots, (alloc, drafts) = _plan(tmp_path, network_sizes="1m,4M", network_time=2)
    text = alloc.text
    assert len(drafts) == 4 + 6 + 1
    rounds = re.findall(r"# round (\d+) of (\d+): (\d+) point\(s\) at once", text)
    assert rounds == [("1", "5", "4"), ("2", "5", "2"), ("3", "5", "2"), ("4", "5", "2"), ("5", "5", "1")]
    calls = [line.split() for line in text.splitlines() if line.startswith("recsys_point ")]
    pairs = [tuple(int(i) for i in c[6].rstrip(",").split(",")) for c in calls if "/network/pair-" in c[1]]
    assert sorted(pairs) == list(itertools.combinations(range(4), 2))
    for c in calls:
        if "/network/" in c[1]:
            assert c[5] == "120" and c[-1] == "&"            # each pair's own 2-minute step limit, at once
    assert calls[-1][1].endswith("/network/all") and calls[-1][6] == "0,1,2,3,"
    # the allocation's time: the node benchmark's, its margin, and every round's limit at most
    assert sp.alloc.time_seconds == sp.slots[0].time_seconds + allocation.MARGIN_S + 4 * 120
    pair = next(d for d in drafts if d.run_dir.endswith("pair-1-2"))
    assert "-m recsys.collectives --out " + os.path.join(pair.run_dir, "fabric.yaml") in pair.text
    assert "--sizes 1M,4M" in pair.text and "--collectives allreduce,alltoall" in pair.text
    assert "srun --mpi=pmix -N 2 --ntasks-per-node=1" in pair.text


def test_the_script_gives_each_pair_the_nodes_at_its_indices(tmp_path):
    """recsys_point of the rendered template, run by bash with a stand-in point script that
    records the node set the step would get."""
    _, slots, (alloc, _) = _plan(tmp_path)
    body = alloc.text.split("recsys_point() {", 1)[1].split("\n}\n", 1)[0]
    seen = tmp_path / "seen"
    point = tmp_path / "point.sh"
    point.write_text(f'echo "$RECSYS_STEP_NODES $SLURM_JOB_NUM_NODES" >> {seen}\n')
    (tmp_path / "d" / "logs").mkdir(parents=True)
    script = (f"recsys_info={tmp_path}/info\nrecsys_nodes=(gpu7 gpu9 gpu11 gpu12)\nrecsys_point() {{{body}\n}}\n"
              f"recsys_point {tmp_path}/d {point} a 2 60 1,3, \nrecsys_point {tmp_path}/d {point} b 2 60 0,2,\n"
              f"recsys_point {tmp_path}/d {point} c 2 60 2\n")
    subprocess.run(["bash", "-c", script], check=True, timeout=60)
    assert seen.read_text().splitlines() == ["gpu9,gpu12 2", "gpu7,gpu11 2", "gpu11,gpu12 2"]


def _fabric(path, allreduce, alltoall):
    record = {"version": 1, "level": "inter_node", "ranks": 2, "nodes": 2,
              "measured": {"inter_node": {"allreduce": {"busbw_gb_per_s": allreduce, "latency_us": 50.0},
                                          "alltoall": {"busbw_gb_per_s": alltoall, "latency_us": 60.0}}}}
    with open(path, "w") as handle:
        yaml.safe_dump(record, handle)


def _recorded(tmp_path, figures, job_id="81"):
    """A screen dir with --network as the allocation leaves it: node rows and each pair's .info
    and fabric file; `figures`: {(i, j) or "all": (allreduce, alltoall) | "fail" | None (not run)}."""
    names = ["node1", "node2", "node3", "node4"]
    sp, slots, _ = _plan(tmp_path)
    node_dirs = []
    for i, name in enumerate(names):
        run_dir = tmp_path / "nodes" / f"slot{i + 1}"
        (run_dir / "logs").mkdir(parents=True)
        (run_dir / "logs" / f"main-{job_id}.info").write_text(f"nodelist={name}\nexit_code=0\n")
        summary = {"type": "summary", "mode": "benchmark", "throughput_samples_per_s": 1000.0,
                   "mean_step_time_ms": 4.0, "summary_version": 2}
        (run_dir / "logs" / f"main-{job_id}.engine.jsonl").write_text(json.dumps(summary) + "\n")
        node_dirs.append(str(run_dir))
    for slot in slots:
        key = "all" if len(slot["nodes"]) == 4 else tuple(slot["nodes"])
        value = figures.get(key)
        os.makedirs(os.path.join(slot["dir"], "logs"), exist_ok=True)
        if value is None:
            continue
        info = f"nodelist={','.join(names[i] for i in slot['nodes'])}\nstart=1\n"
        if value == "fail":
            info += "exit_code=1\n"
        else:
            info += "exit_code=0\n"
            _fabric(os.path.join(slot["dir"], "fabric.yaml"), *value)
        with open(os.path.join(slot["dir"], "logs", f"main-{job_id}.info"), "w") as handle:
            handle.write(info)
    with open(tmp_path / "screen-request.json", "w") as handle:
        json.dump({"version": 1, "profile": "ci", "model": "ncf", "gpus_per_node": 1, "steps": 100,
                   "warmup_steps": 10, "engine_args": [], "slots": node_dirs, "margin": 0.2,
                   "network": N.request_record(sp.network, slots)}, handle)
    return SimpleNamespace(job_id=job_id, state="COMPLETED")


def test_a_node_slow_with_every_partner_is_excluded_with_the_benchmark_ones(tmp_path):
    good, bad = (10.0, 6.0), (1.0, 0.6)
    figures = {(0, 1): good, (0, 2): bad, (0, 3): (9.5, 6.1), (1, 2): bad, (1, 3): (10.4, 6.0), (2, 3): bad,
               "all": (2.0, 1.1)}
    data = screen.collect(str(tmp_path), _recorded(tmp_path, figures))
    net = data["network"]
    # node3 is in half the pairs: a plain median of the pairs would be 5.5; of each node's best
    # (10, 10.4, 1, 10.4) it is 10.2
    assert net["reference_gb_per_s"] == pytest.approx(10.2)
    states = {tuple(r["nodes"]): r["state"] for r in net["pairs"]}
    assert states == {("node1", "node2"): "ok", ("node1", "node3"): "slow", ("node1", "node4"): "ok",
                      ("node2", "node3"): "slow", ("node2", "node4"): "ok", ("node3", "node4"): "slow"}
    assert net["flagged"] == ["node3"] and net["slow_links"] == []
    assert net["nodes"]["node3"]["reason"] == "slow or failed with 3 of its 3 partners: its own link"
    assert data["flagged"] == ["node3"] and data["exclude"] == "--exclude=node3"
    assert net["whole"]["vs_reference"] == pytest.approx(2.0 / 10.2) and "spans the flagged nodes" in net["whole"]["reason"]
    text = (tmp_path / "screen.md").read_text()
    assert "| node1,node3 | slow | 1 | 0.6 | 0.10 | 90% below the reference |" in text
    assert "- node3: slow or failed with 3 of its 3 partners" in text and "Exclude them: `--exclude=node3`" in text


def test_a_slow_link_between_two_fine_nodes_is_listed_not_excluded_and_a_failed_pair_counts(tmp_path):
    good = (10.0, 6.0)
    figures = {(0, 1): good, (0, 2): good, (0, 3): (2.0, 1.0), (1, 2): good, (1, 3): good, (2, 3): good,
               "all": (9.0, 5.0)}
    data = screen.collect(str(tmp_path), _recorded(tmp_path, figures))
    assert data["network"]["flagged"] == [] and data["network"]["slow_links"] == [["node1", "node4"]]
    assert data["flagged"] == [] and data["exclude"] is None
    assert "the link between node1 and node4 is slow" in (tmp_path / "screen.md").read_text()

    other = tmp_path / "other"
    other.mkdir()
    figures = {(0, 1): good, (0, 2): "fail", (0, 3): good, (1, 2): "fail", (1, 3): good, (2, 3): None,
               "all": None}
    data = screen.collect(str(other), _recorded(other, figures))
    net = data["network"]
    assert net["nodes"]["node3"] == {"pairs": 2, "bad": 2, "flagged": True,
                                     "reason": "slow or failed with 2 of its 2 partners: its own link"}
    unknown = next(r for r in net["pairs"] if r["indices"] == [2, 3])
    assert unknown["state"] == "unknown" and unknown["nodes"] is None      # never ran: no verdict on it
    assert net["whole"]["state"] == "unknown" and data["flagged"] == ["node3"]


@pytest.mark.parametrize("args,word", [
    (["--nodelist", "node[1-2]", "--network"], "--network: pairs are judged against the other pairs: give 3 or more"),
    (["--nodes", "4", "--network", "--network-sizes", "4X"], "--network-sizes: comma-separated buffer sizes"),
    (["--nodes", "4", "--network", "--network-time", "0"], "--network-time: a whole number of at least 1"),
    (["--nodes", "4", "--network-iters", "3"], "settings of --network's checks; add --network"),
])
def test_bad_network_flags_are_refused_before_anything_exists(tmp_path, capsys, args, word):
    runs = tmp_path / "runs"
    rc = cli.main(["study", "screen", "--profile", "ci", "--runs-dir", str(runs)] + args)
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and len(err.splitlines()) == 1 and word in err, err
    assert not runs.exists()


def test_the_help_states_the_module_defaults(capsys):
    with pytest.raises(SystemExit):
        cli.main(["study", "screen", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default {N.SIZES})" in text and f"(default {N.ITERS})" in text and f"(default {N.MINUTES})" in text
