"""NVIDIA distributed-embeddings' own Python code, for the tests that hold the project against it
(test_de_ragged.py, test_de_placement.py, test_de_strategy.py, test_de_checkpoint.py).

DE is not on PyPI, builds only with CUDA, and the repository does not carry its code: give a checkout
of NVIDIA-Merlin/distributed-embeddings at 4cb42d4 as ``RECSYS_DE_SOURCE``; without it those tests
are skipped (CI cannot fetch it). A test runs its script in a subprocess (DE's layers want Horovod,
some scripts several ranks under mpirun) behind ``PRELUDE``, which imports DE's modules from the
checkout with only its CUDA op library stood in for; every rank writes its result to its own file
(stdout lines of several ranks interleave under mpirun).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, base_env, mpirun_cmd

DE_SOURCE = os.environ.get("RECSYS_DE_SOURCE")
needs_de_source = pytest.mark.skipif(
    not DE_SOURCE, reason="RECSYS_DE_SOURCE (a distributed-embeddings 4cb42d4 checkout) not set")

# Runs before a test's script: takes the checkout and the results folder off sys.argv (the script's
# own arguments are then sys.argv[1:]) and gives it write_result(out, rank=0).
PRELUDE = textwrap.dedent("""\
    import json, os, sys, types
    import tensorflow as tf

    _de_source, _de_results = sys.argv[1:3]
    del sys.argv[1:3]

    # DE's package __init__ imports a version.py written by its build: reach its modules without it.
    _de_pkg = types.ModuleType("distributed_embeddings")
    _de_pkg.__path__ = [_de_source + "/distributed_embeddings"]
    sys.modules["distributed_embeddings"] = _de_pkg

    class _DEOpsStandIn:
        # _embedding_lookup_ops.so (CUDA only): a correct CSR combine (empty rows give 0), so that what
        # goes wrong is DE's Python, never the stand-in, and the plain read get_weights uses.
        @staticmethod
        def embedding_lookup_variable_hotness(param, values, row_splits, combiner):
            segments = tf.ragged.row_splits_to_segment_ids(row_splits)
            rows = tf.shape(row_splits)[0] - 1
            out = tf.math.unsorted_segment_sum(tf.gather(param, values), segments, rows)
            if combiner == "mean":
                count = tf.math.unsorted_segment_sum(tf.ones_like(values, param.dtype), segments, rows)
                out = out / tf.maximum(count, 1)[:, None]
            return out

        @staticmethod
        def read_variable_no_copy(handle, dtype):
            from tensorflow.python.ops import gen_resource_variable_ops
            return gen_resource_variable_ops.read_variable_op(handle, dtype)

    _real_load_op_library = tf.load_op_library
    tf.load_op_library = lambda path: (_DEOpsStandIn if path.endswith("_embedding_lookup_ops.so")
                                       else _real_load_op_library(path))

    def write_result(out, rank=0):
        # This rank's own file, whole or absent (a temporary name, then renamed).
        path = f"{_de_results}/rank-{rank}.json"
        with open(path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(path + ".tmp", path)
""")


def rank_results(directory):
    """Each rank's result, by rank, from the rank-N.json file it wrote (not stdout: ranks' lines
    interleave under mpirun)."""
    return {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in sorted(Path(directory).glob("rank-*.json"))}


def run_with_de(script, tmp_path, *args, ranks=None, timeout=240):
    """Runs ``script`` behind PRELUDE (on ``ranks`` mpirun ranks, else one plain process) and returns
    each rank's result; a failed run fails the test with the end of its stderr."""
    results = Path(tmp_path) / "de-results"
    results.mkdir()
    cmd = [sys.executable, "-c", PRELUDE + script, str(Path(DE_SOURCE).resolve()), str(results), *map(str, args)]
    res = subprocess.run(mpirun_cmd(ranks, cmd) if ranks else cmd, env=base_env(), cwd=REPO, text=True,
                         capture_output=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    return rank_results(results)
