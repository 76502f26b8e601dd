"""The test cluster itself: real daemons, GPUs as GRES, PMIx MPI across nodes."""
import pytest

pytestmark = pytest.mark.slurm

HELLO = r"""
import os
from mpi4py import MPI
c = MPI.COMM_WORLD
print(c.rank, c.size, os.environ["SLURM_LOCALID"], os.environ["SLURMD_NODENAME"], c.allreduce(c.rank), flush=True)
"""


def test_nodes_idle_with_gpu_gres(slurm_cluster):
    out = slurm_cluster.run(["sinfo", "-h", "-N", "-o", "%N %T %G"], check=True).stdout
    rows = sorted(set(out.split("\n")) - {""})
    assert rows == [f"{n} idle gpu:2" for n in slurm_cluster.nodes]


def test_pmix_mpi_spans_two_nodes(slurm_cluster, venv_python, tmp_path):
    script = tmp_path / "hello.py"
    script.write_text(HELLO)
    res = slurm_cluster.run(["srun", "-N2", "--ntasks-per-node=2", "--mpi=pmix",
                             venv_python, str(script)], timeout=120)
    assert res.returncode == 0, res.stderr
    rows = sorted(tuple(line.split()) for line in res.stdout.strip().splitlines())
    assert [r[:3] for r in rows] == [("0", "4", "0"), ("1", "4", "1"), ("2", "4", "0"), ("3", "4", "1")]
    assert len({r[3] for r in rows}) == 2          # two distinct emulated nodes
    assert {r[4] for r in rows} == {"6"}           # allreduce saw every rank


def test_sacct_fails_without_accounting(slurm_cluster):
    res = slurm_cluster.run(["sacct", "-X", "-n"])
    assert res.returncode != 0
    assert "accounting storage is disabled" in (res.stdout + res.stderr).lower()
