"""distributed-embeddings runs are planned with DE's own strategy (issue 34, item 4).

DE places a group's tables itself (``DistEmbeddingStrategy``, strategy ``memory_balanced``): power-of-two
column slices, ``<=`` at the data-parallel threshold, slices dealt back and forth over the ranks, a
rank's tables of one width concatenated. The fit check used the project's balancing planner, which
cuts and places otherwise; a DE group's plan is now ``planner.plan_distributed_embeddings``, built
from a pure-Python copy of those rules (``distributed_embeddings_layout``: no TensorFlow, so it runs
on a login node). The fast tests hold what the layout must be on its own terms; the last test holds it
against DE's own code (its strategy object and its ``set_weights`` column cut, on many ranks, which
need no Horovod) when its source is given (``RECSYS_DE_SOURCE``, see de_source.py; skipped in
CI). Measured: the fast tests under 1 s; the DE comparison about 10 s (a subprocess importing
TensorFlow and Horovod).
"""
from __future__ import annotations

import json
import textwrap

import pytest

from de_source import needs_de_source, run_with_de
from recsys.placement.planner import distributed_embeddings_layout

DE = "distributed-embeddings"

# MLPerf DLRM Criteo 1TB, 40M-hash cardinalities (tests/recsys/test_placement.py), width 128.
CRITEO_1TB = [(c, 128) for c in [39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546,
                                 403346, 10, 2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935,
                                 12972, 108, 36]]
MIXED = [(1000, 16), (10, 16), (500, 8), (2000, 16), (7, 3), (300, 8), (64, 1), (4000, 32)]


def _outbrain_tables():
    """Wide & Deep's deep and wide groups on the reference Outbrain feature set, as [(rows, width)]."""
    from preproc.outbrain import features as F
    from recsys.models.embedding_tables import wide_deep_groups
    _, onehot, multihot = F.feature_layout("reference", F.REFERENCE_BUCKETS, F.REFERENCE_MULTIHOT)
    deep, wide = wide_deep_groups(list(onehot.items()), [(n, b) for n, (b, _) in multihot.items()], 64)
    return list(zip(deep.cardinalities, deep.widths)), list(zip(wide.cardinalities, wide.widths))


def _cases():
    deep, wide = _outbrain_tables()
    cases = []
    for tables in (CRITEO_1TB, deep, wide, MIXED):
        biggest = max(r * w for r, w in tables)
        for world in (1, 2, 3, 8, 16, 24, 64):
            for col, dp in ((None, None), (biggest // 5, None), (None, sorted(r * w for r, w in tables)[2]),
                            (biggest // 33, 5000), (None, biggest)):
                cases.append((tables, world, col, dp))
    return cases


def _check_covers(layout, tables):
    """Every model-parallel table's columns exactly once over the ranks; a rank's variables filled
    row after row; data-parallel tables held nowhere else."""
    for i in layout.model_parallel:
        cols = sorted((p[5], p[6]) for p in layout.pieces if p[4] == i)
        assert cols[0][0] == 0 and cols[-1][1] == tables[i][1], (i, cols)
        assert all(a[1] == b[0] for a, b in zip(cols, cols[1:])), (i, cols)
    for rank in range(layout.world_size):
        mine = [p for p in layout.pieces if p[0] == rank]
        for var in {p[1] for p in mine}:
            spans = sorted((p[2], p[3], p[6] - p[5]) for p in mine if p[1] == var)
            assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
            assert len({w for *_, w in spans}) == 1               # one width per concatenated variable
            assert var >= len(layout.data_parallel)
    assert not {p[4] for p in layout.pieces} & set(layout.data_parallel)


@pytest.mark.fast
def test_the_layout_covers_every_table_once_on_every_case():
    for tables, world, col, dp in _cases():
        layout = distributed_embeddings_layout(tables, world, col, dp)
        _check_covers(layout, tables)
        assert sorted(layout.data_parallel + layout.model_parallel) == list(range(len(tables)))


@pytest.mark.fast
def test_des_rules_where_the_balancing_planner_differs():
    # <= at the data-parallel threshold (the planner keeps only tables under it replicated).
    assert distributed_embeddings_layout([(10, 4), (100, 4)], 2, None, 40).data_parallel == (0,)
    # Power-of-two slices: 3 x the threshold is cut in 4 (the planner: ceil(3) = 3), never more than the width.
    layout = distributed_embeddings_layout([(100, 8), (100, 8), (100, 8), (100, 8)], 4, 270)
    assert sorted(p[6] - p[5] for p in layout.pieces if p[4] == 0) == [2, 2, 2, 2]
    assert len([p for p in distributed_embeddings_layout([(10 ** 6, 3)], 8, 1).pieces]) == 3
    # No threshold, fewer tables than ranks: the largest is halved until every rank has a piece.
    layout = distributed_embeddings_layout([(1000, 16), (10, 16)], 4)
    assert layout.every_rank_has_a_piece and layout.slice_count == 5      # the halving overshoots: 4 + 1
    # 1-wide tables cannot be cut: 16 of them leave 8 of 24 ranks without a piece.
    wide = distributed_embeddings_layout([(1000, 1)] * 16, 24)
    assert not wide.every_rank_has_a_piece and wide.slice_count == 16
    # Dealt back and forth by size, whatever the load: 10,1,1,1,1,1 on 2 ranks go 10,1,1 / 1,1,1 (the
    # balancing planner puts the five 1s beside each other, away from the 10).
    layout = distributed_embeddings_layout([(s, 1) for s in (10, 1, 1, 1, 1, 1)], 2)
    assert [sorted(t) for t in layout.rank_tables] == [[0, 2, 3], [1, 4, 5]]     # ties: the later table first
    # A rank's tables of one width share one variable, rows concatenated in its order.
    layout = distributed_embeddings_layout([(10, 4), (20, 4), (5, 2)], 1)
    assert [p[1:4] for p in layout.pieces] == [(0, 0, 10), (0, 10, 30), (1, 0, 5)]


@pytest.mark.fast
def test_a_de_run_is_checked_against_the_plan_de_builds():
    """The placement's plan of a DE group is DE's layout: per-rank bytes, slices and the verdict."""
    from recsys.placement.decision import choose_placement
    from recsys.placement.planner import plan_distributed_embeddings
    tables = [(f"cat_{i}", r, w) for i, (r, w) in enumerate(CRITEO_1TB)]
    p = choose_placement("model_parallel", 8, tables, implementation=DE, data_parallel_threshold=100_000)
    layout = distributed_embeddings_layout(CRITEO_1TB, 8, None, 100_000)
    dp_bytes = sum(CRITEO_1TB[i][0] * 128 * 4 for i in layout.data_parallel)
    assert p.embedding_bytes == [4 * e + dp_bytes for e in layout.rank_elements()]
    assert p.plan("embeddings").embedding_bytes == plan_distributed_embeddings(
        tables, 8, data_parallel_threshold=100_000).embedding_bytes
    # The balancing planner places the same tables otherwise (its plan is what the alltoall layer builds).
    alltoall = choose_placement("model_parallel", 8, tables, data_parallel_threshold=100_000)
    assert alltoall.embedding_bytes != p.embedding_bytes
    assert sum(alltoall.embedding_bytes) == sum(p.embedding_bytes)    # the same tables, cut otherwise
    assert any(line.startswith("    rank 0:") for line in p.describe())


# Runs behind de_source.PRELUDE (DE importable, its op library stood in for, write_result).
_STRATEGY = textwrap.dedent("""\
    import json, sys, types
    import numpy as np
    from distributed_embeddings.python.layers import dist_model_parallel as dmp

    class Marker:
        # A table DE cuts by columns without materialising it: row j of the cut is (table, column...).
        def __init__(self, t, rows, width):
            self.t, self.shape = t, (rows, width)
        def __getitem__(self, key):
            c0, c1, _ = key[1].indices(self.shape[1])
            return np.array([[self.t * 100000 + c for c in range(c0, c1)]], np.int64)
        def __array__(self, dtype=None):      # one rank: DE concatenates the tables uncut
            return self[:, :]

    out = []
    for tables, world, col, dp in json.loads(sys.argv[1]):
        layers = [dmp.Embedding(r, w, combiner="sum") for r, w in tables]
        # DistributedEmbedding passes no data-parallel threshold on one rank.
        st = dmp.DistEmbeddingStrategy(layers, world, "memory_balanced", column_slice_threshold=col,
                                       data_parallel_threshold=dp if world > 1 else None)
        case = dict(dp=st.table_groups[0], mp=st.table_groups[1], ranks=[])
        if st.table_groups[1]:
            markers = [Marker(t, r, w) for t, (r, w) in enumerate(tables)]
            next_col = {}
            for rank in range(world):
                # The columns get_weights joins a table from: its slices' widths in rank order.
                group_of = {j: g for g, members in enumerate(st.local_group_list[rank]) for j in members}
                tables_here = [st.table_groups[1][k] for k in st.table_ids[rank]]
                built = []
                for j, t in enumerate(tables_here):
                    width = st.local_configs[rank][group_of[j]]["output_dim"]
                    c0 = next_col.get(t, 0)
                    next_col[t] = c0 + width
                    built.append([t, c0, c0 + width])
                layer = types.SimpleNamespace(strategy=st, rank=rank, world_size=world)
                try:            # and the columns its set_weights cuts for the same variables
                    cut = dmp.DistributedEmbedding.set_col_slice_weights(
                        layer, [markers[i] for i in st.table_groups[1]])
                    cut = [[[int(v[0]) // 100000, int(v[0]) % 100000, int(v[-1]) % 100000 + 1] for v in var]
                           for var in cut]
                except (ValueError, IndexError) as err:   # IndexError: a rank without tables
                    cut = str(err)
                case["ranks"].append(dict(
                    tables=tables_here, groups=st.local_group_list[rank],
                    shapes=[[c["input_dim"], c["output_dim"]] for c in st.local_configs[rank]],
                    offsets=st.local_weight_offsets[rank], built=built, cut=cut))
        out.append(case)
    write_result(out)
""")


@needs_de_source
def test_the_layout_is_des_own_on_criteo_1tb_outbrain_and_mixed_tables(tmp_path):
    """On each case DE's strategy keeps the same tables data parallel, gives every rank the same tables
    in the same order, builds variables of the same shapes with the same row offsets, and its
    ``set_weights`` cuts every table into the columns the layout says."""
    cases = _cases()
    got = run_with_de(_STRATEGY, tmp_path, json.dumps(cases))[0]
    compared, miscut = 0, 0
    for (tables, world, col, dp), de in zip(cases, got):
        layout = distributed_embeddings_layout(tables, world, col, dp)
        where = (len(tables), world, col, dp)
        assert list(layout.data_parallel) == de["dp"] and list(layout.model_parallel) == de["mp"], where
        if not de["mp"]:
            continue
        for rank, mine in enumerate(de["ranks"]):
            pieces = [p for p in layout.pieces if p[0] == rank]
            assert list(layout.rank_tables[rank]) == mine["tables"], (where, rank)
            variables = sorted({p[1] for p in pieces})
            shapes = [[max(p[3] for p in pieces if p[1] == v), next(p[6] - p[5] for p in pieces if p[1] == v)]
                      for v in variables]
            assert shapes == mine["shapes"], (where, rank)
            built = {t: (c0, c1) for t, c0, c1 in mine["built"]}
            for v, offsets, members in zip(variables, mine["offsets"], mine["groups"]):
                in_var = sorted((p[2], p[3], p[4], p[5], p[6]) for p in pieces if p[1] == v)
                assert [r0 for r0, *_ in in_var] + [in_var[-1][1]] == offsets, (where, rank, v)
                assert [t for _, _, t, _, _ in in_var] == [mine["tables"][j] for j in members], (where, rank, v)
                assert all(built[t] == (c0, c1) for _, _, t, c0, c1 in in_var), (where, rank, v)
            # DE's set_weights counts a rank's merged slices of one table as one: it cuts that rank's
            # columns otherwise than its variables hold them (a ValueError, or wrong columns).
            as_built = [[[t, c0, c1] for _, _, t, c0, c1 in sorted((p[2], p[3], p[4], p[5], p[6])
                                                                    for p in pieces if p[1] == v)] for v in variables]
            if layout.slice_count == len(layout.pieces) and layout.every_rank_has_a_piece:
                assert mine["cut"] == as_built, (where, rank)
            miscut += mine["cut"] != as_built
        assert layout.rank_elements() == [sum(r * c for r, c in m["shapes"]) for m in de["ranks"]], where
        compared += 1
    assert compared > 100 and miscut > 0
