"""The node screen on the local Slurm cluster (`recsys-submit study screen`): one allocation of
the 4 emulated nodes, the same one-node NCF benchmark on each at once (real srun --mpi=pmix
steps, real TensorFlow), node3 slowed on purpose by the screen's test hook (slurm/screen-rank.sh:
its rank runs 4 of every 80 ms, a twentieth of its CPU time, from its first step on). node3 is flagged and listed in
the --exclude line, the other three are not.

The 4 emulated nodes share this host's 2 cores, so the spread of the unslowed nodes is the
mechanics of 4 TensorFlow processes on 2 cores, not a property of the nodes (it reached 2.6x): the
test flags at a margin of 0.75 (below a quarter of the median), which only a node clearly set
apart falls below (the hooked one gets a twentieth of its CPU time)."""

import glob
import json
import os
import time

import pytest

from submit_helpers import Cli

pytestmark = [pytest.mark.slurm, pytest.mark.horovod, pytest.mark.slow]

SLOW = "node3"


@pytest.fixture(scope="module")
def screened(slurm_cluster, tmp_path_factory):
    pytest.importorskip("horovod.tensorflow")
    cli = Cli(slurm_cluster.env, tmp_path_factory.mktemp("screen-runs"))
    env = dict(cli.env, RECSYS_TEST_SLOW_NODE=SLOW, RECSYS_TEST_SLOW_RUN_MS="4")
    start = time.monotonic()
    proc = cli("study", "screen", "--profile", "ci", "--nodes", "4", "--gpus", "1", "--warmup-steps", "30",
               "--steps", "100", "--margin", "0.75", "--json", env=env, timeout=600)
    print(f"study screen: {time.monotonic() - start:.1f} s")
    return proc, json.loads(proc.stdout) if proc.stdout.startswith("{") else None


def test_the_node_slowed_on_purpose_is_flagged_and_the_others_are_not(screened):
    proc, data = screened
    assert proc.returncode == 1 and data is not None, proc.stdout + proc.stderr     # 1: a node flagged
    rows = {r["node"]: r for r in data["nodes"]}
    assert sorted(rows) == ["node1", "node2", "node3", "node4"], data
    assert {n: r["state"] for n, r in rows.items()} == {"node1": "ok", "node2": "ok", "node3": "slow",
                                                        "node4": "ok"}, data
    assert data["flagged"] == [SLOW] and data["exclude"] == f"--exclude={SLOW}"
    others = [r["throughput"] for n, r in rows.items() if n != SLOW]
    # set apart: more than 4x below the median, and more than 2x below the slowest other node (the
    # unslowed nodes' own spread on 2 shared cores reached 2.6x)
    assert rows[SLOW]["vs_median"] < 0.25 and rows[SLOW]["throughput"] < min(others) / 2, data
    for row in rows.values():
        assert row["step_time_ms"] > 0 and row["breakdown"] and row["breakdown"]["compute"] > 0
    text = open(os.path.join(data["screen_dir"], "screen.md")).read()
    assert f"Exclude them: `--exclude={SLOW}`" in text and f"test hook: {SLOW} slowed on purpose" in text
    hooked = [p for p in glob.glob(os.path.join(rows[SLOW]["run_dir"], "logs", "*"))
              if os.path.isfile(p) and "slowed on purpose" in open(p, errors="replace").read()]
    assert hooked, "node3's rank did not run under the test hook"


def test_one_allocation_every_node_at_once(screened):
    _, data = screened
    assert data is not None
    for row in data["nodes"]:        # every node's copy ran in the screen's one job
        with open(os.path.join(row["run_dir"], "jobs.json")) as handle:
            assert json.load(handle)["jobs"][0]["job_id"] == data["job_id"]
    info = open(os.path.join(data["screen_dir"], "logs", f"allocation-{data['job_id']}.info")).read().splitlines()
    starts = [int(line.rsplit("start=", 1)[1]) for line in info if line.startswith("point=") and "start=" in line]
    ends = [int(line.split("end=", 1)[1].split()[0]) for line in info if line.startswith("point=") and "end=" in line]
    nodes = [line.split("nodes=", 1)[1].split()[0] for line in info if line.startswith("point=") and "nodes=" in line]
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"] and len(ends) == 4
    assert max(starts) <= min(ends)         # all four began before the first one ended
    # the test hook held every rank after its first step until all four had reached theirs
    assert sorted(os.listdir(os.path.join(data["screen_dir"], "sync"))) == ["node1", "node2", "node3", "node4"]
