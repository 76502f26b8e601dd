"""NVIDIA distributed-embeddings (DE), used through its documented contract only.

``--embedding-implementation distributed-embeddings`` asks for it; it is never picked by itself
(the default model-parallel layer is :mod:`recsys.embeddings.alltoall`). What DE's user guide and
``dist_model_parallel.py`` require, and where this project does it (checked against
NVIDIA-Merlin/distributed-embeddings 4cb42d4, version 1.0.0; docs/embeddings.md):

* the import is not hidden: a failure is one line carrying the real error (:func:`load`);
* its gradient tape (:func:`distributed_tape`) and its variable broadcast (:func:`broadcast`):
  the tables it keeps data parallel are allreduced and broadcast like dense weights, its
  model-parallel shards (``de_local``) are not, and their gradients are divided by the world
  size by Horovod's tape (``scale_local_gradients``), as the alltoall layer does itself;
* its own ``Embedding`` layer, with a ``sum`` combiner for multi-hot features (ragged ids);
* one batch size on every rank (the caller pads evaluation batches, recsys.embeddings.group);
* its placement (``DistEmbeddingStrategy``), reproduced in pure Python for the plan and the memory
  check before TensorFlow (:func:`recsys.placement.planner.distributed_embeddings_layout`) and
  checked against the strategy it built (:func:`make_layer`);
* whole tables in, cut by that layout (:func:`set_global`; DE's own ``set_weights`` cuts a rank's
  merged slices of one table wrongly, see :func:`set_global`), in row chunks; each rank's slices out,
  as they are (:func:`local_pieces`), so a checkpoint never gathers a table (recsys.checkpoints.sharded).
"""
from __future__ import annotations

import inspect

import numpy as np

from recsys.embeddings.seeding import SEED_BLOCK_ROWS, column_values
from recsys.errors import EngineError
from recsys.placement.planner import distributed_embeddings_layout

IMPLEMENTATION = "distributed-embeddings"
FLAG = "--embedding-implementation distributed-embeddings"


def load():
    """DE's ``dist_model_parallel`` module; EngineError (one line, exit 2) with the real error when it
    does not import or its Horovod tape cannot scale local gradients."""
    try:
        from distributed_embeddings.python.layers import dist_model_parallel as dmp
    except Exception as err:  # ImportError, or its CUDA op library failing to load (OSError, NotFoundError)
        text = " ".join(str(err).split()) or "no message"
        raise EngineError(f"{FLAG}: cannot import distributed_embeddings ({type(err).__name__}: {text}); "
                          f"install it (NVIDIA Merlin TensorFlow containers ship it) or use "
                          f"--embedding-implementation horovod-alltoall") from None
    import horovod.tensorflow as hvd
    if "scale_local_gradients" not in inspect.signature(hvd.DistributedGradientTape).parameters:
        raise EngineError(f"{FLAG}: Horovod {getattr(hvd, '__version__', '?')} cannot scale the gradients of "
                          f"model-parallel shards by the world size (scale_local_gradients, Horovod >= 0.28)")
    return dmp


def distributed_tape(tape):
    """DE's ``DistributedGradientTape`` around a finished forward pass: ``gradient`` then returns
    every gradient exchanged (data-parallel ones averaged, dense; shards scaled by 1/world)."""
    return load().DistributedGradientTape(tape)


def broadcast(variables, root_rank=0):
    """DE's ``broadcast_variables``: every variable but its model-parallel shards, from ``root_rank``."""
    load().broadcast_variables(list(variables), root_rank=root_rank)


def make_layer(cardinalities, dims, summed, column_slice_threshold=None, data_parallel_threshold=None):
    """DE's ``DistributedEmbedding`` over one DE ``Embedding`` per table (zeros: the values come
    from :func:`set_global` once built). ``summed[i]``: table i takes 2-D (ragged) ids and the ``sum``
    combiner; a mean is taken by the caller, which knows the row counts, so an empty row stays zero."""
    dmp = load()
    tables = [dmp.Embedding(c, d, embeddings_initializer="zeros", combiner="sum" if s else None, name=f"table_{i}")
              for i, (c, d, s) in enumerate(zip(cardinalities, dims, summed))]
    kw = {} if data_parallel_threshold is None else {"data_parallel_threshold": data_parallel_threshold}
    layer = dmp.DistributedEmbedding(tables, strategy="memory_balanced",
                                     column_slice_threshold=column_slice_threshold, **kw)
    layer.recsys_layout = distributed_embeddings_layout(list(zip(cardinalities, dims)), layer.world_size,
                                                        column_slice_threshold, data_parallel_threshold)
    _check_layout(layer)
    return layer


def built_sizes(layer):
    """Per rank, the table elements DE's own strategy gave it: (model-parallel, data-parallel)."""
    st = layer.strategy
    dp = sum(c["input_dim"] * c["output_dim"] for c in st.dp_configs)
    local = getattr(st, "local_configs", None) or [[] for _ in range(layer.world_size)]
    return [(sum(c["input_dim"] * c["output_dim"] for c in rank), dp) for rank in local]


def _shapes(layout, rank):
    """This rank's model-parallel variables as the layout builds them: [(rows, width)]."""
    out = {}
    for r, var, _, r1, _, c0, c1 in layout.pieces:
        if r == rank:
            out[var] = (max(out.get(var, (0, 0))[0], r1), c1 - c0)
    return [out[v] for v in sorted(out)]


def _check_layout(layer):
    """The layout the plan and the checkpoints use must be the one DE built (another DE version
    may place otherwise): one line, exit 2, before any step."""
    st, layout = layer.strategy, layer.recsys_layout
    local = getattr(st, "local_configs", None) or [[] for _ in range(layer.world_size)]
    built = [[(c["input_dim"], c["output_dim"]) for c in local[r]] for r in range(layer.world_size)]
    mine = [_shapes(layout, r) for r in range(layer.world_size)]
    if (list(st.table_groups[0]), list(st.table_groups[1])) != (list(layout.data_parallel),
                                                                list(layout.model_parallel)) or built != mine:
        raise EngineError(f"{FLAG}: this distributed-embeddings placed the tables otherwise than the 4cb42d4 "
                          f"strategy the plan and checkpoints follow (rank 0: {built[0][:4]} built, "
                          f"{mine[0][:4]} planned); use that version or --embedding-implementation horovod-alltoall")


def built_line(name, layer):
    """One log line: the per-rank sizes DE built for group ``name`` (the same as the placement's plan,
    which :func:`make_layer` checked)."""
    sizes = built_sizes(layer)
    shown = ", ".join(f"rank {r} {mp * 4 / 2**30:.3f} GiB" for r, (mp, _) in enumerate(sizes[:8]))
    more = f", ... (+{len(sizes) - 8})" if len(sizes) > 8 else ""
    return (f"{name}: distributed-embeddings built its model-parallel tables as planned: {shown}{more} "
            f"(fp32 weights; {sizes[0][1] * 4 / 2**30:.3f} GiB data parallel on every rank)")


def layout_name(layer):
    """A name for this rank's part of ``layer``'s layout (world size, rank, a digest of where DE put
    every table slice): the attribute the group tracks it under, so its checkpoint keys match only
    this rank's checkpoint of the same layout; any other (another rank's, another layout) comes back
    whole through :func:`set_global` (recsys.checkpoints.sharded)."""
    import hashlib
    st = layer.strategy
    shapes = [[(c["input_dim"], c["output_dim"]) for c in rank] for rank in getattr(st, "local_configs", [])]
    rows = [[(c["input_dim"], c["output_dim"]) for c in rank] for rank in st.row_sliced_configs]
    text = repr((layer.world_size, st.table_groups, getattr(st, "table_ids", None), shapes, rows))
    return f"de_world{layer.world_size}_rank{layer.rank}_{hashlib.sha1(text.encode()).hexdigest()[:10]}"


def is_local(variable):
    """A model-parallel shard of DE (marked ``de_local`` by its build): only this rank holds it."""
    return hasattr(variable, "de_local")


class LazyTable:
    """A whole table as DE's ``set_weights`` reads it (``shape``, ``t[:, c0:c1]``, ``t[r0:r1, :]``),
    computing only the block asked for: a rank materialises its own slices, never every table."""

    def __init__(self, shape, fetch):
        self.shape, self.fetch = (int(shape[0]), int(shape[1])), fetch   # fetch(r0, r1, c0, c1) -> ndarray
        self.ndim, self.dtype = 2, np.dtype(np.float32)

    @property
    def size(self):
        return self.shape[0] * self.shape[1]

    def __getitem__(self, key):
        rows, cols = key if isinstance(key, tuple) else (key, slice(None))
        r0, r1, _ = rows.indices(self.shape[0])
        c0, c1, _ = cols.indices(self.shape[1])
        return self.fetch(r0, r1, c0, c1)

    def __array__(self, dtype=None):
        out = self.fetch(0, self.shape[0], 0, self.shape[1])
        return out if dtype is None else out.astype(dtype)


def seeded_table(seed, table, rows, width):
    """The values a replicated run gives table ``table`` of a group (recsys.embeddings.seeding: the
    same (seed, table, column, block) draws), as a :class:`LazyTable`."""
    def fetch(r0, r1, c0, c1):
        out = np.empty((r1 - r0, c1 - c0), np.float32)
        for block in range(r0 // SEED_BLOCK_ROWS, -(-r1 // SEED_BLOCK_ROWS)):
            b0 = block * SEED_BLOCK_ROWS
            n = min(SEED_BLOCK_ROWS, rows - b0)
            lo, hi = max(r0, b0), min(r1, b0 + n)
            for c in range(c0, c1):
                values = column_values(seed, table, c, block, rows).numpy()
                out[lo - r0:hi - r0, c - c0] = values[lo - b0:hi - b0]
        return out
    return LazyTable((rows, width), fetch)


CHUNK_ELEMENTS = 134217728      # rows assigned / written at a time: at most ~128 M elements (DE's chunk)


def _row_chunks(rows, width, chunk=None):
    step = max(1, (chunk or CHUNK_ELEMENTS) // max(1, width))
    return [(a, min(rows, a + step)) for a in range(0, rows, step)]


def assign_rows(var, r0, values_of, rows, width, chunk=None):
    """Rows [r0, r0 + rows) of ``var`` from ``values_of(a, b)`` (rows a..b of the block), by row chunks
    through ``scatter_update``: no second copy of the variable (DE's ``set_weights`` does the same)."""
    import tensorflow as tf
    for a, b in _row_chunks(rows, width, chunk):
        values = np.asarray(values_of(a, b), np.float32)
        if r0 == 0 and a == 0 and b == rows and tuple(var.shape) == values.shape:
            var.assign(values)
        else:
            var.scatter_update(tf.IndexedSlices(values, tf.range(r0 + a, r0 + b, dtype=tf.int64), var.shape))


def set_global(layer, tables, variables=None, chunk=None):
    """Whole tables (arrays or :class:`LazyTable`, in table order) into a built DE layer's variables
    (``variables``: parallel to ``layer.weights``, e.g. one optimizer slot of each; default the
    weights), each rank only its own slices, cut by the layout (``layer.recsys_layout``, checked equal
    to DE's strategy) and assigned by row chunks. Not DE's ``set_weights``: at 4cb42d4 it counts a
    rank's merged slices of one table as one slice and cuts its columns otherwise than the variable
    holds them (a shape error at build, e.g. Criteo 1TB on 8 ranks with a column-slice threshold;
    tests/recsys/test_de_strategy.py). Collective-free."""
    layout, rank = layer.recsys_layout, layer.rank
    variables = list(layer.weights if variables is None else variables)
    if len(variables) != len(layout.data_parallel) + len(_shapes(layout, rank)):
        raise ValueError(f"{len(variables)} variables for the {layer.name} layout")
    for var, t in zip(variables, layout.data_parallel):
        rows, width = tables[t].shape
        assign_rows(var, 0, lambda a, b, t=t: tables[t][a:b, :], rows, width, chunk)
    for r, v, r0, r1, t, c0, c1 in layout.pieces:
        if r == rank:
            assign_rows(variables[v], r0, lambda a, b, t=t, c0=c0, c1=c1: tables[t][a:b, c0:c1], r1 - r0, c1 - c0,
                        chunk)


def local_pieces(layer, variables=None):
    """What this rank holds of the layer's tables: ``[(table, col_start, col_end, variable, row_start,
    row_end)]``, rows [row_start, row_end) of ``variables[variable]`` (parallel to ``layer.weights``)
    being that table's columns; the data-parallel tables whole, on rank 0 only (every rank has them)."""
    layout, rank = layer.recsys_layout, layer.rank
    out = []
    if rank == 0:
        for v, t in enumerate(layout.data_parallel):
            rows, width = layer.weights[v].shape
            out.append((t, 0, int(width), v, 0, int(rows)))
    out += [(t, c0, c1, v, r0, r1) for r, v, r0, r1, t, c0, c1 in layout.pieces if r == rank]
    return out


def read_rows(var, r0, r1):
    """Rows [r0, r1) of a variable as an array, read by a gather (no copy of the whole variable)."""
    import tensorflow as tf
    return var.sparse_read(tf.range(r0, r1, dtype=tf.int64)).numpy()
