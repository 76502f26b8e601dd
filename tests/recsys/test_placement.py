"""The embedding placement planner (pure function) and its CLI."""
import subprocess
import sys

import pytest

from recsys.placement import PlacementError, format_plan, plan_placement


def test_single_rank_holds_everything():
    plan = plan_placement([("a", 10, 4), ("b", 20, 4)], 1)
    assert not plan.model_parallel
    assert plan.embedding_bytes == [(10 + 20) * 4 * 4]


def test_tables_balanced_largest_first():
    tables = [("t0", 100, 8), ("t1", 400, 8), ("t2", 300, 8), ("t3", 200, 8)]
    plan = plan_placement(tables, 2)
    where = {s.name: s.rank for s in plan.slices}
    # 400 -> r0, 300 -> r1, 200 -> r1 (300 < 400), 100 -> r0
    assert where == {"t1": 0, "t2": 1, "t3": 1, "t0": 0}
    assert plan.embedding_bytes == [500 * 32, 500 * 32]
    assert all(s.col_start == 0 and s.col_end == 8 for s in plan.slices)


def test_column_slicing_above_threshold_spreads_one_table():
    plan = plan_placement([("big", 1000, 16), ("small", 10, 16)], 4, column_slice_threshold=1000 * 16 * 4 // 4)
    big = [s for s in plan.slices if s.name == "big"]
    assert len(big) == 4 and len({s.rank for s in big}) == 4           # one slice per rank
    assert [(s.col_start, s.col_end) for s in big] == [(0, 4), (4, 8), (8, 12), (12, 16)]
    assert sum(s.nbytes for s in big) == 1000 * 16 * 4


def test_slices_never_exceed_world_or_width():
    plan = plan_placement([("wide", 10 ** 6, 3)], 8, column_slice_threshold=1)
    assert len(plan.slices) == 3                                        # limited by the 3 columns


def test_memory_per_rank_counts_optimizer_and_dense_and_fit():
    plan = plan_placement([("a", 1000, 10)], 2, bytes_per_param=4, optimizer_slots=2, dense_params=100,
                          capacity_bytes=1000 * 10 * 12 + 100 * 12)
    assert plan.rank_bytes == [1000 * 10 * 12 + 1200, 1200]
    assert plan.fits
    plan.capacity_bytes -= 1
    assert not plan.fits
    assert "DOES NOT FIT" in format_plan(plan)


def test_replicated_plan_and_errors():
    plan = plan_placement([("a", 10, 4), ("b", 10, 4)], 4, model_parallel=False)
    assert plan.embedding_bytes == [320] * 4 and len(plan.slices) == 8
    with pytest.raises(PlacementError):
        plan_placement([("a", 0, 4)], 2)
    with pytest.raises(PlacementError):
        plan_placement([("a", 1, 4)], 0)


def test_cli_with_feature_spec(tiny_data):
    spec = tiny_data("dlrm") / "feature_spec.yaml"
    res = subprocess.run([sys.executable, "-m", "recsys.placement", "--model", "dlrm", "--feature-spec", str(spec),
                          "--gpus", "8", "--gpu-memory-gb", "80"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "rank 7:" in res.stdout and "fits" in res.stdout
    # Criteo-1TB-sized tables (T=3: about 22.8B parameters... here 4 x 1e9 rows x 128) do not fit one 16 GB GPU
    res = subprocess.run([sys.executable, "-m", "recsys.placement", "--model", "dlrm", "--cardinalities",
                          "1000000000,1000000000,1000000000,1000000000", "--gpus", "1", "--gpu-memory-gb", "16"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "DOES NOT FIT" in res.stdout
