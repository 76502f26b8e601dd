"""A table group that distributed-embeddings cannot spread over every rank is made data parallel at placement.

DE stops at model build ("Not enough table after slicing to run on all worker") when its column
slicing leaves a rank without a piece; 1-wide tables cannot be cut, so Wide & Deep's wide group of
16 tables (the reference Outbrain feature set) fails on more than 16 ranks (3 DGX nodes and up).
The placement now decides it before TensorFlow starts (recsys.placement.decision): that group is
kept data parallel (DE's data-parallel threshold raised over its tables, so DE keeps them all data
parallel), counted on every rank in the memory check, and said in the placement record and lines.

The rule is held against DE's own ``DistEmbeddingStrategy`` when its source is given
(``RECSYS_DE_SOURCE``, see de_source.py). Measured: under 1 s (placement, pure Python); the DE
cross-check about 8 s (a subprocess importing TensorFlow and Horovod).
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, base_env
from de_source import needs_de_source, run_with_de

DE = "distributed-embeddings"


def _outbrain_groups():
    """Wide & Deep's groups on the reference Outbrain feature set (13 one-hot + 3 multi-hot features)."""
    from preproc.outbrain import features as F
    from recsys.models.embedding_tables import wide_deep_groups
    _, onehot, multihot = F.feature_layout("reference", F.REFERENCE_BUCKETS, F.REFERENCE_MULTIHOT)
    return wide_deep_groups(list(onehot.items()), [(n, b) for n, (b, _) in multihot.items()], 64)


@pytest.mark.fast
def test_wide_group_on_more_ranks_than_wide_tables_is_data_parallel_with_distributed_embeddings():
    from recsys.placement.decision import choose_placement
    deep, wide = _outbrain_groups()
    assert len(wide.tables) == 16 and set(wide.widths) == {1}
    for ranks in (8, 16):            # as many pieces as ranks or more: DE places both groups itself
        p = choose_placement("model_parallel", ranks, [deep, wide], model="wide_deep", implementation=DE)
        assert p.data_parallel_groups == () and p.plan(wide.name).model_parallel
    p = choose_placement("model_parallel", 24, [deep, wide], model="wide_deep", implementation=DE)
    assert [name for name, _ in p.data_parallel_groups] == [wide.name]
    assert p.data_parallel_group(wide.name) and not p.data_parallel_group(deep.name)
    why = dict(p.data_parallel_groups)[wide.name]
    assert why == ("distributed-embeddings cuts its 16 tables into 16 model-parallel pieces, fewer than the 24 "
                   "ranks (16 of its tables are 1 wide and cannot be cut by columns): data parallel")
    # The memory check counts the wide tables whole on every rank; the deep group stays sliced.
    wide_plan, deep_plan = p.plan(wide.name), p.plan(deep.name)
    assert not wide_plan.model_parallel and deep_plan.model_parallel
    for r in range(24):
        assert sorted(s.name for s in wide_plan.slices if s.rank == r) == sorted(t.name for t in wide.tables)
    assert p.as_record()["data_parallel_groups"] == {wide.name: why}
    assert any(line.startswith(f"  {wide.name}: 16 tables, optimizer ftrl; {why}") for line in p.describe())
    # Our alltoall layer places a table per rank or none: no such change there.
    alltoall = choose_placement("model_parallel", 24, [deep, wide], model="wide_deep")
    assert alltoall.data_parallel_groups == () and alltoall.plan(wide.name).model_parallel


@pytest.mark.fast
def test_the_decision_reaches_the_run_configuration_before_tensorflow(monkeypatch):
    """recsys-train's configuration, built before TensorFlow on every rank, holds it (and the layer
    reads it from there: recsys.embeddings.group)."""
    from recsys.configuration.train_config import TrainConfig
    from recsys.train import build_parser
    monkeypatch.setenv("WORLD_SIZE", "32")
    args = ["--model", "wide_deep", "--synthetic", "--batch-size", "4096", "--eval-batch-size", "4096",
            "--embedding-placement", "model_parallel", "--embedding-implementation", DE]
    cfg = TrainConfig.from_args(build_parser().parse_args(args))
    assert cfg.placement.world_size == 32 and cfg.placement.model_parallel
    assert [n for n, _ in cfg.placement.data_parallel_groups] == ["wide_embeddings"]
    assert not cfg.placement.plan("wide_embeddings").model_parallel


# Runs behind de_source.PRELUDE (DE importable, its op library stood in for, write_result).
_STRATEGY = textwrap.dedent("""\
    import json, sys
    from distributed_embeddings.python.layers import dist_model_parallel as dmp
    out = []
    for tables, world, col, dp in json.loads(sys.argv[1]):
        layers = [dmp.Embedding(r, w, combiner="sum") for r, w in tables]
        st = dmp.DistEmbeddingStrategy(layers, world, "memory_balanced", column_slice_threshold=col,
                                       data_parallel_threshold=dp)
        mp = bool(st.table_groups[1])
        out.append(dict(model_parallel=mp, every_rank=mp and all(st.local_configs)))
    write_result(out)
""")


@needs_de_source
def test_the_rule_agrees_with_distributed_embeddings_own_strategy(tmp_path):
    """For each case, DE's strategy leaves a rank without a piece exactly when the placement says so, and
    the data-parallel threshold the group then gets leaves DE nothing to slice."""
    from recsys.placement.decision import distributed_embeddings_slices
    deep, wide = _outbrain_groups()
    cases = []
    for group in (deep, wide):
        tables = list(zip(group.cardinalities, group.widths))
        for world in (4, 16, 17, 24, 64):
            for col, dp in ((None, None), (2_000_000, None), (None, 3_000), (200_000, 50_000)):
                cases.append((tables, world, col, dp))
        biggest = max(r * w for r, w in tables)
        cases.append((tables, 24, None, biggest))          # what EmbeddingGroup passes for such a group
    got = run_with_de(_STRATEGY, tmp_path, json.dumps(cases))[0]
    for (tables, world, col, dp), de in zip(cases, got):
        pieces = distributed_embeddings_slices(tables, world, col, dp)
        assert de["model_parallel"] == (pieces > 0), (world, col, dp)
        if de["model_parallel"]:
            assert de["every_rank"] == (pieces >= world), (len(tables), world, col, dp, pieces)
    assert not got[-1]["model_parallel"] and not got[len(cases) // 2 - 1]["model_parallel"]
    outcomes = {(d["model_parallel"], d["every_rank"]) for d in got}
    assert outcomes == {(True, True), (True, False), (False, False)}     # every outcome was compared


@pytest.mark.fast
def test_the_placement_cli_shows_it_before_any_job():
    """``python -m recsys.place_tables --embedding-implementation distributed-embeddings`` prints the same decision."""
    cards = ",".join(str(r) for r in _outbrain_groups()[1].cardinalities)
    res = subprocess.run([sys.executable, "-m", "recsys.place_tables", "--model", "wide_deep", "--cardinalities", cards,
                          "--gpus", "24", "--embedding-implementation", DE], env=base_env(), cwd=REPO, text=True,
                         capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert ("  wide_embeddings: 16 tables, optimizer ftrl; distributed-embeddings cuts its 16 tables into 16 "
            "model-parallel pieces, fewer than the 24 ranks") in res.stdout
