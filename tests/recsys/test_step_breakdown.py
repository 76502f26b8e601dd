"""`--breakdown-steps N` (benchmark mode): the summary's `step_breakdown`, a split step's phases timed one by one.

One rank (no exchange at all), two ranks under mpirun with model-parallel tables (both exchanges
measured), and the flag refused outside benchmark mode or negative, before TensorFlow starts.
Compute is timed on its own (the model-parallel alltoalls replaced by local stand-ins), so the
remainder is measured, and the split step is related to the run's timed step.
"""
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, SMALL, base_env, mpirun_cmd, read_log, run_train, summary, train_cmd
from tb_events import accumulator

PHASES = ["input_wait", "compute", "embedding_exchange", "gradient_exchange", "optimizer", "remainder"]
BENCH = ["--run-mode", "benchmark", "--benchmark-warmup-steps", "2", "--benchmark-steps", "4",
         "--breakdown-steps", "5", "--log-every", "100"]


def _breakdown(s, world):
    b = s["step_breakdown"]
    assert b["version"] == 2 and b["steps"] == 5 and b["phases"] == PHASES and "split step" in b["method"]
    assert "compute alone" in b["method"]
    assert s["summary_version"] == 3 and s["world_size"] == world
    # the breakdown steps train like any step (compute alone applies nothing); the fused timed steps
    # stay the throughput's
    assert s["timed_steps"] == 4 and s["step"] == 2 + 4 + 1 + 5       # + the untimed first split step
    # the split step related to this run's timed step (what a projection calibrates on)
    assert b["timed_step_ms"] == s["mean_step_time_ms"] > 0
    assert b["split_over_timed"] == pytest.approx(b["mean"]["step_ms"] / s["mean_step_time_ms"])
    for part in (b["mean"], b["slowest_rank"]):
        assert set(part) >= {"step_ms", "forward_backward_ms"} | {f"{p}_ms" for p in PHASES}
        assert part["step_ms"] > 0
        assert sum(part[f"{p}_ms"] for p in PHASES) == pytest.approx(part["step_ms"], rel=0.01)
        assert all(part[f"{p}_ms"] >= 0 for p in PHASES if p != "remainder"), part
        # compute is timed on its own: the remainder is what the step's forward+backward took beyond
        # compute and exchange alone, a measurement of either sign (never 0 up to float rounding, as
        # it was when compute was forward+backward less the exchange)
        assert part["remainder_ms"] == pytest.approx(
            part["forward_backward_ms"] - part["compute_ms"] - part["embedding_exchange_ms"], abs=1e-6)
        assert abs(part["remainder_ms"]) > 1e-6, part
    assert 0 <= b["slowest_rank"]["rank"] < world
    assert b["slowest_rank"]["step_ms"] >= b["mean"]["step_ms"] * (1 - 1e-9)
    return b


def test_one_rank_breakdown(tmp_path):
    log = tmp_path / "log.jsonl"
    res = run_train(["--model", "dlrm", "--synthetic", "--synthetic-rows", "4096", *SMALL["dlrm"], *BENCH,
                     "--checkpoint-dir", tmp_path / "ck", "--log-path", log])
    assert res.returncode == 0, res.stderr[-3000:]
    b = _breakdown(summary(read_log(log)), 1)
    assert b["mean"]["embedding_exchange_ms"] == 0 and b["mean"]["gradient_exchange_ms"] == 0
    assert b["bytes_per_step"] == {"embedding_exchange": 0, "gradient_exchange": 0}
    assert b["mean"]["compute_ms"] > 0 and b["mean"]["optimizer_ms"] > 0
    # TensorBoard: the breakdown is one table in the Text tab, no one-point scalar cards (issue 48 item 9)
    acc = accumulator(tmp_path / "tensorboard" / "log" / "rank0")
    assert not [t for t in acc.Tags()["scalars"] if t.startswith("breakdown")]
    assert "summary/throughput_samples_per_s" in acc.Tags()["scalars"]
    (table,) = acc.Tensors("step_breakdown")
    rows = table.tensor_proto.string_val[0].decode().splitlines()
    assert rows[0].startswith("| phase | mean over ranks (ms) | slowest rank (0) (ms) |")
    assert f"| compute | {b['mean']['compute_ms']:.3f} | {b['slowest_rank']['compute_ms']:.3f} |" in rows


@pytest.mark.horovod
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI (mpirun) is not installed")
def test_two_ranks_model_parallel_breakdown(tiny_data, tmp_path):
    log = tmp_path / "log.jsonl"
    args = ["--model", "dlrm", "--data-path", tiny_data("dlrm"), *SMALL["dlrm"], *BENCH,
            "--embedding-placement", "model_parallel", "--log-path", log,
            "--tensorboard-ranks", "all", "--profile-steps", "3-4", "--profile-ranks", "1"]
    res = subprocess.run(mpirun_cmd(2, train_cmd(*args)), env=base_env(), cwd=REPO, text=True,
                         capture_output=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    b = _breakdown(summary(read_log(log)), 2)
    # every rank's event files hold the breakdown, one table in the Text tab at the summary's step
    # (recsys/monitoring/tensorboard.py; no scalar cards: issue 48 item 9); rank 1 alone traced steps 3-4
    from tb_events import markers, traces
    slowest = b["slowest_rank"]["rank"]
    for rank in (0, 1):
        acc = accumulator(tmp_path / "tensorboard" / "log" / f"rank{rank}")
        assert not [t for t in acc.Tags()["scalars"] if t.startswith("breakdown")]
        (table,) = acc.Tensors("step_breakdown")
        rows = table.tensor_proto.string_val[0].decode().splitlines()
        assert table.step == 12 and rows[0].endswith(f"slowest rank ({slowest}) (ms) |")
        assert f"| step | {b['mean']['step_ms']:.3f} | {b['slowest_rank']['step_ms']:.3f} |" in rows
    assert traces(tmp_path / "tensorboard" / "log" / "rank0") == []
    assert [markers(t)[0] for t in traces(tmp_path / "tensorboard" / "log" / "rank1")] == [[3, 4]]
    assert b["mean"]["embedding_exchange_ms"] > 0 and b["mean"]["gradient_exchange_ms"] > 0
    assert b["bytes_per_step"]["embedding_exchange"] > 0 and b["bytes_per_step"]["gradient_exchange"] > 0
    # 26 tables of width 8 split over 2 ranks, local batch 128: the ids out (int32), the vectors back and
    # their gradients (float32), the half each rank does not hold itself
    half = 128 * 13
    assert b["bytes_per_step"]["embedding_exchange"] == half * 4 + 2 * half * 8 * 4


@pytest.mark.fast
@pytest.mark.parametrize("args,needle", [
    (["--run-mode", "benchmark", "--breakdown-steps", "-1"], "--breakdown-steps must be >= 0"),
    (["--run-mode", "train", "--breakdown-steps", "5"], "--breakdown-steps needs --run-mode benchmark"),
])
def test_bad_breakdown_steps_fail_with_one_line(args, needle):
    code = ("import sys, runpy; sys.argv=['recsys-train']+sys.argv[1:]\n"
            "try:\n    runpy.run_module('recsys.train', run_name='__main__')\n"
            "finally:\n    print('TF_LOADED' if 'tensorflow' in sys.modules else 'TF_NOT_LOADED', file=sys.stderr)")
    res = subprocess.run([sys.executable, "-c", code, "--model", "dlrm", "--synthetic", *args], env=base_env(),
                         cwd=REPO, text=True, capture_output=True, timeout=60)
    assert res.returncode == 2
    lines = [line for line in res.stderr.splitlines() if line.strip() and not line.startswith("TF_")]
    assert len(lines) == 1 and "error" in lines[0] and needle in lines[0], res.stderr
    assert "TF_NOT_LOADED" in res.stderr
