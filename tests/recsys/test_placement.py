"""The embedding placement planner (pure function) and its CLI."""
import subprocess
import sys

import pytest

from recsys.placement.planner import PlacementError, format_plan, plan_placement

pytestmark = pytest.mark.fast


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
    res = subprocess.run([sys.executable, "-m", "recsys.place_tables", "--model", "dlrm", "--feature-spec", str(spec),
                          "--gpus", "8", "--gpu-memory-gb", "80"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert "rank 7:" in res.stdout and "fits" in res.stdout
    # Criteo-1TB-sized tables (T=3: about 22.8B parameters... here 4 x 1e9 rows x 128) do not fit one 16 GB GPU
    res = subprocess.run([sys.executable, "-m", "recsys.place_tables", "--model", "dlrm", "--cardinalities",
                          "1000000000,1000000000,1000000000,1000000000", "--gpus", "1", "--gpu-memory-gb", "16"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and "DOES NOT FIT" in res.stdout


# MLPerf DLRM Criteo 1TB, 40M-hash cardinalities (the 26 categorical features).
CRITEO_1TB_40M = [39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208,
                  11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36]


def _covers_every_column_once(plan, tables):
    for i, (_, _, dim) in enumerate(tables):
        cols = sorted((s.col_start, s.col_end) for s in plan.slices if s.table == i)
        assert cols[0][0] == 0 and cols[-1][1] == dim
        assert all(a[1] == b[0] for a, b in zip(cols, cols[1:])), (i, cols)


def test_criteo_1tb_on_8_ranks_auto_slicing_balances_memory():
    tables = [(f"cat_{i}", c, 128) for i, c in enumerate(CRITEO_1TB_40M)]
    unsliced = plan_placement(tables, 8)
    assert unsliced.imbalance > 70                      # the old plan: 19.07 GiB vs 0.26 GiB
    plan = plan_placement(tables, 8, auto_slice=True, capacity_bytes=int(80e9 * 0.9))
    assert plan.imbalance <= 1.25, [b / 2**30 for b in plan.rank_bytes]
    assert plan.fits
    total = sum(c * 128 * 4 for c in CRITEO_1TB_40M)
    assert sum(plan.embedding_bytes) == total                          # nothing lost or counted twice
    _covers_every_column_once(plan, tables)
    for r in range(8):                                                  # a rank holds one slice per table
        held = [s.table for s in plan.tables_on(r)]
        assert len(held) == len(set(held))
    assert "max/min per-rank memory" in format_plan(plan)


def test_auto_slicing_leaves_a_balanced_plan_alone_and_is_deterministic():
    tables = [("t0", 100, 8), ("t1", 400, 8), ("t2", 300, 8), ("t3", 200, 8)]
    plan = plan_placement(tables, 2, auto_slice=True)
    assert all((s.col_start, s.col_end) == (0, 8) for s in plan.slices)
    assert plan_placement(tables, 2, auto_slice=True).slices == plan.slices


def test_small_tables_stay_data_parallel_below_threshold():
    tables = [("big", 1000, 16), ("tiny", 10, 16), ("mid", 500, 16)]
    plan = plan_placement(tables, 2, data_parallel_threshold=10 * 16 * 4 + 1, auto_slice=True)
    tiny = [s for s in plan.slices if s.name == "tiny"]
    assert len(tiny) == 2 and all(s.replicated for s in tiny) and {s.rank for s in tiny} == {0, 1}
    assert not any(s.replicated for s in plan.slices if s.name != "tiny")
    assert sum(plan.embedding_bytes) == (1000 + 500) * 64 + 2 * 10 * 64
    assert plan.as_dict()["replicated_tables"] == ["tiny"]


def _train(*argv, env_extra=None):
    import os
    env = dict(os.environ)
    for k in [k for k in env if k.startswith(("OMPI_COMM_WORLD", "PMIX_", "SLURM_"))] + ["WORLD_SIZE"]:
        env.pop(k, None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "recsys.train", *argv], capture_output=True, text=True,
                          timeout=60, env=env)


@pytest.mark.parametrize("argv, env, message", [
    (["--embedding-placement", "model_parallel", "--embedding-memory-gb", "1e-6"], {"WORLD_SIZE": "2"},
     "model_parallel does not fit: rank"),
    (["--embedding-placement", "auto", "--embedding-memory-gb", "1e-6"], {"WORLD_SIZE": "2"},
     "neither placement fits"),
    (["--embedding-placement", "model_parallel", "--xla"], {"WORLD_SIZE": "2"}, "cannot be used with --xla"),
])
def test_placement_errors_are_one_line_before_tensorflow(argv, env, message, tmp_path):
    """Bad placement requests fail in the argument layer: exit 2, one line, TensorFlow never imported."""
    res = _train("--model", "dlrm", "--synthetic", "--log-path", str(tmp_path / "log.jsonl"), *argv, env_extra=env)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("recsys-train: error: --embedding-placement"), lines
    assert message in lines[0]
    assert not (tmp_path / "log.jsonl").exists()           # nothing started


def test_auto_picks_model_parallel_when_replicated_does_not_fit():
    from recsys.placement.decision import choose_placement
    tables = [(f"t{i}", 1000, 16) for i in range(8)]                   # 64 kB each, 512 kB in all
    choice = choose_placement("auto", 4, tables, budget_bytes=200_000)
    assert choice.model_parallel and "do not fit" in choice.reason
    assert choose_placement("auto", 4, tables, budget_bytes=10**9).mode == "replicated"
    assert choose_placement("auto", 1, tables, budget_bytes=10**9).mode == "replicated"


def test_model_parallel_on_one_rank_is_every_table_local():
    """A study's 1-GPU point of a model-parallel sweep runs with all tables on its one rank."""
    from recsys.placement.decision import PlacementError, choose_placement
    tables = [(f"t{i}", 1000, 16) for i in range(8)]
    one = choose_placement("model_parallel", 1, tables, budget_bytes=10**9)
    assert one.mode == "replicated" and one.reason.startswith("one rank")
    with pytest.raises(PlacementError, match="model_parallel on one rank: the tables do not fit"):
        choose_placement("model_parallel", 1, tables, budget_bytes=1000)
