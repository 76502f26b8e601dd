"""Checkpoints of models whose embedding tables are spread over ranks (model parallel).

Layout (format ``sharded-v2``)::

    ckpt-<step>/meta.json            written last by rank 0: step, world size, the plan
                                     (who holds which table columns), the model signature
    ckpt-<step>/rank-<r>/ckpt.*      rank r's tf.train.Checkpoint: dense weights, optimizer
                                     state, counters; not the table slices rank r writes as
                                     files below (nor their optimizer slots): each is written
                                     once (recsys.checkpoints.graph). ``sharded-v1`` held them
                                     in both; it is still read.
    ckpt-<step>/rank-<r>/tables.json the table slices rank r wrote as .npy (group, table, slots,
                                     columns, file), to re-shard at another world size
    ckpt-<step>/rank-<r>/DONE        the rank finished writing

Every rank writes into one temporary directory; rank 0 renames it to
``ckpt-<step>`` only after every rank's DONE is there, so a checkpoint is
complete or absent. Restore at the same world size reads each rank's own
TF checkpoint and its own table files (bitwise, optimizer included); at another world size (or into a
replicated model, e.g. evaluation on one rank) it restores the dense weights
and counters from rank 0 and assembles each table slice the new plan gives
this rank, and the tables' optimizer slots (``<slice>.<slot>.npy``, e.g. FTRL's
accumulators and linears), from the saved columns; the dense weights' optimizer
state restarts. A replicated run's checkpoint restores into a model-parallel run
of the same model (tables cut into this rank's slices; optimizer state restarts).
Pure Python until a save/restore: the argument layer validates a checkpoint
(:func:`validate`) without TensorFlow.

distributed-embeddings groups are written like the alltoall layer's: every rank its own slices
(``de_adapter.local_pieces``), by row chunks, so no rank ever holds more than one chunk of a table
on the host (a gather onto rank 0 would hold every table and its slots: Criteo 1TB's ~90 GiB of
weights and as much again per slot, on the one 128 GiB NUMA node the ``dgxa100`` binding gives
rank 0); they are restored through the same layout, by row chunks (tables and slots alike).
Before writing, every rank checks that it sees the temporary directory rank 0 made (a lagging NFS
view does not) and the ranks agree on the result in one allreduce: a failure on any rank fails the
save on every rank, with the ranks named, and no rank waits in a collective the others skipped.
"""
from __future__ import annotations

import json
import os
import shutil
import time

from recsys.checkpoints.atomic import (META, PREFIX, AtomicCheckpointer, CheckpointError, publish,
                                       write_failure)
from recsys.checkpoints.pieces import (TABLES, assemble, distributed_tables, rank_dir, saved_pieces, table_slots,
                                       write_distributed_pieces)

FORMAT = "sharded-v2"
FORMATS = ("sharded-v1", FORMAT)   # v1: each rank's TF checkpoint held its table slices too
DONE = "DONE"


def read_meta(path):
    with open(os.path.join(path, META)) as f:
        return json.load(f)


def is_sharded(path):
    try:
        return read_meta(path).get("format") in FORMATS
    except (OSError, ValueError):
        return False


def signature(model, tables):
    """What must match for a checkpoint to be restored: the model and its tables ``[(name, rows, dim)]``
    (the config's ``embedding_tables``, from recsys.models.embedding_tables)."""
    return {"model": model, "tables": [[str(n), int(r), int(d)] for n, r, d in tables]}


def validate(path, expected_signature=None):
    """Raise CheckpointError (one line) unless ``path`` is a complete sharded checkpoint of this model."""
    try:
        meta = read_meta(path)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: unreadable {META} ({e})")
    if meta.get("format") not in FORMATS:
        return meta
    missing = []
    for r in meta["writers"]:
        d = rank_dir(path, r)
        if not os.path.isfile(os.path.join(d, DONE)) or not os.path.isfile(os.path.join(d, TABLES)):
            missing.append(f"rank-{r:05d}")
            continue
        with open(os.path.join(d, TABLES)) as f:
            files = [name for p in json.load(f) for name in [p["file"], *p.get("slots", {}).values()]]
            missing += [f"rank-{r:05d}/{name}" for name in files if not os.path.isfile(os.path.join(d, name))]
        if not any(n.startswith(PREFIX + ".index") for n in os.listdir(d)):
            missing.append(f"rank-{r:05d}/{PREFIX}.index")
    if missing:
        raise CheckpointError(f"{path}: incomplete sharded checkpoint, missing {', '.join(missing[:4])}"
                              + (f" (+{len(missing) - 4} more)" if len(missing) > 4 else ""))
    if expected_signature is not None and meta.get("signature") != expected_signature:
        got = meta.get("signature") or {}
        raise CheckpointError(f"{path}: checkpoint of another model ({got.get('model')}, "
                              f"{len(got.get('tables', []))} tables) than this run ({expected_signature['model']}, "
                              f"{len(expected_signature['tables'])} tables, or different sizes)")
    return meta


def _groups(model):
    from recsys.embeddings.group import EmbeddingGroup
    return [m for m in model.submodules if isinstance(m, EmbeddingGroup)]


def _pieces(group, rank):
    """{(table, c0, c1): variable} this rank writes / fills for ``group``."""
    if group._mp is not None:
        out = dict(group._mp.shard_map())
        out.update(group._mp.replicated_map())
        return out, bool(group._mp.dp_tables) and rank == 0
    if group._dist is not None:
        return {}, False                       # distributed-embeddings: see write_distributed_pieces
    return {(t, 0, group.dims[t]): layer.embeddings for t, layer in enumerate(group.tables)}, rank == 0


def _written_pieces(group, rank):
    """[((table, c0, c1), variable)] of ``group`` that rank ``rank`` writes as table files, in order:
    its own slices, and the replicated tables on rank 0 (distributed-embeddings groups: none here,
    see write_distributed_pieces)."""
    pieces, replicated_too = _pieces(group, rank)
    own = group._mp.shard_map() if group._mp is not None else {}
    return [(key, var) for key, var in sorted(pieces.items()) if key in own or replicated_too]


def has_local_tables(model):
    return any(g._mp is not None or g._dist is not None for g in _groups(model))


class ShardedCheckpointer(AtomicCheckpointer):
    """Same interface as AtomicCheckpointer (latest/save/restore), collective over the ranks."""

    def __init__(self, directory, checkpoint, model, dist, counters, optimizers=(), keep=3, signature=None, log=None):
        super().__init__(directory, checkpoint, keep=keep, writer=dist.is_chief)  # the chief clears leftovers
        self.model, self.dist, self.counters, self.signature, self.log = model, dist, counters, signature, log
        self.optimizers = list(optimizers)
        self.sharded_model = has_local_tables(model)
        self._rest = {}

    def _writers(self):
        return list(range(self.dist.size)) if self.sharded_model else [0]

    def _written_as_files(self, writer: int) -> list:
        """The variables rank ``writer`` writes as table files (its slices, rank 0 the replicated
        tables too) and their optimizer slots, as this rank holds them: what the TF checkpoint of
        ``writer`` leaves out."""
        from recsys.embeddings import de_adapter
        out = []
        for group in _groups(self.model):
            if group._dist is not None:
                tables = [group._dist.weights[v] for _, _, _, v, _, _ in de_adapter.local_pieces(group._dist)]
            else:
                tables = [var for _, var in _written_pieces(group, writer)]
            for var in tables:
                out += [var, *table_slots(self.optimizers, var).values()]
        return out

    def _tf_checkpoint(self, writer: int):
        """The TF checkpoint of rank ``writer`` (this rank's, or rank 0's that a replicated model reads):
        the run's, without what that rank writes as table files (built once per writer: the variables
        are fixed once the model is built)."""
        if writer not in self._rest:
            import tensorflow as tf

            from recsys.checkpoints.graph import without
            self._rest[writer] = tf.train.Checkpoint(**without(self.checkpoint, self._written_as_files(writer)))
        return self._rest[writer]

    def save(self, step, **meta):
        import numpy as np
        dist = self.dist
        final = os.path.join(self.directory, f"ckpt-{int(step):010d}")
        tmp = os.path.join(self.directory, f".tmp-ckpt-{int(step):010d}")
        previous = self.latest() if dist.is_chief else None
        error = None
        if dist.is_chief:
            try:
                shutil.rmtree(tmp, ignore_errors=True)
                os.makedirs(tmp)
            except OSError as err:
                error = err
        dist.barrier()
        # Each rank's own check, then one agreed status: a rank that cannot see the directory (a
        # lagging NFS view) fails the save on every rank before anyone writes.
        if error is None and dist.rank in self._writers() and not _visible(tmp):
            error = OSError(f"rank {dist.rank} does not see the temporary directory {tmp} rank 0 made "
                            f"(a lagging shared file system?)")
        blind = np.zeros(dist.size, np.int32)
        blind[dist.rank] = error is not None
        blind = [r for r, bad in enumerate(dist.allreduce_sum(blind)) if bad]
        if blind:
            if dist.is_chief:
                shutil.rmtree(tmp, ignore_errors=True)
            dist.barrier()
            raise write_failure(final, error or OSError(f"rank(s) {', '.join(map(str, blind))} could not prepare "
                                                        f"it (the temporary directory {tmp})"), previous)
        try:
            self._write_own(tmp, np)
        except Exception as err:     # OSError, or TensorFlow's OpError (a full disk on any rank)
            error = err
        # Every rank learns whether any rank failed (a rank that raised alone would hang the others).
        failed = int(dist.allreduce_sum(np.array(0 if error is None else 1, np.int32)))
        if failed:
            if dist.is_chief:
                shutil.rmtree(tmp, ignore_errors=True)
            dist.barrier()
            raise write_failure(final, error or OSError(f"{failed} rank(s) could not write their part"), previous)
        if dist.is_chief:
            groups = {g.name: {"cardinalities": g.cardinalities, "dims": g.dims, "implementation": g.implementation,
                               "layout": g.layout} for g in _groups(self.model)}
            info = dict(meta, step=int(step), saved_at=time.time(), format=FORMAT, world_size=dist.size,
                        writers=self._writers(), sharded_model=self.sharded_model, groups=groups,
                        signature=self.signature)
            unfinished = [r for r in info["writers"] if not os.path.isfile(os.path.join(rank_dir(tmp, r), DONE))]
            try:
                if unfinished:
                    raise OSError(f"ranks {unfinished} did not finish writing")
                _write_json(os.path.join(tmp, META), info)
                publish(tmp, final)
            except OSError as err:
                shutil.rmtree(tmp, ignore_errors=True)
                error = err
            else:
                self._prune()
        failed = int(dist.allreduce_sum(np.array(0 if error is None else 1, np.int32)))
        if failed:
            raise write_failure(final, error or OSError("rank 0 could not publish it"), previous)
        return final

    def _write_own(self, tmp, np):
        """This rank's part of a checkpoint: its TF checkpoint, its table slices, then DONE (no collective)."""
        dist = self.dist
        if dist.rank in self._writers():
            d = rank_dir(tmp, dist.rank)
            os.makedirs(d)
            self._tf_checkpoint(dist.rank).write(os.path.join(d, PREFIX))
            listing = []
            for group in _groups(self.model):
                for (t, c0, c1), var in _written_pieces(group, dist.rank):
                    name = f"{group.name}.t{t}.c{c0}-{c1}"
                    np.save(os.path.join(d, name + ".npy"), var.numpy())
                    slots = {}
                    for slot, slot_var in table_slots(self.optimizers, var).items():
                        slots[slot] = f"{name}.{slot}.npy"
                        np.save(os.path.join(d, slots[slot]), slot_var.numpy())
                    listing.append({"group": group.name, "table": t, "col_start": c0, "col_end": c1,
                                    "shape": list(var.shape), "file": name + ".npy", "slots": slots})
                if group._dist is not None:
                    listing += write_distributed_pieces(d, group.name, group._dist, self.optimizers)
            _write_json(os.path.join(d, TABLES), listing)
            _write_json(os.path.join(d, DONE), {"rank": dist.rank, "saved_at": time.time()})

    def restore(self, path=None):
        import numpy as np
        path = path or self.latest()
        if path is None:
            raise CheckpointError(f"no checkpoint in {self.directory}")
        meta = validate(path, self.signature)
        if meta.get("format") not in FORMATS:
            return self._restore_replicated(path, meta)
        same_layout = (meta["world_size"] == self.dist.size and meta["sharded_model"] == self.sharded_model
                       and all(meta["groups"].get(g.name, {}).get("layout", g.layout) == g.layout
                               for g in _groups(self.model)))
        if same_layout and meta["format"] != FORMAT:        # v1: the TF checkpoint holds everything
            src = rank_dir(path, self.dist.rank if self.sharded_model else 0)
            self.checkpoint.read(os.path.join(src, PREFIX)).assert_existing_objects_matched()
        elif same_layout:
            # this rank's TF checkpoint (dense weights, optimizer state, counters), then its table
            # slices and their slots from the files, by row chunks: bitwise what it saved
            writer = self.dist.rank if self.sharded_model else 0
            self._tf_checkpoint(writer).read(os.path.join(rank_dir(path, writer), PREFIX)).assert_existing_objects_matched()
            self._tables_from_files(path, meta, np)
        else:
            import tensorflow as tf
            tf.train.Checkpoint(model=self.model, **self.counters).read(
                os.path.join(rank_dir(path, 0), PREFIX)).expect_partial()
            resharded, restarted = self._tables_from_files(path, meta, np)
            for opt in self.optimizers:            # learning-rate schedules continue from the step
                opt.iterations.assign(self.counters["global_step"])
            if self.log is not None and self.dist.is_chief:
                slots = (f"table optimizer slots re-sharded ({', '.join(sorted(resharded))})" if resharded
                         else "the tables' optimizer has no slots" if not restarted else "")
                if restarted:
                    slots += ("; " if slots else "") + f"not in the checkpoint, restarting: {', '.join(sorted(restarted))}"
                self.log.info(f"re-sharded {path}: written by {meta['world_size']} rank(s), restored on "
                              f"{self.dist.size}; {slots}; dense weights' optimizer state restarts")
        meta["path"] = path
        return meta


    def _tables_from_files(self, path, meta, np):
        """Every table slice this rank holds, and its optimizer slots, from the checkpoint's table files
        (cut by this run's layout). Returns (slots restored, slots restarted)."""
        saved = saved_pieces(path, meta)
        resharded, restarted = set(), set()
        for group in _groups(self.model):
            if group._dist is not None:         # distributed-embeddings: whole tables in, each rank its share
                done, missing = distributed_tables(group, self.optimizers,
                                                    lambda t, slot, g=group.name: saved.get((g, t, slot)), np)
                resharded |= done
                restarted |= missing
                continue
            pieces, _ = _pieces(group, self.dist.rank)
            for (t, c0, c1), var in pieces.items():
                var.assign(assemble(saved.get((group.name, t, None), []), c0, c1, tuple(var.shape), np))
                # The tables' optimizer slots are re-sharded like the tables (checkpoints written
                # before slots were saved have none: those slots restart from their initial value).
                for slot, slot_var in table_slots(self.optimizers, var).items():
                    if (group.name, t, slot) in saved:
                        slot_var.assign(assemble(saved[(group.name, t, slot)], c0, c1, tuple(var.shape), np))
                        resharded.add(slot)
                    else:
                        restarted.add(slot)
        return resharded, restarted

    def _restore_replicated(self, path, meta):
        """A replicated run's checkpoint (``recsys.checkpoints.atomic`` layout) into this model-parallel run:
        dense weights and counters as saved, each table slice of this rank's plan cut from the saved
        table (one whole table in memory at a time); the optimizer state restarts (a replicated
        checkpoint keys the slots by the replicated model's variable order)."""
        import tensorflow as tf
        prefix = os.path.join(path, PREFIX)
        tf.train.Checkpoint(model=self.model, **self.counters).read(prefix).expect_partial()
        reader = tf.train.load_checkpoint(prefix)
        shapes = reader.get_variable_to_shape_map()

        def saved_table(group, t):
            key = f"model/{group.name}/tables/{t}/embeddings/.ATTRIBUTES/VARIABLE_VALUE"
            want = [group.cardinalities[t], group.dims[t]]
            if list(shapes.get(key, [])) != want:
                raise CheckpointError(f"{path}: checkpoint of another model (no {group.name} table {t} of "
                                      f"shape {want})")
            return key
        import numpy as np
        for group in _groups(self.model):
            if group._dist is not None:     # whole tables through DE's set_weights; each rank cuts its share
                from recsys.embeddings import de_adapter
                keys = [saved_table(group, t) for t in range(len(group.cardinalities))]
                held = {}           # the table being assigned, read once (not once per row chunk)

                def rows_of(r0, r1, c0, c1, key):
                    if key not in held:
                        held.clear()
                        held[key] = reader.get_tensor(key)
                    return np.asarray(held[key][r0:r1, c0:c1], np.float32)
                de_adapter.set_global(group._dist, [de_adapter.LazyTable(
                    (group.cardinalities[t], group.dims[t]),
                    lambda r0, r1, c0, c1, key=key: rows_of(r0, r1, c0, c1, key)) for t, key in enumerate(keys)])
                held.clear()
                continue
            pieces, _ = _pieces(group, self.dist.rank)
            for (t, c0, c1), var in pieces.items():
                var.assign(reader.get_tensor(saved_table(group, t))[:, c0:c1])
        for opt in self.optimizers:            # learning-rate schedules continue from the step
            opt.iterations.assign(self.counters["global_step"])
        if self.log is not None and self.dist.is_chief:
            self.log.info(f"re-sharded {path}: a replicated checkpoint, restored on {self.dist.size} ranks "
                          f"(model parallel); optimizer state restarts")
        meta["path"] = path
        return meta


def _visible(path):
    """``path`` is a directory this rank sees; once more after listing its parent, which makes an NFS
    client look the entries up again instead of answering from its cache."""
    if os.path.isdir(path):
        return True
    try:
        os.listdir(os.path.dirname(path))
    except OSError:
        return False
    return os.path.isdir(path)


def _write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, path)


def make_checkpointer(config, checkpoint, model, dist, counters, optimizers=(), log=None):
    """The checkpointer of a run: sharded when tables are spread over ranks or the newest checkpoint is
    sharded (e.g. evaluation on one rank), else the replicated AtomicCheckpointer (rank 0 writes)."""
    latest = AtomicCheckpointer(config.checkpoint_dir, None, writer=False).latest()
    if has_local_tables(model) or (latest is not None and is_sharded(latest)):
        tables = config.embedding_tables
        return ShardedCheckpointer(config.checkpoint_dir, checkpoint, model, dist, counters, optimizers,
                                   keep=config.keep_checkpoints,
                                   signature=signature(config.model, tables) if tables else None, log=log)
    return AtomicCheckpointer(config.checkpoint_dir, checkpoint, keep=config.keep_checkpoints, writer=dist.is_chief)
