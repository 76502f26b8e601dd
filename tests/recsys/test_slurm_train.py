"""The engine under Slurm: `srun --mpi=pmix` starts the ranks (no mpirun/horovodrun inside)."""
import pytest

from conftest import MPI_ENV, SMALL, read_log, summary, train_cmd

pytestmark = [pytest.mark.slurm, pytest.mark.horovod]


def test_srun_pmix_two_tasks_match_one_rank(slurm_cluster, tiny_data, dlrm_one_rank, tmp_path):
    log = tmp_path / "log.jsonl"
    env = dict(slurm_cluster.env)
    env.update(MPI_ENV)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    cmd = ["srun", "--mpi=pmix", "-N1", "--ntasks=2", "--ntasks-per-node=2", "--cpus-per-task=1",
           "-p", slurm_cluster.partition, "--time=5",
           *train_cmd("--model", "dlrm", "--data-path", tiny_data("dlrm"), *SMALL["dlrm"], "--epochs", "1",
                      "--max-steps", "16", "--log-path", log, "--log-every", "4")]
    res = slurm_cluster.run(cmd, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    s = summary(read_log(log))
    assert s["world_size"] == 2 and s["step"] == 16
    assert s["replica_weight_digests"][0] == s["replica_weight_digests"][1]
    assert abs(s["auc"] - dlrm_one_rank["auc"]) < 2e-3
    assert abs(s["final_loss"] - dlrm_one_rank["final_loss"]) < 2e-3
