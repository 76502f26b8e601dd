"""--embedding-implementation: the Horovod-alltoall layer by default, NVIDIA distributed-embeddings only
when named, and then through its contract (recsys.embeddings.de_adapter; docs/embeddings.md).

distributed-embeddings builds only with CUDA, so it is absent here: what runs here is its refusal
(the real import error, one line, exit 2, before any training), the default staying the alltoall
layer although a package of that name imports, and the project-side pieces DE is fed with (the
seeded whole tables its ``set_weights`` cuts, the equal-batch padding).
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import REPO, SMALL, base_env, mpirun_cmd, read_log, records, run_train, train_cmd


def _package(root, body):
    """A ``distributed_embeddings`` package under ``root`` whose dist_model_parallel runs ``body``."""
    layers = root / "distributed_embeddings" / "python" / "layers"
    layers.mkdir(parents=True)
    for d in (layers.parents[1], layers.parent, layers):
        (d / "__init__.py").write_text("")
    (layers / "dist_model_parallel.py").write_text(textwrap.dedent(body))
    return root


def _env(pythonpath):
    env = base_env()
    env["PYTHONPATH"] = f"{pythonpath}:{env['PYTHONPATH']}"
    return env


def _de_args(tmp_path):
    return ["--model", "dlrm", "--synthetic", "--synthetic-rows", "2048", *SMALL["dlrm"], "--epochs", "1",
            "--log-path", tmp_path / "log.jsonl", "--embedding-implementation", "distributed-embeddings"]


def test_explicit_distributed_embeddings_missing_stops_with_one_line(tmp_path):
    res = run_train(_de_args(tmp_path), timeout=240)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2, res.stderr[-2000:]
    assert lines[-1].startswith("recsys-train: error: --embedding-implementation distributed-embeddings: cannot "
                                "import distributed_embeddings (ModuleNotFoundError: No module named "
                                "'distributed_embeddings')"), lines[-1]
    assert "Traceback" not in res.stderr
    log = read_log(tmp_path / "log.jsonl") if (tmp_path / "log.jsonl").exists() else []
    assert not any(records(log, kind) for kind in ("params", "step", "summary"))      # before any work


def test_explicit_distributed_embeddings_broken_install_reports_the_real_error(tmp_path):
    """An installed DE whose CUDA op library does not load: that error, not a silent fallback."""
    fake = _package(tmp_path / "site", """\
        raise OSError("libcudart.so.12: cannot open shared object file: No such file or directory")
        """)
    res = run_train(_de_args(tmp_path), env=_env(fake), timeout=240)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip().splitlines()[-1] == (
        "recsys-train: error: --embedding-implementation distributed-embeddings: cannot import "
        "distributed_embeddings (OSError: libcudart.so.12: cannot open shared object file: No such file or "
        "directory); install it (NVIDIA Merlin TensorFlow containers ship it) or use "
        "--embedding-implementation horovod-alltoall")


def test_xla_with_distributed_embeddings_is_refused_before_tensorflow(tmp_path):
    res = run_train(_de_args(tmp_path) + ["--xla"], timeout=120)
    assert res.returncode == 2
    assert "--embedding-implementation distributed-embeddings cannot be used with --xla" in res.stderr.splitlines()[-1]


def test_the_flag_defaults_to_horovod_alltoall_and_reaches_the_placement():
    from recsys.configuration.train_config import TrainConfig
    from recsys.train import build_parser
    base = ["--model", "wide_deep", "--synthetic", "--batch-size", "256", "--eval-batch-size", "1000"]
    default = TrainConfig.from_args(build_parser().parse_args(base))
    assert default.embedding_implementation == default.placement.implementation == "horovod-alltoall"
    named = TrainConfig.from_args(build_parser().parse_args(base + ["--embedding-implementation",
                                                                     "distributed-embeddings"]))
    assert named.placement.implementation == "distributed-embeddings"
    assert (named.placement.local_batch, named.placement.local_eval_batch) == (256, 1000)
    with pytest.raises(SystemExit):
        build_parser().parse_args(base + ["--embedding-implementation", "auto"])


@pytest.mark.horovod
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
def test_default_model_parallel_is_horovod_alltoall_even_when_distributed_embeddings_imports(tiny_data, tmp_path):
    """An importable ``distributed_embeddings`` (here a package that leaves a mark when imported) is not
    picked up: 2 ranks model parallel run the alltoall layer, say so, and never import it."""
    mark = tmp_path / "imported"
    fake = _package(tmp_path / "site", f"""\
        open({str(mark)!r}, "a").write("imported\\n")
        class DistributedEmbedding:
            pass
        """)
    log = tmp_path / "log.jsonl"
    args = ["--model", "dlrm", "--data-path", tiny_data("dlrm"), *SMALL["dlrm"], "--epochs", "1", "--max-steps", "3",
            "--log-every", "1", "--embedding-placement", "model_parallel", "--log-path", log]
    env = _env(fake)
    res = subprocess.run(mpirun_cmd(2, train_cmd(*args)), env=env, cwd=REPO, text=True, capture_output=True,
                         timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    check = subprocess.run([sys.executable, "-c", "import distributed_embeddings.python.layers.dist_model_parallel"],
                           env=env, cwd=tmp_path)
    assert check.returncode == 0 and mark.read_text() == "imported\n"     # it does import there ...
    mark.unlink()
    placement, = records(read_log(log), "placement")
    assert placement["model_parallel"] and placement["implementation"] == "horovod-alltoall"
    assert "implementation: horovod-alltoall" in res.stderr
    assert [r["step"] for r in records(read_log(log), "step")] == [1, 2, 3]
    assert not mark.exists()                                                 # ... and the run never did


def test_seeded_whole_tables_fed_to_distributed_embeddings_equal_the_replicated_tables():
    """What DE's set_weights reads (column slices, row slices, data-parallel whole tables) is, value for
    value, the table a replicated run fills (recsys.embeddings.seeding), across a seed block boundary."""
    import tensorflow as tf

    from recsys.embeddings.de_adapter import seeded_table
    from recsys.embeddings.seeding import SEED_BLOCK_ROWS, fill_seeded
    rows, width = SEED_BLOCK_ROWS + 1000, 5
    var = tf.Variable(tf.zeros([rows, width]))
    fill_seeded(var, 77, 2)
    whole = var.numpy()
    lazy = seeded_table(77, 2, rows, width)
    assert lazy.shape == (rows, width) and lazy.size == rows * width
    np.testing.assert_array_equal(lazy[:, 2:5], whole[:, 2:5])                      # a column slice
    r0, r1 = SEED_BLOCK_ROWS - 7, SEED_BLOCK_ROWS + 9
    np.testing.assert_array_equal(lazy[r0:r1, :], whole[r0:r1])                     # a row slice over a block edge
    np.testing.assert_array_equal(np.asarray(seeded_table(77, 2, 300, 4)), _filled(300, 4, 77, 2))
    assert not np.array_equal(lazy[:, 0:1], lazy[:, 1:2])                           # columns differ


def _filled(rows, width, seed, table):
    import tensorflow as tf

    from recsys.embeddings.seeding import fill_seeded
    var = tf.Variable(tf.zeros([rows, width]))
    fill_seeded(var, seed, table)
    return var.numpy()


def test_evaluation_batches_are_padded_to_one_static_size():
    """DE needs one batch size on every rank: a short or empty batch becomes ``rows`` rows, padding -1
    (no id), with that static shape (its ragged exchange reads the static batch)."""
    import tensorflow as tf

    from recsys.embeddings.group import _pad_rows

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int64)])
    def pad(ids):
        out = _pad_rows(ids, 8)
        assert out.shape.as_list() == [8, 3]
        return out
    short = pad(tf.constant([[1, 2, -1], [4, -1, -1]], tf.int64)).numpy()
    assert short.shape == (8, 3) and (short[2:] == -1).all() and short[0].tolist() == [1, 2, -1]
    assert (pad(tf.zeros([0, 3], tf.int64)).numpy() == -1).all()
    ragged = tf.ragged.boolean_mask(short, short >= 0)
    assert ragged.row_lengths().numpy().tolist() == [2, 1, 0, 0, 0, 0, 0, 0]


def test_the_submission_layer_checks_the_flag_with_the_engine_parser():
    """recsys-submit checks engine arguments with the engine's own parser (jobs.planning.engine_args)."""
    from jobs.errors import RequestError
    from jobs.planning.engine_args import check
    base = ["--model", "dlrm", "--synthetic", "--embedding-placement", "model_parallel"]
    check(base + ["--embedding-implementation", "distributed-embeddings"], ranks=8)
    with pytest.raises(RequestError, match="invalid choice: 'nvidia'"):
        check(base + ["--embedding-implementation", "nvidia"], ranks=8)
    with pytest.raises(RequestError, match="distributed-embeddings cannot be used with --xla"):
        check(base + ["--embedding-implementation", "distributed-embeddings", "--xla"], ranks=8)
