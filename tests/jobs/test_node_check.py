"""Per-node checks before a job's first step (slurm/node-check.sh, issue 47 item 7), run by bash as
the job script runs them: a locked-memory limit InfiniBand cannot work under (an InfiniBand class
directory stood in by RECSYS_NODE_CHECK_IB_ROOT, the limit lowered with `ulimit -l`), the NCCL
interface (slurm/nccl-ifname.sh) and python3 for the sampler, each one line naming the node. The
fan-out to every node of a multinode job: tests/jobs/test_node_check_slurm.py."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

SCRIPT = Path(__file__).resolve().parents[2] / "slurm" / "node-check.sh"


def _check(env, limit=None):
    line = (f"ulimit -l {limit}; " if limit else "") + f'bash "{SCRIPT}"'
    base = {"PATH": os.environ["PATH"], "SLURMD_NODENAME": "dgx07"}
    return subprocess.run(["bash", "-c", line], env={**base, **env}, capture_output=True, text=True, timeout=60)


def test_a_locked_memory_limit_infiniband_cannot_use_is_one_line_naming_the_node(tmp_path):
    (tmp_path / "ib" / "mlx5_0").mkdir(parents=True)
    ib = {"RECSYS_NODE_CHECK_IB_ROOT": str(tmp_path / "ib")}
    out = _check(ib, limit=64)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out
    assert out.stderr.startswith("recsys: error: node dgx07: locked-memory limit (ulimit -l) is 64 KiB; "
                                 "InfiniBand (mlx5_0) needs unlimited")
    assert _check({**ib, "RECSYS_MIN_MEMLOCK_KB": "32"}, limit=64).returncode == 0     # a site's floor
    assert _check({"RECSYS_NODE_CHECK_IB_ROOT": str(tmp_path / "none")}, limit=64).returncode == 0   # no IB
    out = _check({"NCCL_SOCKET_IFNAME": "ib0"})
    assert out.returncode == 2 and "NCCL_SOCKET_IFNAME=ib0: no such network interface on dgx07" in out.stderr


def test_no_python3_for_the_sampler_is_a_warning_naming_the_node(tmp_path):
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in ("bash", "ls", "head", "hostname", "dirname"):
        (tools / tool).symlink_to(shutil.which(tool))
    out = _check({"PATH": str(tools)})
    assert out.returncode == 0 and out.stderr == ("recsys: warning: node dgx07: no python3 on PATH: the hardware "
                                                  "sampler (slurm/hwsample.py) records nothing here\n")
    assert _check({"PATH": str(tools), "RECSYS_HW_SAMPLE": "0"}).stderr == ""
