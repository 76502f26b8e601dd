"""Jobs on the real local Slurm cluster (no accounting): MPI ranks, binding, status, logs."""

import os
import time

import pytest

from jobs.profiles.binding import rank_binding
from jobs.profiles import load_profile

from submit_helpers import hello_lines

pytestmark = pytest.mark.slurm


def test_two_nodes_two_ranks_pmix_hello(cli, slurm_cluster):
    # the binding tables under test: ci's own default is off (its nodes share 2 cores)
    run_dir, record = cli.submit("benchmark", "--profile", "ci", "--model", "hello", "--nodes", "2",
                                 "--time", "5", "--name", "hello 2x2", "--bind", "exclusive")
    assert len(record["jobs"]) == 1
    assert slurm_cluster.wait_job(record["jobs"][0]["job_id"]) == "COMPLETED"
    ranks = hello_lines(run_dir)
    assert len(ranks) == 4, ranks
    assert sorted(r["mpi_rank"] for r in ranks) == [0, 1, 2, 3]
    assert {r["mpi_size"] for r in ranks} == {4}
    assert all(r["allreduce_ok"] for r in ranks)
    assert all(r["rank"] == r["mpi_rank"] and r["world_size"] == 4 for r in ranks)
    hosts = {r["host"] for r in ranks}
    assert len(hosts) == 2
    node = load_profile("ci").node
    for host in hosts:
        on_host = sorted((r for r in ranks if r["host"] == host), key=lambda r: r["local_rank"])
        assert [r["local_rank"] for r in on_host] == [0, 1]
        for r in on_host:
            expected = rank_binding(node, r["local_rank"], "exclusive", multinode=True, local_size=2)
            assert r["cpus"] == expected.cpus, r
            assert r["cuda_visible_devices"] is not None
        assert on_host[0]["cuda_visible_devices"] != on_host[1]["cuda_visible_devices"]
    info = [f for f in os.listdir(os.path.join(run_dir, "logs")) if f.endswith(".info")]
    assert info, "the batch script records job id and node list"
    with open(os.path.join(run_dir, "logs", info[0])) as handle:
        text = handle.read()
    assert "nodes=2" in text and "exit_code=0" in text


def _overlap(intervals):
    """Largest number of [start, end] intervals open at one instant."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = cur = 0
    for _, delta in events:
        cur += delta
        best = max(best, cur)
    return best


def _task_intervals(run_dir):
    """{task index: (start, end)} from the HELLO/BYE lines of each array task's rank 0."""
    import glob
    import json
    import re

    out = {}
    for path in glob.glob(os.path.join(run_dir, "logs", "*.rank0.log")):
        start = end = index = None
        with open(path) as handle:
            for line in handle:
                if line.startswith("HELLO "):
                    info = json.loads(line[6:])
                    start, index = info["start"], info["task_index"]
                match = re.match(r"BYE rank=\S+ end=([\d.]+)", line)
                if match:
                    end = float(match.group(1))
        if start is not None and end is not None:
            out[index] = (start, end)
    return out


def test_array_cap_is_never_exceeded(cli, slurm_cluster):
    run_dir, record = cli.submit("benchmark", "--profile", "ci", "--model", "hello", "--nodes", "1",
                                 "--gpus-per-node", "1", "--array", "5", "--parallelism", "2",
                                 "--time", "5", "--", "--sleep", "2")
    job_id = record["jobs"][0]["job_id"]
    with open(os.path.join(run_dir, "main.sbatch")) as handle:
        assert "#SBATCH --array=0-4%2" in handle.read()
    most_running = 0
    deadline = time.monotonic() + 180
    while True:   # poll squeue while the array runs: never more than 2 tasks RUNNING
        out = slurm_cluster.run(["squeue", "-h", "-r", "-j", job_id, "-o", "%T"]).stdout.split()
        if not out:
            break
        assert time.monotonic() < deadline, f"array still queued: {out}"
        most_running = max(most_running, out.count("RUNNING"))
        assert out.count("RUNNING") <= 2, out
    intervals = _task_intervals(run_dir)
    assert sorted(intervals) == [0, 1, 2, 3, 4]
    assert _overlap(intervals.values()) <= 2
    assert most_running >= 1


def test_array_larger_than_max_array_size_is_split(cli, slurm_cluster):
    env = dict(cli.env, RECSYS_MAX_ARRAY_SIZE="2")
    run_dir, record = cli.submit("benchmark", "--profile", "ci", "--model", "hello", "--nodes", "1",
                                 "--gpus-per-node", "1", "--ntasks-per-node", "1", "--array", "5",
                                 "--time", "5", env=env)
    assert [j["key"] for j in record["jobs"]] == ["main.0", "main.1", "main.2"]
    assert [j["array_size"] for j in record["jobs"]] == [2, 2, 1]
    assert [j["task_offset"] for j in record["jobs"]] == [0, 2, 4]
    result = cli("status", run_dir, "--watch", env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    indices = sorted(_task_intervals(run_dir))
    assert indices == [0, 1, 2, 3, 4]
