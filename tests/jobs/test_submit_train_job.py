"""The real training engine through recsys-submit on the local cluster: 2 nodes x 1 rank,
srun --mpi=pmix, bind.sh per rank, Horovod inside (no mpirun/horovodrun in the step)."""

import glob
import os

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.horovod]


def test_ncf_two_nodes_through_recsys_submit(cli, slurm_cluster, tmp_path):
    pytest.importorskip("horovod.tensorflow")
    # a shared --checkpoint-dir also holds the synthetic data every rank reads
    run_dir, record = cli.submit("train", "--profile", "ci", "--model", "ncf", "--nodes", "2",
                                 "--gpus-per-node", "1", "--time", "10", "--",
                                 "--synthetic", "--max-steps", "3", "--batch-size", "128",
                                 "--checkpoint-dir", tmp_path / "ckpt")
    state = slurm_cluster.wait_job(record["jobs"][0]["job_id"], timeout=400)
    rank_logs = sorted(glob.glob(os.path.join(run_dir, "logs", "*.rank*.log")))
    text = {os.path.basename(p): open(p, errors="replace").read() for p in rank_logs}
    assert state == "COMPLETED", {k: v[-2000:] for k, v in text.items()}
    assert len(rank_logs) == 2
    summary = [line for line in text[os.path.basename(rank_logs[0])].splitlines() if "summary:" in line]
    assert summary and "world_size=2" in summary[-1], text
