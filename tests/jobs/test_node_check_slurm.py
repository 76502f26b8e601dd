"""The per-node check (slurm/node-check.sh, issue 47 item 7) on every node of a multinode job, on
the test cluster: a NCCL_SOCKET_IFNAME no node has stops a 2-node job before its step with one
line per node naming it (the check ran on the batch host only: one line, the other node unseen)."""
import os
import re

import pytest

pytestmark = pytest.mark.slurm


def test_every_node_of_a_multinode_job_is_checked_before_the_step(cli, slurm_cluster, tmp_path):
    profile = tmp_path / "noif.yaml"
    profile.write_text("extends: ci\nenv:\n  NCCL_SOCKET_IFNAME: ib0\n")
    run_dir, record = cli.submit("benchmark", "--profile", str(profile), "--model", "hello", "--nodes", "2",
                                 "--gpus-per-node", "1", "--time", "5")
    job = record["jobs"][0]["job_id"]
    assert slurm_cluster.wait_job(job) == "FAILED"
    out = open(os.path.join(run_dir, "logs", f"main-{job}.out"), errors="replace").read()
    nodes = re.findall(r"NCCL_SOCKET_IFNAME=ib0: no such network interface on (\S+) ", out)
    assert len(nodes) == 2 and len(set(nodes)) == 2, out
    assert not os.path.exists(os.path.join(run_dir, "logs", f"main-{job}.rank0.log"))   # no step ran
    # healthy nodes: the check passes on both and the step runs
    run_dir, record = cli.submit("benchmark", "--profile", "ci", "--model", "hello", "--nodes", "2",
                                 "--gpus-per-node", "1", "--time", "5")
    assert slurm_cluster.wait_job(record["jobs"][0]["job_id"]) == "COMPLETED"
