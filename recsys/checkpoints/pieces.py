"""The embedding-table pieces a sharded checkpoint holds: each rank's column slices (and their
optimizer slots) as ``.npy`` files listed in ``rank-<r>/tables.json``, and whole tables or any
column range assembled back from them, read memory-mapped so no rank holds more than it restores.

recsys.checkpoints.sharded writes and restores checkpoints through these; recsys.checkpoints.contents
reads them for tests and tools. Pure Python until a piece is read or written (NumPy is passed in
or imported then).
"""
from __future__ import annotations

import json
import os

from recsys.checkpoints.atomic import CheckpointError

TABLES = "tables.json"


def rank_dir(path, rank):
    return os.path.join(path, f"rank-{rank:05d}")


def table_slots(optimizers, var):
    """{slot name: optimizer variable} of table ``var`` (e.g. FTRL's accumulators and linears, RMSprop's
    velocities): a Keras optimizer keeps one list per slot, indexed like the variables it was built on."""
    import tensorflow as tf
    for opt in optimizers:
        index = getattr(opt, "_index_dict", None) or {}
        key = opt._var_key(var)
        if key not in index:
            continue
        i, n = index[key], len(index)
        return {name.strip("_"): value[i] for name, value in sorted(vars(opt).items())
                if name != "_variables" and isinstance(value, list) and len(value) == n
                and all(isinstance(x, tf.Variable) for x in value) and value[i].shape == var.shape}
    return {}


def saved_pieces(path, meta):
    """{(group, table, slot or None): [(col_start, col_end, file)]} of every rank's saved table slices."""
    saved = {}
    for r in meta["writers"]:
        with open(os.path.join(rank_dir(path, r), TABLES)) as f:
            for p in json.load(f):
                for slot, name in [(None, p["file"]), *sorted(p.get("slots", {}).items())]:
                    saved.setdefault((p["group"], p["table"], slot), []).append(
                        (p["col_start"], p["col_end"], os.path.join(rank_dir(path, r), name)))
    return saved


def distributed_tables(group, optimizers, fetch, np, chunk=None, stats=None):
    """Whole tables (and their optimizer slots) into a distributed-embeddings group, cut by its layout
    and assigned by row chunks (``de_adapter.set_global``): ``fetch(table, slot or None)`` gives the
    table's saved column pieces (or None); each rank reads only its own slices, one row chunk at a
    time from the memory-mapped files (``stats``: ``peak_elements`` and ``read_elements``, as
    :func:`assemble` counts them). Returns (slots restored, slots restarted)."""
    from recsys.embeddings import de_adapter
    layer = group._dist

    def lazy(pieces, t):
        rows, dim = group.cardinalities[t], group.dims[t]
        return de_adapter.LazyTable((rows, dim), lambda r0, r1, c0, c1: assemble(
            pieces, c0, c1, (r1 - r0, c1 - c0), np, rows=(r0, r1), stats=stats))
    tables = []
    for t in range(len(group.cardinalities)):
        pieces = fetch(t, None)
        if not pieces:
            raise CheckpointError(f"no saved values of {group.name} table {t} in the checkpoint")
        tables.append(lazy(pieces, t))
    de_adapter.set_global(layer, tables, chunk=chunk)
    slot_vars = [table_slots(optimizers, v) for v in layer.weights]
    restored, restarted = set(), set()
    for slot in sorted(set().union(*slot_vars)):
        saved = [fetch(t, slot) for t in range(len(group.cardinalities))]
        if all(saved):
            de_adapter.set_global(layer, [lazy(p, t) for t, p in enumerate(saved)],
                                  variables=[sv[slot] for sv in slot_vars], chunk=chunk)
            restored.add(slot)
        else:
            restarted.add(slot)
    return restored, restarted


def write_distributed_pieces(directory, group_name, layer, optimizers=(), chunk=None, stats=None):
    """This rank's slices of a distributed-embeddings group (and their optimizer slots) as ``.npy``
    files in ``directory``, written by row chunks of at most ``chunk`` elements (memory-mapped output):
    the host holds one chunk at a time, never a table. Returns the ``tables.json`` entries;
    ``stats["peak_elements"]``: the largest block read at once."""
    import numpy as np

    from recsys.embeddings import de_adapter
    slot_vars = [table_slots(optimizers, v) for v in layer.weights]
    listing = []
    for t, c0, c1, v, r0, r1 in de_adapter.local_pieces(layer):
        name = f"{group_name}.t{t}.c{c0}-{c1}"
        sources = [(None, layer.weights[v])] + sorted(slot_vars[v].items())
        files = {}
        for slot, var in sources:
            files[slot] = f"{name}.npy" if slot is None else f"{name}.{slot}.npy"
            out = np.lib.format.open_memmap(os.path.join(directory, files[slot]), mode="w+", dtype=np.float32,
                                            shape=(r1 - r0, c1 - c0))
            for a, b in de_adapter._row_chunks(r1 - r0, c1 - c0, chunk):
                block = de_adapter.read_rows(var, r0 + a, r0 + b)
                if stats is not None:
                    stats["peak_elements"] = max(stats.get("peak_elements", 0), block.size)
                out[a:b] = block
            out.flush()
            del out
        listing.append({"group": group_name, "table": t, "col_start": c0, "col_end": c1, "shape": [r1 - r0, c1 - c0],
                        "file": files.pop(None), "slots": files})
    return listing


def assemble(pieces, c0, c1, shape, np, rows=None, stats=None):
    """Columns [c0, c1) of one table from the saved column slices (read memory-mapped): every row, or
    rows [r0, r1) (``rows``) only, so a restore by row chunks reads each saved value once instead of
    a whole column slab per chunk. ``stats`` counts the elements read (``read_elements``) and the
    largest block (``peak_elements``)."""
    out = np.empty(shape, np.float32)
    r0, r1 = rows if rows is not None else (0, shape[0])
    filled = 0
    for a0, a1, file in sorted(pieces):
        lo, hi = max(a0, c0), min(a1, c1)
        if lo >= hi:
            continue
        out[:, lo - c0:hi - c0] = np.load(file, mmap_mode="r")[r0:r1, lo - a0:hi - a0]
        filled += hi - lo
    if stats is not None:
        stats["read_elements"] = stats.get("read_elements", 0) + out.size
        stats["peak_elements"] = max(stats.get("peak_elements", 0), out.size)
    if filled != c1 - c0:
        raise CheckpointError(f"table columns {c0}:{c1} are not all in the checkpoint ({filled} found)")
    return out
