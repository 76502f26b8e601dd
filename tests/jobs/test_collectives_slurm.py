"""The fabric micro-benchmark as a job on the real local Slurm cluster (issue 36, item 2):
`recsys-submit benchmark --payload collectives` measures allreduce, alltoall and allgather through
Horovod over MPI inside a 1-node job (intra_node) and a job of one rank per node (inter_node);
`profiles fabric` turns the two files into a profile's fabric, which loads, and the emulated
study is projected on it (the emulated check of docs/studies.md)."""

import os

import pytest
import yaml

from jobs.profiles import load_profile
from jobs.study.analysis import projection as P

pytestmark = pytest.mark.slurm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUDY = os.path.join(ROOT, "docs", "studies", "emulated-dlrm-strong")
SIZES = ["4K", "256K"]


def measure(cli, slurm_cluster, out, nodes, gpus_per_node):
    run_dir, record = cli.submit("benchmark", "--profile", "ci", "--payload", "collectives", "--nodes", str(nodes),
                                 "--gpus-per-node", str(gpus_per_node), "--time", "5", "--",
                                 "--out", str(out), "--sizes", ",".join(SIZES), "--iters", "5", "--warmup", "2")
    assert slurm_cluster.wait_job(record["jobs"][0]["job_id"]) == "COMPLETED", run_dir
    with open(out) as f:
        return yaml.safe_load(f)


def test_collectives_job_measures_both_levels_and_the_projection_stands_on_them(cli, slurm_cluster, tmp_path):
    intra = measure(cli, slurm_cluster, tmp_path / "intra.yaml", 1, 2)
    inter = measure(cli, slurm_cluster, tmp_path / "inter.yaml", 2, 1)
    for record, level in ((intra, "intra_node"), (inter, "inter_node")):
        assert (record["level"], record["ranks"]) == (level, 2)
        assert len(record["rows"]) == 3 * len(SIZES)
        figures = record["measured"][level]
        assert set(figures) == {"allreduce", "alltoall", "allgather"}
        assert all(v["busbw_gb_per_s"] > 0 and v["latency_us"] > 0 for v in figures.values())
        # the peak bus bandwidth is the largest of the rows', each row's busbw = size / time x factor
        for coll, v in figures.items():
            rows = [r for r in record["rows"] if r["collective"] == coll]
            assert v["busbw_gb_per_s"] == pytest.approx(max(r["busbw_gb_per_s"] for r in rows), rel=1e-5)
            factor = 1.0                                      # 2 ranks: 2(n-1)/n = 1 and (n-1)/n = 1/2
            for r in rows:
                expected = r["size"] / (r["time_us"] * 1e-6) / 1e9 * (factor if coll == "allreduce" else 0.5)
                assert r["busbw_gb_per_s"] == pytest.approx(expected, rel=1e-4)

    proc = cli("profiles", "fabric", str(tmp_path / "intra.yaml"), str(tmp_path / "inter.yaml"), "--profile", "ci",
               check=True)
    section = yaml.safe_load(proc.stdout)
    profile = {"extends": "ci", **section}
    path = tmp_path / "ci-measured.yaml"
    path.write_text(yaml.safe_dump(profile))
    measured = load_profile(str(path))
    assert measured.fabric.bandwidth("inter_node", "alltoall", 2) == inter["measured"]["inter_node"]["alltoall"][
        "busbw_gb_per_s"]

    # the emulated check: the recorded study calibrated on its 1-rank point, projected on this fabric
    record = P.run(STUDY + ".yaml", measured, [1, 2, 4, 8], report=STUDY + ".json")
    points = {p["gpus"]: p for p in record["points"]}
    assert record["shared_host_cores"] == 2 and record["fabric"]["measured"]
    for n in (2, 4, 8):
        p = points[n]
        assert p["measured_throughput"] and p["throughput_low"] <= p["throughput_high"]
        assert p["phases_ms"]["embedding_exchange"] > 0 and p["phases_ms"]["gradient_exchange"] > 0
