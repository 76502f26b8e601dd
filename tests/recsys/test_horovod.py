"""Data parallelism with Horovod under mpirun: replicas stay identical and match a 1-rank run."""
import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, SMALL, base_env, mpirun_cmd, read_log, summary, train_cmd

pytestmark = [pytest.mark.horovod,
              pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")]

# Same global batch, same rows per global step (ranks take interleaved batch slices):
# only the floating-point order of the gradient average differs.
TOL = {"auc": 2e-3, "final_loss": 2e-3}


def test_max_and_object_gather_across_ranks(tmp_path):
    """The summary's timed seconds are the slowest rank's (allreduce_max), its node list every
    rank's (allgather_object). Each rank writes its own file (mpirun interleaves their stdout)."""
    code = ("import json, sys, numpy as np\nfrom recsys.runtime.distributed import Distributed\nd = Distributed(True)\n"
            "m = d.allreduce_max(np.array([1.5 + d.rank, 7.0 - d.rank]))\n"
            "with open(f'{sys.argv[1]}/rank{d.rank}.json', 'w') as f:\n"
            "    json.dump([m.tolist(), d.allgather_object({'rank': d.rank})], f)\n")
    res = subprocess.run(mpirun_cmd(2, [sys.executable, "-c", code, str(tmp_path)]), env=base_env(), cwd=REPO,
                         text=True, capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == [[2.5, 7.0], [{"rank": 0}, {"rank": 1}]], (rank, got)


def test_two_ranks_mpirun_match_one_rank(tiny_data, dlrm_one_rank, tmp_path):
    log = tmp_path / "log.jsonl"
    cmd = mpirun_cmd(2, train_cmd("--model", "dlrm", "--data-path", tiny_data("dlrm"), *SMALL["dlrm"],
                                  "--epochs", "1", "--max-steps", "16", "--log-path", log, "--log-every", "4"))
    res = subprocess.run(cmd, env=base_env(), cwd=REPO, text=True, capture_output=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    s = summary(read_log(log))
    assert s["world_size"] == 2 and s["step"] == 16
    digests = s["replica_weight_digests"]
    assert len(digests) == 2 and digests[0] == digests[1], digests
    for key, tol in TOL.items():
        assert abs(s[key] - dlrm_one_rank[key]) < tol, (key, s[key], dlrm_one_rank[key])
    # replicated tables without distributed-embeddings, said once
    assert res.stderr.count("embedding tables replicated on every rank") == 1


def test_two_ranks_wide_deep_and_ncf_stay_identical(tiny_data, tmp_path):
    """Two optimizers (W&D) and in-engine negative sampling (NCF) keep replicas in sync."""
    for model in ("wide_deep", "ncf"):
        log = tmp_path / f"{model}.jsonl"
        cmd = mpirun_cmd(2, train_cmd("--model", model, "--data-path", tiny_data(model), *SMALL[model],
                                      "--epochs", "1", "--max-steps", "6", "--log-path", log))
        res = subprocess.run(cmd, env=base_env(), cwd=REPO, text=True, capture_output=True, timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        s = summary(read_log(log))
        assert s["world_size"] == 2
        assert s["replica_weight_digests"][0] == s["replica_weight_digests"][1]
