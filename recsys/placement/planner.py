"""The memory-balanced planner: which table (or column slice) of one table list lives on which rank.

Pure Python, so the argument layer and ``python -m recsys.place_tables`` run it
before TensorFlow starts; :mod:`recsys.placement.decision` applies it to a run's groups.

Strategy (of the project's alltoall layer; NVIDIA distributed-embeddings places its tables by its own
rules, reproduced by :func:`distributed_embeddings_layout` at the end of this module):
tables whose weights are smaller than ``data_parallel_threshold`` bytes stay
replicated on every rank; tables larger than ``column_slice_threshold`` bytes are
split by columns into at most ``world_size`` slices, then slices are placed largest
first on the least-loaded rank that does not already hold a slice of the same table.
With ``auto_slice`` the planner keeps doubling the column slices of the table
with the largest piece until the most loaded rank holds at most ``balance``
times the least loaded one (or nothing can be split further): a user does not
have to guess a threshold to get a balanced plan.
The thresholds compare the weights only, so the optimizer never changes the cut;
memory per rank counts the weights, their optimizer slots and the replicated
dense part (MLPs) with its slots.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from slurm.common.errors import ToolkitError

# Optimizer state kept per parameter, in copies of the weights.
OPTIMIZER_SLOTS = {"sgd": 0, "adagrad": 1, "rmsprop": 1, "ftrl": 2, "adam": 2, "lazy_adam": 2}


class PlacementError(ToolkitError, ValueError):
    pass


@dataclass(frozen=True)
class TableSlice:
    table: int          # index in the input table list
    name: str
    rank: int
    col_start: int
    col_end: int        # exclusive
    rows: int
    nbytes: int         # weights + optimizer slots of this slice
    replicated: bool = False   # a small table kept data-parallel (one copy on every rank)


@dataclass
class Plan:
    world_size: int
    model_parallel: bool
    slices: list = field(default_factory=list)
    embedding_bytes: list = field(default_factory=list)   # per rank
    dense_bytes: int = 0                                   # replicated on every rank
    capacity_bytes: int | None = None

    @property
    def rank_bytes(self):
        return [e + self.dense_bytes for e in self.embedding_bytes]

    @property
    def fits(self) -> bool:
        return self.capacity_bytes is None or max(self.rank_bytes) <= self.capacity_bytes

    @property
    def imbalance(self) -> float:
        """max / min per-rank memory (inf when a rank holds nothing)."""
        lo, hi = min(self.rank_bytes), max(self.rank_bytes)
        return hi / lo if lo > 0 else (1.0 if hi == 0 else math.inf)

    def tables_on(self, rank):
        return [s for s in self.slices if s.rank == rank]

    def as_dict(self):
        return {
            "world_size": self.world_size,
            "model_parallel": self.model_parallel,
            "fits": self.fits,
            "capacity_bytes": self.capacity_bytes,
            "rank_bytes": self.rank_bytes,
            "dense_bytes": self.dense_bytes,
            "slices": [[s.name, s.rank, s.col_start, s.col_end, s.rows, s.nbytes] for s in self.slices],
            "replicated_tables": sorted({s.name for s in self.slices if s.replicated}),
        }


def _split_columns(dim, parts):
    base, extra = divmod(dim, parts)
    bounds, start = [], 0
    for i in range(parts):
        width = base + (1 if i < extra else 0)
        bounds.append((start, start + width))
        start += width
    return bounds


def plan_placement(tables, world_size, *, bytes_per_param=4, optimizer_slots=0,
                   dense_params=0, column_slice_threshold=None, capacity_bytes=None,
                   model_parallel=True, data_parallel_threshold=None, auto_slice=False, balance=1.25):
    """Place embedding tables on ``world_size`` ranks.

    tables: sequence of ``(name, rows, dim)``. ``model_parallel=False`` gives the
    replicated plan (every rank holds every table). Thresholds are in bytes of the
    weights (``rows x dim x bytes_per_param``, slots not counted); ``nbytes`` and the
    per-rank memory count weights + slots. The result is deterministic: every rank
    computes the same plan.
    """
    if world_size < 1:
        raise PlacementError(f"world size must be >= 1, got {world_size}")
    per_param = bytes_per_param * (1 + optimizer_slots)
    tables = [(str(n), int(r), int(d)) for n, r, d in tables]
    for name, rows, dim in tables:
        if rows < 1 or dim < 1:
            raise PlacementError(f"table {name}: rows and dim must be positive, got {rows}x{dim}")
    plan = Plan(world_size=world_size, model_parallel=model_parallel and world_size > 1,
                dense_bytes=int(dense_params) * per_param, capacity_bytes=capacity_bytes)
    if not plan.model_parallel:
        total = 0
        for i, (name, rows, dim) in enumerate(tables):
            nbytes = rows * dim * per_param
            total += nbytes
            for r in range(world_size):
                plan.slices.append(TableSlice(i, name, r, 0, dim, rows, nbytes))
        plan.embedding_bytes = [total] * world_size
        return plan

    replicated, sharded, parts = 0, [], {}
    for i, (name, rows, dim) in enumerate(tables):
        nbytes, weights = rows * dim * per_param, rows * dim * bytes_per_param
        if data_parallel_threshold and weights < data_parallel_threshold:
            replicated += nbytes
            plan.slices += [TableSlice(i, name, r, 0, dim, rows, nbytes, True) for r in range(world_size)]
            continue
        sharded.append(i)
        parts[i] = 1
        if column_slice_threshold and weights > column_slice_threshold:
            parts[i] = min(world_size, dim, math.ceil(weights / column_slice_threshold))
    placed, load = _place(tables, sharded, parts, world_size, per_param)
    while auto_slice:
        total = [x + replicated + plan.dense_bytes for x in load]
        if min(total) > 0 and max(total) <= balance * min(total):
            break
        # Split further the table whose pieces are the largest, while it can be split.
        cands = [i for i in sharded if parts[i] < min(world_size, tables[i][2])]
        if not cands:
            break
        i = max(cands, key=lambda i: (tables[i][1] * tables[i][2] / parts[i], -i))
        parts[i] = min(parts[i] * 2, world_size, tables[i][2])
        placed, load = _place(tables, sharded, parts, world_size, per_param)
    plan.slices += placed
    plan.slices.sort(key=lambda s: (s.table, s.col_start, s.rank))
    plan.embedding_bytes = [x + replicated for x in load]
    return plan


def _place(tables, indices, parts, world_size, per_param):
    """Greedy largest-first placement of the column slices; returns (slices, load per rank)."""
    pieces = []
    for i in indices:
        name, rows, dim = tables[i]
        for c0, c1 in _split_columns(dim, parts[i]):
            pieces.append((i, name, rows, c0, c1, rows * (c1 - c0) * per_param))
    # Largest first; ties broken by table order so the plan is deterministic.
    pieces.sort(key=lambda p: (-p[5], p[0], p[3]))
    load = [0] * world_size
    holds = [set() for _ in range(world_size)]
    out = []
    for i, name, rows, c0, c1, nbytes in pieces:
        candidates = [r for r in range(world_size) if i not in holds[r]] or list(range(world_size))
        rank = min(candidates, key=lambda r: (load[r], r))
        load[rank] += nbytes
        holds[rank].add(i)
        out.append(TableSlice(i, name, rank, c0, c1, rows, nbytes))
    return out, load


def _gib(n):
    return f"{n / 2**30:.3f} GiB"


def rank_lines(plan: Plan):
    """One line per rank: its memory and the tables (``[c0:c1]`` column slices) it holds."""
    lines = []
    for r in range(plan.world_size):
        parts = []
        for s in plan.tables_on(r):
            cols = "" if (s.col_start == 0 and not _is_sliced(plan, s)) else f"[{s.col_start}:{s.col_end}]"
            parts.append(f"{s.name}{cols}" + (" (replicated)" if s.replicated else ""))
        shown = ", ".join(parts)        # every table: a hidden one could hold most of the rank's memory
        embeddings = f" (embeddings {_gib(plan.embedding_bytes[r])})" if plan.dense_bytes else ""
        lines.append(f"rank {r}: {_gib(plan.rank_bytes[r])}{embeddings} tables: {shown or '-'}")
    return lines


def format_plan(plan: Plan) -> str:
    """Human-readable plan: one line per rank, then the verdict."""
    mode = "model-parallel" if plan.model_parallel else "replicated"
    lines = [f"embedding placement ({mode}) on {plan.world_size} rank(s):"]
    lines += [f"  {line}" for line in rank_lines(plan)]
    if plan.model_parallel:
        lines.append(f"  max/min per-rank memory {plan.imbalance:.2f}")
    if plan.capacity_bytes is not None:
        verdict = "fits" if plan.fits else "DOES NOT FIT"
        lines.append(f"  max per rank {_gib(max(plan.rank_bytes))} of {_gib(plan.capacity_bytes)}: {verdict}")
    return "\n".join(lines)


def _is_sliced(plan, s):
    return (not s.replicated and plan.model_parallel
            and sum(1 for t in plan.slices if t.table == s.table and t.rank != s.rank) > 0)


# --- NVIDIA distributed-embeddings' own strategy ---------------------------------------------------
# DE (--embedding-implementation distributed-embeddings) places a group's tables by itself; the plan
# a DE run is checked against must be the one DE builds, not the balancing planner above (which cuts
# ceil(size / threshold) slices, keeps a table at the threshold replicated and places greedily). The
# rules below are those of ``DistEmbeddingStrategy`` in DE's ``dist_model_parallel.py`` at 4cb42d4
# (strategy "memory_balanced", no row slicing, no CPU offload: what recsys.embeddings.de_adapter asks
# for); tests/recsys/test_de_strategy.py holds them against DE's own code when its source is given.

@dataclass(frozen=True)
class DistributedEmbeddingsLayout:
    """Where DE puts one group's tables. ``pieces``: ``(rank, variable, row_start, row_end, table,
    col_start, col_end)``, one per table slice a rank holds, ``variable`` indexing that rank's
    ``layer.weights`` (data-parallel tables first, then the rank's concatenated tables); a data-parallel
    table is every rank's variable ``data_parallel.index(table)``, whole."""
    world_size: int
    data_parallel: tuple
    model_parallel: tuple
    rank_tables: tuple          # per rank: the table indices it holds slices of, in DE's order
    pieces: tuple
    slice_count: int = 0        # model-parallel slices before a rank's slices of one table are merged

    def rank_elements(self):
        """Per rank: elements of its model-parallel slices."""
        out = [0] * self.world_size
        for rank, _, r0, r1, _, c0, c1 in self.pieces:
            out[rank] += (r1 - r0) * (c1 - c0)
        return out

    @property
    def every_rank_has_a_piece(self):
        return not self.model_parallel or all(self.rank_tables)


def distributed_embeddings_layout(tables, world_size, column_slice_threshold=None, data_parallel_threshold=None):
    """DE's layout of ``tables`` (``[(rows, width)]``) on ``world_size`` ranks, thresholds in elements.

    A table of at most ``data_parallel_threshold`` elements stays data parallel (``<=``; none on one
    rank); without a column-slice threshold one is chosen by halving the largest table until there
    are as many pieces as ranks; a table is cut into the smallest power of two N of slices whose
    halved size is at most the threshold, then min(N, ranks, width) slices of equal width (the first
    ones one column wider); slices are sorted by (elements, table) from the largest and dealt to the
    ranks back and forth (rank 0..W-1, then W-1..0); a rank's slices of one table are merged, and its
    tables of one width are concatenated by rows into one variable."""
    tables = [(int(r), int(w)) for r, w in tables]
    world_size = int(world_size)
    if world_size == 1:
        data_parallel_threshold = None
    sizes = [r * w for r, w in tables]
    dp = tuple(i for i, n in enumerate(sizes) if data_parallel_threshold and n <= data_parallel_threshold)
    mp = tuple(i for i in range(len(tables)) if i not in dp)
    if not mp:
        return DistributedEmbeddingsLayout(world_size, dp, mp, tuple(() for _ in range(world_size)), ())
    threshold = column_slice_threshold
    if threshold is None:
        pending = [sizes[i] for i in mp]
        while world_size > len(pending):
            pending.sort()
            threshold = pending[-1] - 1
            largest = pending.pop()
            pending += [largest // 2, largest // 2]
    widths = []                      # per model-parallel table (position k in mp): its slices' widths
    for i in mp:
        rows, width = tables[i]
        n, size = 1, sizes[i]
        while threshold is not None and size > threshold:
            n, size = n * 2, size / 2
        n = 1 if n == 1 else min(n, world_size, width)
        base, extra = divmod(width, n)
        widths.append([base + (1 if s < extra else 0) for s in range(n)])
    ids = [k for k, ws in enumerate(widths) for _ in ws]
    elements = [tables[mp[k]][0] * w for k, ws in enumerate(widths) for w in ws]
    if world_size == 1:              # DE's "basic" strategy on one rank: table order
        dealt = [ids]
    else:
        order = [k for _, k in sorted(zip(elements, ids), reverse=True)]
        dealt = [order[r::2 * world_size] + order[2 * world_size - 1 - r::2 * world_size]
                 for r in range(world_size)]
    cursor = [0] * len(mp)           # next column of each table, slices taken in rank order
    queue = [list(ws) for ws in widths]
    rank_tables, pieces = [], []
    for rank, ks in enumerate(dealt):
        held, spans = [], []         # merged: table position k -> [c0, c1]
        for k in ks:
            w = queue[k].pop(0)
            if k in held:
                spans[held.index(k)][1] += w
            else:
                held.append(k)
                spans.append([cursor[k], cursor[k] + w])
            cursor[k] += w
        groups = []                  # concatenation: [width, next row, variable]
        for k, (c0, c1) in zip(held, spans):
            rows = tables[mp[k]][0]
            group = next((g for g in groups if g[0] == c1 - c0), None)
            if group is None:
                group = [c1 - c0, 0, len(dp) + len(groups)]
                groups.append(group)
            pieces.append((rank, group[2], group[1], group[1] + rows, mp[k], c0, c1))
            group[1] += rows
        rank_tables.append(tuple(mp[k] for k in held))
    return DistributedEmbeddingsLayout(world_size, dp, mp, tuple(rank_tables), tuple(pieces), len(ids))


def plan_distributed_embeddings(tables, world_size, *, bytes_per_param=4, optimizer_slots=0, dense_params=0,
                                column_slice_threshold=None, data_parallel_threshold=None, capacity_bytes=None):
    """The :class:`Plan` of ``tables`` (``[(name, rows, dim)]``) as DE places them (thresholds in
    elements; :func:`distributed_embeddings_layout`): the memory check of a DE run counts what DE builds."""
    per_param = bytes_per_param * (1 + optimizer_slots)
    tables = [(str(n), int(r), int(d)) for n, r, d in tables]
    layout = distributed_embeddings_layout([(r, d) for _, r, d in tables], world_size,
                                           column_slice_threshold, data_parallel_threshold)
    plan = Plan(world_size=world_size, model_parallel=world_size > 1,
                dense_bytes=int(dense_params) * per_param, capacity_bytes=capacity_bytes)
    load = [0] * world_size
    for i in layout.data_parallel:
        name, rows, dim = tables[i]
        plan.slices += [TableSlice(i, name, r, 0, dim, rows, rows * dim * per_param, True) for r in range(world_size)]
        load = [x + rows * dim * per_param for x in load]
    for rank, _, _, _, i, c0, c1 in layout.pieces:
        name, rows, _ = tables[i]
        plan.slices.append(TableSlice(i, name, rank, c0, c1, rows, rows * (c1 - c0) * per_param))
        load[rank] += rows * (c1 - c0) * per_param
    plan.slices.sort(key=lambda s: (s.table, s.col_start, s.rank))
    plan.embedding_bytes = load
    return plan
