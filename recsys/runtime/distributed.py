"""Data-parallel plumbing: one object that hides whether Horovod is in use.

A single process never imports Horovod; when the launcher (srun --mpi=pmix,
mpirun, or a wrapper that exports WORLD_SIZE) says there is more than one rank,
``hvd.init()`` joins the job and gradients, metrics and the initial state go
through Horovod collectives.
"""
from __future__ import annotations

import os
import sys

from recsys.errors import EngineError

_WORLD_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "SLURM_NTASKS", "PMI_SIZE")


def launcher_world_size(env=None) -> int:
    """World size the launcher announces, without importing MPI (1 when none).

    SLURM_NTASKS is only trusted inside a job step (SLURM_STEP_ID set): in the
    batch script itself it describes the allocation, not this process.
    """
    env = os.environ if env is None else env
    for name in _WORLD_VARS:
        if name == "SLURM_NTASKS" and "SLURM_STEP_ID" not in env:
            continue
        value = env.get(name)
        if value:
            try:
                return max(1, int(value))
            except ValueError:
                continue
    return 1


_RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "PMI_RANK", "RANK")


def launcher_rank(env=None) -> int:
    """This process's rank as the launcher announces it (0 when none), before Horovod has joined
    (the watchdog names a rank stuck in Horovod's initialisation with it)."""
    env = os.environ if env is None else env
    for name in _RANK_VARS:
        if name == "SLURM_PROCID" and "SLURM_STEP_ID" not in env:
            continue
        try:
            return max(0, int(env.get(name, "")))
        except ValueError:
            continue
    return 0


def horovod_missing(size: int, tf_version, exc: Exception) -> str:
    """The one line for several ranks where Horovod's TensorFlow ops do not import (instead of a
    traceback). What builds where was measured with tests/compat/run.sh (docs/engine.md, "Multi-rank")."""
    ranks = f"{size} ranks" if size > 1 else "several ranks"
    return (f"{ranks} need Horovod built against this TensorFlow ({tf_version or 'version unknown'}), and "
            f"horovod.tensorflow does not import ({type(exc).__name__}: {exc}): Horovod 0.28.1 builds against "
            f"TensorFlow up to 2.18 as released, against 2.19 and 2.20 with its XLA ops left out of its build "
            f"(docs/engine.md, 'Multi-rank'); or run one rank")


def _bits_as_f32(t):
    """int32 [N] -> float32 [N]; int64 [N] -> float32 [N, 2] (bit patterns, exact round trip)."""
    import tensorflow as tf
    if t.dtype == tf.int64:
        return tf.bitcast(tf.bitcast(t, tf.int32), tf.float32)
    return tf.bitcast(tf.cast(t, tf.int32), tf.float32)


def _f32_as_bits(t, dtype):
    import tensorflow as tf
    if dtype == tf.int64:
        return tf.bitcast(tf.bitcast(t, tf.int32), tf.int64)
    return tf.cast(tf.bitcast(t, tf.int32), dtype)


def _nbytes(shape, dtype):
    """Bytes of a tensor of static ``shape`` (a TensorShape) and ``dtype``; None when unknown."""
    n = shape.num_elements()
    return None if n is None else n * dtype.size


def gradient_payload_bytes(grads, sparse_as_dense=False, extras=(), variables=None):
    """Bytes this rank hands to :meth:`Distributed.allreduce_gradients` for ``grads`` (+ ``extras``):
    ``(allreduce, allgather)``. A dense gradient, or an IndexedSlices under ``sparse_as_dense``,
    is allreduced whole (its dense shape); an IndexedSlices is allgathered as its rows and its
    indices (carried as float32 bit patterns: 4 bytes an int32 id, 8 an int64). None for a part
    whose shape is not static (an IndexedSlices while tracing); ``variables`` (those of ``grads``)
    give the shapes of the allreduced ones. The one count of these bytes: the ``gradient_exchange``
    record and the step breakdown both use it."""
    import tensorflow as tf
    reduce_bytes, gather_bytes = 0, 0
    grads, extras = list(grads), list(extras)
    shapes = [v.shape for v in variables] if variables is not None else [None] * len(grads)
    for g, shape in zip(grads + extras, shapes + [None] * len(extras)):
        if g is None:
            continue
        if isinstance(g, tf.IndexedSlices) and not sparse_as_dense:
            n = [_nbytes(g.values.shape, g.values.dtype), _nbytes(g.indices.shape, g.indices.dtype)]
            gather_bytes = None if gather_bytes is None or None in n else gather_bytes + sum(n)
            continue
        if isinstance(g, tf.IndexedSlices):
            if shape is None:
                static = tf.get_static_value(g.dense_shape)
                shape = tf.TensorShape(None if static is None else [int(d) for d in static])
            n = _nbytes(shape, g.values.dtype)
        else:
            n = _nbytes(g.shape if shape is None else shape, g.dtype)
        reduce_bytes = None if reduce_bytes is None or n is None else reduce_bytes + n
    return reduce_bytes, gather_bytes


class Distributed:
    """Rank/size plus the collectives the engine needs (identity when size == 1)."""

    def __init__(self, use_horovod: bool | None = None):
        if use_horovod is None:
            use_horovod = launcher_world_size() > 1
        self.hvd = None
        self.rank, self.size, self.local_rank, self.local_size = 0, 1, 0, 1
        if use_horovod:
            try:
                import horovod.tensorflow as hvd  # only imported for multi-rank jobs
            except ImportError as exc:
                tf_version = getattr(sys.modules.get("tensorflow"), "__version__", None)
                raise EngineError(horovod_missing(launcher_world_size(), tf_version, exc)) from None
            hvd.init()
            self.hvd = hvd
            self.rank, self.size = hvd.rank(), hvd.size()
            self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    # --- collectives (called inside or outside tf.function) ---------------
    def allreduce_gradients(self, grads, sparse_as_dense: bool = False, extras=()):
        """Average gradients (and ``extras``, e.g. the loss) across ranks in two collectives.

        Dense tensors go through one grouped allreduce; IndexedSlices (embedding
        gradients) through one grouped allgather of their values and indices
        (values divided by the world size), so a step costs two negotiations
        whatever the number of tables. Returns ``(grads, extras)``.
        """
        extras = list(extras)
        if self.hvd is None:
            return list(grads), extras
        import tensorflow as tf
        hvd = self.hvd
        out = list(grads)
        dense_idx, dense, sparse_idx, sparse = [], [], [], []
        for i, g in enumerate(grads):
            if g is None:
                continue
            if isinstance(g, tf.IndexedSlices) and not sparse_as_dense:
                sparse_idx.append(i)
                sparse.append(g)
            else:
                dense_idx.append(i)
                dense.append(tf.convert_to_tensor(g))
        if dense or extras:
            # Named: unnamed, Horovod names the group after its first tensor's op, which under --amp
            # counts the ops before it (they differ by rank where each holds other shards: a deadlock).
            reduced = hvd.grouped_allreduce(dense + extras, op=hvd.Average, name="recsys_grads_dense")
            for i, g in zip(dense_idx, reduced):
                out[i] = g
            extras = list(reduced[len(dense):])
        if sparse:
            # A grouped op needs one dtype: carry the integer indices as float32 bit patterns.
            parts = [g.values for g in sparse] + [_bits_as_f32(g.indices) for g in sparse]
            by_dtype = {}
            for k, t in enumerate(parts):
                by_dtype.setdefault(t.dtype, []).append(k)
            gathered = [None] * len(parts)
            for dtype, ks in by_dtype.items():
                for k, t in zip(ks, hvd.grouped_allgather([parts[k] for k in ks],
                                                          name=f"recsys_grads_sparse_{dtype.name}")):
                    gathered[k] = t
            n = len(sparse)
            for k, (i, g) in enumerate(zip(sparse_idx, sparse)):
                values = gathered[k] / tf.cast(self.size, gathered[k].dtype)
                indices = _f32_as_bits(gathered[n + k], g.indices.dtype)
                out[i] = tf.IndexedSlices(values, indices, dense_shape=g.dense_shape)
        return out, extras

    def allreduce_sum(self, value, name: str = "recsys_sum"):
        """Sum a tensor/ndarray across ranks (returns numpy when given numpy). ``name``: the same on
        every rank (an unnamed op in a graph is named after its input's op, which can differ by rank)."""
        return self._allreduce(value, "Sum", name)

    def allreduce_max(self, value, name: str = "recsys_max"):
        """Elementwise maximum across ranks, e.g. the slowest rank's time (numpy when given numpy)."""
        return self._allreduce(value, "Max", name)

    def _allreduce(self, value, op, name):
        if self.hvd is None:
            return value
        import numpy as np
        import tensorflow as tf
        as_numpy = isinstance(value, (np.ndarray, np.generic, float, int))
        t = tf.convert_to_tensor(value)
        dtype = t.dtype
        if dtype in (tf.float16, tf.bfloat16):
            t = tf.cast(t, tf.float32)
        r = self.hvd.allreduce(t, op=getattr(self.hvd, op), name=name)
        r = tf.cast(r, dtype)
        return r.numpy() if as_numpy else r

    def allgather(self, value, name: str = "recsys_allgather"):
        """Every rank's ``value`` concatenated along the first axis, in rank order."""
        if self.hvd is None:
            return value
        import numpy as np
        import tensorflow as tf
        as_numpy = isinstance(value, np.ndarray)
        r = self.hvd.allgather(tf.convert_to_tensor(value), name=name)
        return r.numpy() if as_numpy else r

    def allgather_object(self, obj):
        """Every rank's picklable ``obj``, in rank order (``[obj]`` for one rank)."""
        if self.hvd is None:
            return [obj]
        return list(self.hvd.allgather_object(obj))

    def broadcast_variables(self, variables, root_rank: int = 0):
        """``variables`` set to ``root_rank``'s values. Each broadcast is named by its position (Horovod's
        own names them after the variables, whose uniquified names can differ by rank), in one graph."""
        if self.hvd is None or not variables:
            return
        from recsys.runtime.tracing import graph_function   # with TensorFlow: not on the login-node path
        hvd = self.hvd

        @graph_function
        def assign(vs):
            for i, v in enumerate(vs):
                v.assign(hvd.broadcast(v, root_rank, name=f"recsys_broadcast_{i}"))
        assign(list(variables))

    def barrier(self):
        """Wait for every rank (a scalar allreduce: this Horovod has no barrier op)."""
        if self.hvd is not None:
            import numpy as np
            self.allreduce_sum(np.zeros((), np.int32))

    def shutdown(self):
        if self.hvd is not None:
            self.hvd.shutdown()
