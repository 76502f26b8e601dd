"""``--run-mode predict``: the restored model's probability for every row of the ``test`` mapping,
written as parquet that joins back to the user's rows.

Each rank scores the files it reads in evaluation (rank ``r`` of ``w``: files ``r, r + w, ...``),
in file order and row order (one file decoded at a time), so the n-th score of a rank is the n-th
row of its files: that gives each score its ``file`` (relative to the dataset) and ``row`` (its row
number in that file), and the dataset's key columns (``metadata.keys``, written by ``preproc
tabular``) are read from the same files beside it. A model-parallel model scores in lockstep
(recsys.embeddings.lockstep): a rank out of rows feeds empty batches, which score no row.

Rank ``r`` writes ``DIR/part-RRRRR.parquet`` (a temporary name, then renamed): the key columns
under their own names, then recsys.configuration.predictions.COLUMNS: ``file``, ``row``, ``score``. The ``summary`` record names the files and
the rows (``prediction_files``, ``predicted_rows``).
"""
from __future__ import annotations

import os
import time

import numpy as np

from recsys.configuration.predictions import part_name
from recsys.data import make_dataset, make_reader
from recsys.engine.step import Step
from recsys.engine.summary import Summary
from recsys.errors import DataError, EngineError, data_error_message

MAPPING = "test"


class Predictions:
    """Scores the test mapping's rows and writes them (:meth:`write`)."""

    def __init__(self, step: Step, summary: Summary):
        self.step, self.summary = step, summary
        s = step.state
        self.config, self.task, self.dist, self.log = s.config, s.task, s.dist, s.log

    def write(self, checkpoint: str | None) -> dict:
        """Score every row of this rank's share, write its part file; the summary names them all."""
        import tensorflow as tf

        t0 = time.perf_counter()
        c, dist, spec = self.config, self.dist, self.task.spec
        if spec.chunk_type(MAPPING) != "parquet":
            raise EngineError(f"{spec.origin}: --run-mode predict reads parquet test files, this dataset's "
                              f"are {spec.chunk_type(MAPPING)}")
        reader = make_reader(spec, MAPPING, self.task.local_eval_batch, dist.rank, dist.size, drop_remainder=False)
        ds = make_dataset(spec, MAPPING, self.task.local_eval_batch, dist.rank, dist.size, drop_remainder=False,
                          parallel_files=1)      # one file at a time: rows come in file order
        if self.task.placement is not None:
            from recsys.embeddings.lockstep import lockstep
            ds = lockstep(ds, dist)
        scores = []
        try:
            for inputs, _ in ds:
                # lockstep's empty batches go through the model too (their alltoall needs every
                # rank) and score no row
                scores.append(self.step.predict(inputs).numpy().reshape(-1))
        except tf.errors.OpError as err:
            message = data_error_message(err)
            if message is None:
                raise
            raise DataError(message) from None
        scores = np.concatenate(scores) if scores else np.zeros(0, np.float32)
        if len(scores) != reader.rows:
            raise EngineError(f"--run-mode predict: {len(scores)} scores for the {reader.rows} rows of rank "
                              f"{dist.rank}'s test files")
        table = self._table(reader, scores.astype(np.float32))
        directory = os.path.abspath(c.predictions)
        if dist.is_chief:
            os.makedirs(directory, exist_ok=True)
        dist.barrier()
        _write_atomic(table, os.path.join(directory, part_name(dist.rank)))
        rows = [int(n) for n in dist.allgather_object(len(scores))]
        files = [part_name(r) for r in range(dist.size)]
        if dist.is_chief:
            self.log.info(f"predictions: {sum(rows)} rows of {spec.origin} scored by {checkpoint or 'the newest checkpoint'} "
                          f"in {directory} ({len(files)} file(s))", predictions=directory)
            self.log.record("predict_time", seconds=time.perf_counter() - t0)
        return self.summary.write("predict", 0, 0.0, {}, [], False, batch=self.task.global_eval_batch,
                                  evaluated=checkpoint,
                                  extra=dict(predictions=directory, prediction_files=files, predicted_rows=sum(rows),
                                             rows_per_file=rows))

    def _table(self, reader, scores: np.ndarray):
        """The rank's rows: its key columns, ``file``, ``row`` and ``score``, in the order scored."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        spec = self.task.spec
        keys = dict(spec.metadata.get("keys") or {})          # {key: stored column}
        files, rows, stored = [], [], []
        for k in reader.my_files:
            path = reader.file_groups[k][0][0]
            n = reader.file_rows[k]
            files.append(np.full(n, os.path.relpath(path, spec.base_directory), dtype=object))
            rows.append(np.arange(n, dtype=np.int64))
            if keys:
                stored.append(pq.read_table(path, columns=list(keys.values())))
        # a file whose key is null throughout stores it as the null type: promoted to the others' type
        table = pa.concat_tables(stored, promote_options="default") if stored else None
        out = {key: table.column(name) for key, name in keys.items()} if table is not None else {}
        out["file"] = pa.array(np.concatenate(files) if files else np.zeros(0, object), pa.string())
        out["row"] = pa.array(np.concatenate(rows) if rows else np.zeros(0, np.int64))
        out["score"] = pa.array(scores)
        return pa.table(out)


def _write_atomic(table, path: str) -> None:
    """The part file replaced whole through the tree's one temporary-file scheme (slurm/common/atomicfile.py:
    an exclusive temporary beside it, then a rename; nothing is left of a failed write)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from slurm.common import atomicfile
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    atomicfile.write(path, memoryview(sink.getvalue()))
