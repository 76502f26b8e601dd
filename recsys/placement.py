"""Embedding-table placement across ranks: which table (or column slice) lives where.

A pure function (no TensorFlow) so a user can check, before asking for GPUs,
whether a model fits:

    python -m recsys.placement --model dlrm --feature-spec F --gpus 8 --gpu-memory-gb 80

Strategy (the memory-balanced one NVIDIA's distributed-embeddings uses):
tables smaller than ``data_parallel_threshold`` bytes stay replicated on every
rank; tables larger than ``column_slice_threshold`` bytes are split by columns
into at most ``world_size`` slices, then slices are placed largest first on the
least-loaded rank that does not already hold a slice of the same table.
With ``auto_slice`` the planner keeps doubling the column slices of the table
with the largest piece until the most loaded rank holds at most ``balance``
times the least loaded one (or nothing can be split further): a user does not
have to guess a threshold to get a balanced plan.
Memory per rank counts the embedding weights, their optimizer slots and the
replicated dense part (MLPs) with its slots.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field

# Optimizer state kept per parameter, in copies of the weights.
OPTIMIZER_SLOTS = {"sgd": 0, "adagrad": 1, "rmsprop": 1, "ftrl": 2, "adam": 2, "lazy_adam": 2}


class PlacementError(ValueError):
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
    replicated plan (every rank holds every table). Thresholds are in bytes of
    weights + slots. The result is deterministic: every rank computes the same plan.
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
        nbytes = rows * dim * per_param
        if data_parallel_threshold and nbytes < data_parallel_threshold:
            replicated += nbytes
            plan.slices += [TableSlice(i, name, r, 0, dim, rows, nbytes, True) for r in range(world_size)]
            continue
        sharded.append(i)
        parts[i] = 1
        if column_slice_threshold and nbytes > column_slice_threshold:
            parts[i] = min(world_size, dim, math.ceil(nbytes / column_slice_threshold))
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


def rank_share(plan, rank):
    """This rank's model-parallel slices and the replicated tables, each sorted by table."""
    mine = [s for s in plan.slices if s.rank == rank and not s.replicated]
    shared = [s for s in plan.slices if s.rank == rank and s.replicated]
    return mine, shared


def _gib(n):
    return f"{n / 2**30:.3f} GiB"


def format_plan(plan: Plan) -> str:
    """Human-readable plan: one line per rank, then the verdict."""
    mode = "model-parallel" if plan.model_parallel else "replicated"
    lines = [f"embedding placement ({mode}) on {plan.world_size} rank(s):"]
    for r in range(plan.world_size):
        parts = []
        for s in plan.tables_on(r):
            cols = "" if (s.col_start == 0 and not _is_sliced(plan, s)) else f"[{s.col_start}:{s.col_end}]"
            parts.append(f"{s.name}{cols}" + (" (replicated)" if s.replicated else ""))
        shown = ", ".join(parts[:12]) + (f", ... (+{len(parts) - 12})" if len(parts) > 12 else "")
        lines.append(f"  rank {r}: {_gib(plan.rank_bytes[r])} "
                     f"(embeddings {_gib(plan.embedding_bytes[r])}) tables: {shown or '-'}")
    if plan.model_parallel:
        lines.append(f"  max/min per-rank memory {plan.imbalance:.2f}")
    if plan.capacity_bytes is not None:
        verdict = "fits" if plan.fits else "DOES NOT FIT"
        lines.append(f"  max per rank {_gib(max(plan.rank_bytes))} of {_gib(plan.capacity_bytes)}: {verdict}")
    return "\n".join(lines)


def _is_sliced(plan, s):
    return (not s.replicated and plan.model_parallel
            and sum(1 for t in plan.slices if t.table == s.table and t.rank != s.rank) > 0)


# --- choice for a training run (argument layer, no TensorFlow) ---------------

@dataclass(frozen=True)
class PlacementChoice:
    """What ``--embedding-placement`` resolved to, decided before TensorFlow starts."""
    mode: str                        # "replicated" or "model_parallel"
    reason: str
    column_slice_threshold: int | None = None     # elements, as distributed-embeddings counts
    data_parallel_threshold: int | None = None    # elements
    plan: Plan | None = None         # of the largest embedding width (the memory estimate)

    @property
    def model_parallel(self):
        return self.mode == "model_parallel"


def plan_for_group(cardinalities, dims, world_size, column_slice_threshold=None, data_parallel_threshold=None):
    """The plan every rank computes for one embedding group (thresholds in elements)."""
    tables = [(f"table_{i}", c, d) for i, (c, d) in enumerate(zip(cardinalities, dims))]
    return plan_placement(tables, world_size, bytes_per_param=4,
                          column_slice_threshold=column_slice_threshold and column_slice_threshold * 4,
                          data_parallel_threshold=data_parallel_threshold and data_parallel_threshold * 4,
                          auto_slice=True)


def choose_placement(requested, world_size, tables, *, dense_params=0, optimizer_slots=0, budget_bytes=None,
                     column_slice_threshold=None, data_parallel_threshold=None, model="dlrm"):
    """Resolve ``--embedding-placement`` (auto | replicated | model_parallel) for a run.

    ``tables``: ``[(name, rows, dim)]`` of every embedding table of the model. Raises
    PlacementError with a one-line message naming the flag when the request cannot run.
    """
    kw = dict(bytes_per_param=4, optimizer_slots=optimizer_slots, dense_params=dense_params,
              capacity_bytes=budget_bytes, auto_slice=True,
              column_slice_threshold=column_slice_threshold and column_slice_threshold * 4,
              data_parallel_threshold=data_parallel_threshold and data_parallel_threshold * 4)
    budget = "" if budget_bytes is None else f" of --embedding-memory-gb {budget_bytes / 1e9:g}"

    def need(plan):
        r = max(range(plan.world_size), key=lambda i: plan.rank_bytes[i])
        return f"rank {r} needs {plan.rank_bytes[r] / 1e9:.3f} GB{budget}"
    if requested == "model_parallel":
        if world_size < 2:
            raise PlacementError("--embedding-placement model_parallel needs at least 2 ranks, this run has 1")
        if model == "ncf":
            raise PlacementError("--embedding-placement model_parallel is not available for --model ncf "
                                 "(two small tables: use replicated)")
    if requested == "model_parallel" or (requested == "auto" and world_size > 1 and model != "ncf"):
        mp = plan_placement(tables, world_size, model_parallel=True, **kw)
    replicated = plan_placement(tables, world_size, model_parallel=False, **kw)
    if requested == "replicated" or model == "ncf" or (requested == "auto" and world_size == 1):
        if not replicated.fits:
            raise PlacementError(f"--embedding-placement replicated does not fit: {need(replicated)}")
        return PlacementChoice("replicated", "requested" if requested == "replicated" else
                               "one rank" if world_size == 1 else "NCF tables are small", plan=replicated)
    th = dict(column_slice_threshold=column_slice_threshold, data_parallel_threshold=data_parallel_threshold)
    if requested == "model_parallel":
        if not mp.fits:
            raise PlacementError(f"--embedding-placement model_parallel does not fit: {need(mp)}")
        return PlacementChoice("model_parallel", "requested", plan=mp, **th)
    if replicated.fits:
        return PlacementChoice("replicated", "replicated tables fit the memory budget", plan=replicated)
    if mp.fits:
        return PlacementChoice("model_parallel", f"replicated tables do not fit ({need(replicated)})",
                               plan=mp, **th)
    raise PlacementError(f"--embedding-placement auto: neither placement fits: replicated {need(replicated)}, "
                         f"model parallel {need(mp)}")


# --- CLI -------------------------------------------------------------------

def _parse(argv):
    p = argparse.ArgumentParser(
        prog="python -m recsys.placement",
        description="Show where the embedding tables of a model would live and whether they fit the GPUs.")
    p.add_argument("--model", choices=["dlrm", "wide_deep", "ncf"], default="dlrm")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--feature-spec", help="feature_spec.yaml giving the categorical cardinalities")
    src.add_argument("--cardinalities", help="comma-separated table sizes instead of a feature spec")
    p.add_argument("--gpus", type=int, default=8, help="total ranks (GPUs) in the job (default 8)")
    p.add_argument("--gpu-memory-gb", type=float, default=80.0,
                   help="usable memory per GPU in GB (default 80)")
    p.add_argument("--memory-fraction", type=float, default=0.9,
                   help="fraction of GPU memory the plan may use (default 0.9, rest for activations)")
    p.add_argument("--embedding-dim", type=int, default=None,
                   help="embedding width (default: the model's reference default)")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZER_SLOTS), default=None,
                   help="optimizer of the embeddings (sets the slot count; default: the model's)")
    p.add_argument("--amp", action="store_true", help="fp16 weights (2 bytes per parameter)")
    p.add_argument("--column-slice-threshold-mb", type=float, default=None,
                   help="split tables larger than this (MB) by columns (default: none)")
    p.add_argument("--no-auto-slice", action="store_true",
                   help="do not split tables by columns beyond --column-slice-threshold-mb to balance memory")
    p.add_argument("--data-parallel-threshold-mb", type=float, default=None,
                   help="keep tables smaller than this (MB) replicated on every rank (default: none)")
    p.add_argument("--replicated", action="store_true",
                   help="plan without distributed-embeddings (every rank holds every table)")
    return p.parse_args(argv)


def main(argv=None):
    args = _parse(argv)
    from recsys.models.defaults import MODEL_DEFAULTS, dense_param_count, embedding_dims, embedding_tables
    defaults = MODEL_DEFAULTS[args.model]
    dim = args.embedding_dim or defaults["embedding_dim"]
    try:
        if args.feature_spec:
            named = embedding_tables(args.model, args.feature_spec)
            tables = [(n, c, d) for (n, c), d in zip(named, embedding_dims(args.model, [n for n, _ in named], dim))]
        else:
            cards = [int(x) for x in args.cardinalities.split(",") if x.strip()]
            tables = [(f"cat_{i}", c, dim) for i, c in enumerate(cards)]
    except (OSError, ValueError) as e:
        print(f"recsys.placement: error: {e}", file=sys.stderr)
        return 2
    opt = args.optimizer or defaults["embedding_optimizer"]
    capacity = int(args.gpu_memory_gb * 1e9 * args.memory_fraction)
    dense = dense_param_count(args.model, n_tables=len(tables), embedding_dim=dim,
                              total_embedding_dim=sum(t[2] for t in tables))
    plan = plan_placement(
        tables, args.gpus, bytes_per_param=2 if args.amp else 4, optimizer_slots=OPTIMIZER_SLOTS[opt],
        dense_params=dense, capacity_bytes=capacity, model_parallel=not args.replicated,
        column_slice_threshold=(int(args.column_slice_threshold_mb * 1e6)
                                if args.column_slice_threshold_mb else None),
        data_parallel_threshold=(int(args.data_parallel_threshold_mb * 1e6)
                                 if args.data_parallel_threshold_mb else None),
        auto_slice=not args.no_auto_slice)
    print(format_plan(plan))
    return 0 if plan.fits else 1


if __name__ == "__main__":
    sys.exit(main())
