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
* whole tables in and out through its global ``set_weights`` / ``get_weights`` (the tables'
  optimizer slots through the same per-strategy slicing): initial values equal to a replicated
  run's (seeded per table and column, :class:`LazyTable`), and checkpoints that restore at another
  world size or into a replicated model (recsys.sharded_checkpoint).
"""
from __future__ import annotations

import inspect

import numpy as np

from recsys.embeddings.seeding import SEED_BLOCK_ROWS, column_values
from recsys.errors import EngineError

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
    return dmp.DistributedEmbedding(tables, strategy="memory_balanced",
                                    column_slice_threshold=column_slice_threshold, **kw)


def layout_name(layer):
    """A name for this rank's part of ``layer``'s layout (world size, rank, a digest of where DE put
    every table slice): the attribute the group tracks it under, so its checkpoint keys match only
    this rank's checkpoint of the same layout; any other (another rank's, another layout) comes back
    whole through :func:`set_global` (recsys.sharded_checkpoint)."""
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


def _materialise_data_parallel(layer, tables):
    """DE assigns its data-parallel tables whole (``weight.assign(arr)``): give it arrays there."""
    out = list(tables)
    for idx in layer.strategy.table_groups[0]:
        out[idx] = np.asarray(out[idx], np.float32)
    return out


def set_global(layer, tables):
    """Whole tables (arrays or :class:`LazyTable`, in table order) into a built DE layer, through its
    ``set_weights`` (each rank keeps its slices). Collective-free."""
    layer.set_weights(_materialise_data_parallel(layer, tables))


def set_global_slots(layer, slot_vars, tables):
    """Whole-table values of one optimizer slot into its variables (``slot_vars`` parallel to
    ``layer.weights``), cut exactly as DE's ``set_weights`` cuts the tables."""
    tables = _materialise_data_parallel(layer, tables)
    groups = layer.strategy.table_groups
    values = ([tables[i] for i in groups[0]] + layer.set_col_slice_weights([tables[i] for i in groups[1]])
              + layer.set_row_slice_weights([tables[i] for i in groups[2]]))
    if len(values) != len(slot_vars):
        raise ValueError(f"{len(values)} slot values for {len(slot_vars)} variables of {layer.name}")
    for var, value in zip(slot_vars, values):
        var.assign(np.asarray(value, np.float32))


def get_global(layer):
    """Whole tables in table order on rank 0 through DE's ``get_weights`` (a collective: every rank
    calls it; other ranks get None)."""
    weights = layer.get_weights()
    return [np.asarray(w) for w in weights] if layer.rank == 0 else None


def get_global_slots(layer, slot_vars):
    """Whole-table values of one optimizer slot (``slot_vars`` parallel to ``layer.weights``) on rank 0,
    gathered as DE's ``get_weights`` gathers the tables (a collective; other ranks get None)."""
    import tensorflow as tf
    num_dp, num_col = len(layer.dp_layers), len(layer.local_embedding_layers)
    tensors = [tf.convert_to_tensor(v) for v in slot_vars]
    values = ([t.numpy() for t in tensors[:num_dp]]
              + layer.get_col_sliced_weights(tensors[num_dp:num_dp + num_col], all_ranks=False)
              + layer.get_row_sliced_weights(tensors[num_dp + num_col:]))
    if layer.rank != 0:
        return None
    order = [idx for group in layer.strategy.table_groups for idx in group]
    return [np.asarray(v) for _, v in sorted(zip(order, values), key=lambda pair: pair[0])]
