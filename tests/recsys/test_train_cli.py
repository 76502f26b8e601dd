"""The `recsys-train` command line: --help, one-line errors before TensorFlow loads, the JSON log."""
import subprocess
import sys
import time

import pytest

from conftest import REPO, SMALL, base_env, read_log, records, run_train, summary
from recsys.train import build_parser

CONTRACT_FLAGS = ["--model", "--run-mode", "--data-path", "--feature-spec", "--synthetic", "--batch-size",
                  "--eval-batch-size", "--epochs", "--max-steps", "--lr", "--warmup-steps", "--optimizer", "--amp",
                  "--xla", "--benchmark-warmup-steps", "--benchmark-steps", "--checkpoint-dir", "--restore",
                  "--log-path", "--seed", "--affinity"]


def test_help_documents_every_flag():
    text = build_parser().format_help()
    for flag in CONTRACT_FLAGS:
        assert flag in text, flag
    for action in build_parser()._actions:
        assert action.help, f"{action.option_strings} has no help"


@pytest.mark.parametrize("args,needle", [
    (["--model", "dlrm"], "--data-path"),
    (["--model", "dlrm", "--data-path", "/nonexistent/dir"], "/nonexistent/dir"),
    (["--model", "dlrm", "--synthetic", "--batch-size", "0"], "--batch-size"),
    (["--model", "bert", "--synthetic"], "--model"),
    (["--model", "dlrm", "--synthetic", "--bottom-mlp", "16,8", "--embedding-dim", "4"], "--embedding-dim"),
    (["--model", "dlrm", "--synthetic", "--restore"], "--checkpoint-dir"),
    (["--model", "ncf", "--synthetic", "--run-mode", "evaluate"], "checkpoint"),
    (["--model", "dlrm", "--synthetic", "--log-path", "/proc/version/dir/log.jsonl"], "--log-path"),
])
def test_bad_input_fails_fast_with_one_line(args, needle):
    t0 = time.monotonic()
    # -X importtime would be noisy; instead check TensorFlow never got imported
    code = ("import sys, runpy; sys.argv=['recsys-train']+sys.argv[1:]\n"
            "try:\n    runpy.run_module('recsys.train', run_name='__main__')\n"
            "finally:\n    print('TF_LOADED' if 'tensorflow' in sys.modules else 'TF_NOT_LOADED', file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", code, *args], env=base_env(), cwd=REPO, text=True,
                         capture_output=True, timeout=60)
    assert res.returncode == 2
    lines = [l for l in res.stderr.splitlines() if l.strip() and not l.startswith("TF_")]
    assert len(lines) == 1 and "error" in lines[0] and needle in lines[0], res.stderr
    assert "TF_NOT_LOADED" in res.stderr
    assert time.monotonic() - t0 < 30


def test_feature_spec_for_another_model_is_rejected(tiny_data):
    res = run_train(["--model", "dlrm", "--data-path", tiny_data("ncf")])
    assert res.returncode == 2 and "ncf dataset" in res.stderr.strip()


def test_synthetic_default_run_and_benchmark_log(tmp_path):
    """README's job (`recsys-train --model dlrm --synthetic`), then benchmark mode on its data."""
    log = tmp_path / "log.jsonl"
    res = run_train(["--model", "dlrm", "--synthetic", "--log-path", log])
    assert res.returncode == 0, res.stderr[-3000:]
    recs = read_log(log)
    params = records(recs, "params")[0]
    assert params["model"] == "dlrm" and params["horovod"] is False and params["world_size"] == 1
    steps = records(recs, "step")
    assert steps and all({"step", "epoch", "loss", "samples_per_s", "lr"} <= set(r) for r in steps)
    s = summary(recs)
    for key in ("throughput_samples_per_s", "mean_step_time_ms", "auc", "bce", "final_loss"):
        assert s[key] > 0, key
    assert "[recsys] summary:" in res.stderr
    # benchmark mode on the generated data: warm-up excluded from the timed steps
    blog = tmp_path / "bench.jsonl"
    res = run_train(["--model", "dlrm", "--data-path", tmp_path / "synthetic-dlrm", "--run-mode", "benchmark",
                     *SMALL["dlrm"], "--benchmark-warmup-steps", "3", "--benchmark-steps", "7", "--log-path", blog])
    assert res.returncode == 0, res.stderr[-3000:]
    b = summary(read_log(blog))
    assert b["mode"] == "benchmark" and b["timed_steps"] == 7 and b["excluded_warmup_steps"] == 3
    assert b["step"] == 10
    assert b["throughput_samples_per_s"] == pytest.approx(7 * 256 / (b["mean_step_time_ms"] * 7 / 1000), rel=1e-6)


def test_amp_and_xla_train(tiny_data, tmp_path):
    log = tmp_path / "log.jsonl"
    res = run_train(["--model", "wide_deep", "--data-path", tiny_data("wide_deep"), *SMALL["wide_deep"],
                     "--amp", "--xla", "--epochs", "1", "--max-steps", "6", "--log-path", log, "--log-every", "1"])
    assert res.returncode == 0, res.stderr[-3000:]
    recs = read_log(log)
    assert records(recs, "params")[0]["amp"] is True
    s = summary(recs)
    assert s["step"] == 6 and 0 < s["final_loss"] < 5 and s["map_at_12"] > 0


@pytest.mark.parametrize("env,size", [
    ({}, 1),
    ({"OMPI_COMM_WORLD_SIZE": "4"}, 4),                         # mpirun
    ({"SLURM_NTASKS": "8", "SLURM_STEP_ID": "0"}, 8),           # a task of srun --mpi=pmix
    ({"SLURM_NTASKS": "8"}, 1),                                 # the batch script itself: not a rank
    ({"WORLD_SIZE": "2", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0"}, 2),   # explicit wins
])
def test_world_size_from_launcher(env, size):
    from recsys.runtime.distributed import launcher_world_size
    assert launcher_world_size(env) == size
