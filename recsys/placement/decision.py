"""The run's one embedding placement, decided before TensorFlow starts and carried in the TrainConfig.

:func:`choose_placement` resolves ``--embedding-placement`` for a model's table groups
(:mod:`recsys.models.embedding_tables`): per group the plan of :func:`plan_for_group`, which the
EmbeddingGroup layer then uses as it is (it never plans), and the memory check made on those
same plans (every group's weights and optimizer slots, plus the dense part with its slots).
Thresholds are in elements (rows x width), as distributed-embeddings counts them, so the
optimizer changes the memory estimate, never the cut. ``python -m recsys.place_tables`` shows it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from recsys.placement.planner import (OPTIMIZER_SLOTS, Plan, PlacementError, distributed_embeddings_layout,
                                      plan_distributed_embeddings, plan_placement, rank_lines)
from recsys.placement.tables import Table, TableGroup

BYTES_PER_PARAM = 4      # fp32 tables: mixed precision keeps float32 variables
# The model-parallel layer (--embedding-implementation): our Horovod alltoall layer unless
# NVIDIA distributed-embeddings is asked for (never picked by itself).
IMPLEMENTATIONS = ("horovod-alltoall", "distributed-embeddings")


def slots(optimizer):
    """Optimizer state per parameter, in copies of the weights (2 for an optimizer not listed)."""
    return 0 if optimizer is None else OPTIMIZER_SLOTS.get(optimizer, 2)


def plan_for_group(cardinalities, dims, world_size, column_slice_threshold=None, data_parallel_threshold=None, *,
                   names=None, optimizer_slots=0, model_parallel=True, implementation=IMPLEMENTATIONS[0]):
    """The plan of one group's tables on ``world_size`` ranks (thresholds in elements; the
    slots count in the memory, not in the cut). distributed-embeddings places a model-parallel group
    by its own strategy: the plan is then the one it builds (planner.plan_distributed_embeddings)."""
    names = names or [f"table_{i}" for i in range(len(cardinalities))]
    if implementation == "distributed-embeddings" and model_parallel and world_size > 1:
        return plan_distributed_embeddings(list(zip(names, cardinalities, dims)), world_size,
                                           bytes_per_param=BYTES_PER_PARAM, optimizer_slots=optimizer_slots,
                                           column_slice_threshold=column_slice_threshold,
                                           data_parallel_threshold=data_parallel_threshold)
    return plan_placement(list(zip(names, cardinalities, dims)), world_size, bytes_per_param=BYTES_PER_PARAM,
                          optimizer_slots=optimizer_slots, model_parallel=model_parallel, auto_slice=True,
                          column_slice_threshold=column_slice_threshold and column_slice_threshold * BYTES_PER_PARAM,
                          data_parallel_threshold=data_parallel_threshold and data_parallel_threshold * BYTES_PER_PARAM)


def distributed_embeddings_slices(tables, world_size, column_slice_threshold=None, data_parallel_threshold=None):
    """How many model-parallel pieces NVIDIA distributed-embeddings cuts a group's ``[(rows, width)]``
    into on ``world_size`` ranks (thresholds in elements), by the rules of its
    ``DistEmbeddingStrategy`` (``dist_model_parallel.py`` at 4cb42d4): a table of at most
    ``data_parallel_threshold`` elements stays data parallel; without a column-slice threshold, one
    is chosen by halving the largest table until there are as many pieces as ranks; a table is then
    cut into the smallest power of two of column slices under the threshold, but never more than
    the ranks or its width. With fewer pieces than ranks some rank gets none, and DE stops at build
    ("Not enough table after slicing"): 1-wide tables (Wide & Deep's wide group) cannot be cut."""
    layout = distributed_embeddings_layout(tables, world_size, column_slice_threshold, data_parallel_threshold)
    return layout.slice_count


def _unspreadable_by_distributed_embeddings(group, world_size, column_slice_threshold, data_parallel_threshold):
    """Why DE cannot give every rank a piece of ``group``, or None when it can."""
    tables = list(zip(group.cardinalities, group.widths))
    pieces = distributed_embeddings_slices(tables, world_size, column_slice_threshold, data_parallel_threshold)
    if pieces == 0 or pieces >= world_size:
        return None
    narrow = sum(1 for w in group.widths if w == 1)
    what = f"{narrow} of its tables are 1 wide and cannot be cut by columns" if narrow else "its tables are too few"
    return (f"distributed-embeddings cuts its {len(tables)} tables into {pieces} model-parallel pieces, fewer than "
            f"the {world_size} ranks ({what}): data parallel")


@dataclass(frozen=True)
class Placement:
    """Where every group's tables live, and what a rank then holds."""
    mode: str                                   # "replicated" or "model_parallel"
    reason: str
    world_size: int
    groups: Tuple[Tuple[TableGroup, Plan], ...]  # in the model's group order
    dense_bytes: int = 0                        # the replicated dense part with its optimizer slots
    capacity_bytes: Optional[int] = None
    column_slice_threshold: Optional[int] = None     # elements
    data_parallel_threshold: Optional[int] = None    # elements
    implementation: str = IMPLEMENTATIONS[0]         # the model-parallel layer (--embedding-implementation)
    local_batch: Optional[int] = None                # rows per rank of a training / an evaluation batch:
    local_eval_batch: Optional[int] = None           # distributed-embeddings pads every batch to them
    # Groups of a model-parallel run kept data parallel on every rank, with why: ((name, reason), ...)
    # (distributed-embeddings cannot give each rank a piece of them).
    data_parallel_groups: Tuple[Tuple[str, str], ...] = ()

    @property
    def model_parallel(self):
        return self.mode == "model_parallel"

    def data_parallel_group(self, group_name):
        """True when ``group_name`` is kept data parallel inside this model-parallel run."""
        return any(name == group_name for name, _ in self.data_parallel_groups)

    def plan(self, group_name) -> Plan:
        for group, plan in self.groups:
            if group.name == group_name:
                return plan
        raise KeyError(f"no embedding group {group_name!r} in the placement ({[g.name for g, _ in self.groups]})")

    @property
    def embedding_bytes(self):
        """Per rank: tables (weights + slots) of every group."""
        return [sum(p.embedding_bytes[r] for _, p in self.groups) for r in range(self.world_size)]

    @property
    def rank_bytes(self):
        return [e + self.dense_bytes for e in self.embedding_bytes]

    @property
    def fits(self):
        return self.capacity_bytes is None or max(self.rank_bytes) <= self.capacity_bytes

    def need(self):
        r = max(range(self.world_size), key=lambda i: self.rank_bytes[i])
        budget = "" if self.capacity_bytes is None else f" of --embedding-memory-gb {self.capacity_bytes / 1e9:g}"
        return f"rank {r} needs {self.rank_bytes[r] / 1e9:.3f} GB{budget}"

    def as_record(self):
        """The ``placement`` log record (docs/engine-log.md): every group with its tables and plan."""
        return {
            "mode": self.mode, "reason": self.reason, "world_size": self.world_size,
            "model_parallel": self.model_parallel, "fits": self.fits, "capacity_bytes": self.capacity_bytes,
            "rank_bytes": self.rank_bytes, "embedding_bytes": self.embedding_bytes, "dense_bytes": self.dense_bytes,
            "column_slice_threshold": self.column_slice_threshold,
            "data_parallel_threshold": self.data_parallel_threshold,
            "data_parallel_groups": {name: why for name, why in self.data_parallel_groups},
            "groups": [{"name": g.name, "optimizer": g.optimizer,
                        "tables": [[t.name, t.rows, t.width, t.combiner] for t in g.tables],
                        "embedding_bytes": p.embedding_bytes,
                        "slices": [[s.name, s.rank, s.col_start, s.col_end, s.rows, s.nbytes] for s in p.slices],
                        "replicated_tables": sorted({s.name for s in p.slices if s.replicated})}
                       for g, p in self.groups],
        }

    def describe(self, max_ranks=None):
        """Lines for humans: every group's ranks (at most ``max_ranks`` each), then the totals."""
        shown = min(self.world_size, max_ranks or self.world_size)
        lines = [f"embedding placement: {self.mode.replace('_', ' ')} on {self.world_size} rank(s) ({self.reason})"]
        why = dict(self.data_parallel_groups)
        for group, plan in self.groups:
            lines.append(f"  {group.name}: {len(group.tables)} tables, optimizer {group.optimizer or '-'}"
                         + (f"; {why[group.name]}" if group.name in why else ""))
            lines += [f"    {line}" for line in rank_lines(plan)[:shown]]
        lines.append(f"  per rank with the dense part ({_gib(self.dense_bytes)}): "
                     + ", ".join(f"rank {r} {_gib(b)}" for r, b in enumerate(self.rank_bytes[:shown]))
                     + (f", ... (+{self.world_size - shown})" if shown < self.world_size else ""))
        if self.model_parallel and min(self.rank_bytes) > 0:
            lines.append(f"  max/min per-rank memory {max(self.rank_bytes) / min(self.rank_bytes):.2f}")
        if self.capacity_bytes is not None:
            verdict = "fits" if self.fits else "DOES NOT FIT"
            lines.append(f"  max per rank {_gib(max(self.rank_bytes))} of {_gib(self.capacity_bytes)}: {verdict}")
        return lines


def _gib(n):
    return f"{n / 2**30:.3f} GiB"


def place(mode, reason, world_size, groups, *, dense_params=0, dense_slots=0, budget_bytes=None,
          column_slice_threshold=None, data_parallel_threshold=None, implementation=IMPLEMENTATIONS[0],
          local_batch=None, local_eval_batch=None):
    """The :class:`Placement` of ``groups`` in ``mode`` (no decision, nothing refused)."""
    model_parallel = mode == "model_parallel"
    if not model_parallel:
        column_slice_threshold = data_parallel_threshold = None
    data_parallel_groups = ()
    if model_parallel and implementation == "distributed-embeddings" and world_size > 1:
        # Decided here, before submission, not by DE failing at model build on the ranks.
        data_parallel_groups = tuple((g.name, why) for g in groups for why in [_unspreadable_by_distributed_embeddings(
            g, world_size, column_slice_threshold, data_parallel_threshold)] if why)
    dp_names = {name for name, _ in data_parallel_groups}
    plans = tuple((g, plan_for_group(g.cardinalities, g.widths, world_size, column_slice_threshold,
                                     data_parallel_threshold, names=[t.name for t in g.tables],
                                     optimizer_slots=slots(g.optimizer), implementation=implementation,
                                     model_parallel=model_parallel and g.name not in dp_names))
                  for g in groups)
    return Placement(mode, reason, world_size, plans,
                     dense_bytes=int(dense_params) * BYTES_PER_PARAM * (1 + dense_slots), capacity_bytes=budget_bytes,
                     column_slice_threshold=column_slice_threshold, data_parallel_threshold=data_parallel_threshold,
                     implementation=implementation, local_batch=local_batch, local_eval_batch=local_eval_batch,
                     data_parallel_groups=data_parallel_groups)


def choose_placement(requested, world_size, groups, *, dense_params=0, dense_slots=0, budget_bytes=None,
                     column_slice_threshold=None, data_parallel_threshold=None, model="dlrm",
                     implementation=IMPLEMENTATIONS[0], local_batch=None, local_eval_batch=None) -> Placement:
    """Resolve ``--embedding-placement`` (auto | replicated | model_parallel) for a run.

    ``groups``: the model's TableGroups (a plain ``[(name, rows, width)]`` list is one group
    without optimizer slots). Raises PlacementError with a one-line message naming the flag when
    the request cannot run."""
    groups = _as_groups(groups)
    if implementation not in IMPLEMENTATIONS:
        raise PlacementError(f"--embedding-implementation {implementation}: not one of {', '.join(IMPLEMENTATIONS)}")
    kw = dict(dense_params=dense_params, dense_slots=dense_slots, budget_bytes=budget_bytes,
              column_slice_threshold=column_slice_threshold, data_parallel_threshold=data_parallel_threshold,
              implementation=implementation, local_batch=local_batch, local_eval_batch=local_eval_batch)
    if requested == "model_parallel" and world_size < 2:
        # One rank holds every table either way: the 1-GPU point of a scaling study that runs
        # model parallel at every other size (its placement record says why).
        one = place("replicated", "one rank: every table is local (model parallel needs 2 ranks or more)",
                    world_size, groups, **kw)
        if not one.fits:
            raise PlacementError(f"--embedding-placement model_parallel on one rank: the tables do not fit: "
                                 f"{one.need()}")
        return one
    if requested == "model_parallel":
        if model == "ncf":
            raise PlacementError("--embedding-placement model_parallel is not available for --model ncf "
                                 "(two small tables: use replicated)")
        mp = place("model_parallel", "requested", world_size, groups, **kw)
        if not mp.fits:
            raise PlacementError(f"--embedding-placement model_parallel does not fit: {mp.need()}")
        return mp
    why = ("requested" if requested == "replicated" else "one rank" if world_size == 1 else
           "NCF tables are small" if model == "ncf" else "replicated tables fit the memory budget")
    replicated = place("replicated", why, world_size, groups, **kw)
    if requested == "replicated" or world_size == 1 or model == "ncf":
        if not replicated.fits:
            raise PlacementError(f"--embedding-placement replicated does not fit: {replicated.need()}")
        return replicated
    if replicated.fits:
        return replicated
    mp = place("model_parallel", f"replicated tables do not fit ({replicated.need()})", world_size, groups, **kw)
    if mp.fits:
        return mp
    raise PlacementError(f"--embedding-placement auto: neither placement fits: replicated {replicated.need()}, "
                         f"model parallel {mp.need()}")


def _as_groups(groups):
    groups = list(groups)
    if groups and not isinstance(groups[0], TableGroup):
        return [TableGroup("embeddings", tuple(Table(str(n), str(n), "", int(r), int(w)) for n, r, w in groups))]
    return groups
