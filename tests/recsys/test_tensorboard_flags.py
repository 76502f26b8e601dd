"""The TensorBoard and profiler flags (recsys.train / recsys.configuration.train_config) and the pure parts of
recsys/monitoring/tensorboard.py: where a run's event files go, which figures a record gives, the profiled
window's calls. No TensorFlow: the fast tier."""
import pytest

from recsys.configuration.train_config import TrainConfig
from recsys.errors import EngineError
from recsys.monitoring import tensorboard as tb
from recsys.train import build_parser, check_submission

pytestmark = pytest.mark.fast


def _config(*args, world=1):
    return check_submission(["--model", "dlrm", "--synthetic", *map(str, args)], world, check_data=False)


def test_defaults_write_rank_0_next_to_the_log(tmp_path):
    c = _config("--log-path", tmp_path / "logs" / "main-42.engine.jsonl")
    assert c.tensorboard_ranks == (0,) and c.profile_ranks == "all" and c.profile_steps is None
    assert tb.root_dir(c) == str(tmp_path / "logs" / "tensorboard" / "main-42")
    assert tb.rank_dir(tb.root_dir(c), 3).endswith("main-42/rank3")
    assert tb.root_dir(_config("--log-path", "run.jsonl")).endswith("/tensorboard/run")
    assert tb.root_dir(_config()) is None                                  # nowhere of the run's to write
    assert tb.root_dir(_config("--tensorboard-dir", tmp_path / "tb")) == str(tmp_path / "tb")
    assert tb.open_sink(_config("--log-path", "x.jsonl", "--no-tensorboard"), 0) is None
    assert tb.open_sink(_config("--log-path", "x.jsonl"), 1) is None      # rank 0 only by default
    assert tb.open_sink(_config("--log-path", "x.jsonl", "--tensorboard-ranks", "all", world=2), 1) is not None
    # a benchmark counts its steps from 1 even after --restore: no figure is held back for the restored step
    assert tb.open_sink(_config("--log-path", "x.jsonl"), 0).continues
    assert not tb.open_sink(_config("--log-path", "x.jsonl", "--run-mode", "benchmark"), 0).continues


def test_rank_and_step_flags_parse():
    args = build_parser().parse_args(["--model", "ncf", "--tensorboard-ranks", "3,1", "--profile-steps", "5-9",
                                      "--profile-ranks", "0"])
    assert args.tensorboard_ranks == (1, 3) and args.profile_steps == (5, 9) and args.profile_ranks == (0,)
    assert build_parser().parse_args(["--model", "ncf", "--profile-steps", "7"]).profile_steps == (7, 7)
    assert tb.chosen("all", 5) and tb.chosen((1, 3), 3) and not tb.chosen((1, 3), 0)


@pytest.mark.parametrize("args,needle", [
    (["--profile-steps", "9-3"], "1 <= START <= END"),
    (["--profile-steps", "0-3"], "1 <= START <= END"),
    (["--profile-steps", "a-b"], "START-END"),
    (["--tensorboard-ranks", "-1"], "ranks >= 0"),
    (["--profile-ranks", "x"], "'all' or ranks"),
])
def test_bad_flag_values_are_one_line(args, needle, capsys):
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["--model", "dlrm", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


@pytest.mark.parametrize("args,world,needle", [
    (["--profile-steps", "2-3", "--log-path", "x.jsonl", "--run-mode", "inference"], 1, "--run-mode train or benchmark"),
    (["--tensorboard-ranks", "2"], 2, "--tensorboard-ranks 2: the run has 2 rank(s), 0 to 1"),
    (["--profile-ranks", "0,4"], 4, "--profile-ranks 0,4: the run has 4 rank(s)"),
])
def test_config_refuses_before_tensorflow(args, world, needle):
    with pytest.raises(EngineError) as err:
        _config(*args, world=world)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_run_paths_a_trace_needs_a_directory_and_a_file_is_not_one(tmp_path):
    """Checked when the run starts, not at submission (recsys-submit adds every job's --log-path)."""
    assert _config("--profile-steps", "2-3").profile_steps == (2, 3)
    for args, needle in ((["--profile-steps", "2-3"], "--profile-steps needs --tensorboard-dir or --log-path"),
                         (["--tensorboard-dir", str(tmp_path / "f")], "exists and is not a directory")):
        (tmp_path / "f").write_text("")
        with pytest.raises(EngineError) as err:
            TrainConfig.from_args(build_parser().parse_args(["--model", "dlrm", "--synthetic", *args]))
        assert needle in str(err.value)


def test_figures_of_each_record_kind():
    step, figs = tb.scalars({"type": "step", "step": 20, "epoch": 0, "loss": 0.5, "samples_per_s": 1000.0,
                             "step_time_ms": 4.0, "lr": 0.1, "lrs": {"wide": 0.2, "deep": 0.1}, "loss_scale": 1024.0})
    assert step == 20 and dict(figs) == {"train/loss": 0.5, "train/samples_per_s": 1000.0, "train/step_time_ms": 4.0,
                                         "train/lr": 0.1, "train/lr/wide": 0.2, "train/lr/deep": 0.1,
                                         "train/loss_scale": 1024.0}
    step, figs = tb.scalars({"type": "eval", "step": 32, "epoch": 1, "time": 1.0, "auc": 0.7, "bce": 0.5})
    assert step == 32 and dict(figs) == {"eval/auc": 0.7, "eval/bce": 0.5}
    summary = {"type": "summary", "step": 40, "throughput_samples_per_s": 5e4, "mean_step_time_ms": 9.0,
               "p50_step_time_ms": None, "interrupted": False,
               "step_breakdown": {"mean": {"step_ms": 10.0, "compute_ms": 6.0},
                                  "slowest_rank": {"rank": 1, "step_ms": 12.0, "compute_ms": 7.0}}}
    step, figs = tb.scalars(summary)
    # the breakdown is a table in the Text tab, not one-point scalar cards above the curves (issue 48 item 9)
    assert step == 40 and dict(figs) == {"summary/throughput_samples_per_s": 5e4, "summary/mean_step_time_ms": 9.0}
    assert tb.breakdown_table(summary).splitlines() == [
        "| phase | mean over ranks (ms) | slowest rank (1) (ms) |", "|---|---:|---:|",
        "| step | 10.000 | 12.000 |", "| compute | 6.000 | 7.000 |"]
    assert tb.breakdown_table({"type": "summary", "step": 40}) is None
    assert tb.scalars({"type": "checkpoint", "step": 3, "path": "x"}) == (None, [])
    assert tb.scalars({"type": "info", "message": "m"}) == (None, [])


def test_profile_window_calls_end_before_it_and_take_one_step_in_it():
    w = tb.ProfileWindow("/nonexistent", (10, 12))
    assert [w.limit(b, 8) for b in (0, 5, 8, 9, 10, 11, 12, 20)] == [8, 4, 1, 1, 1, 1, 8, 8]
    off = tb.ProfileWindow()
    assert not off.active and off.limit(9, 8) == 8
    with off.steps(9):          # no window: nothing started (TensorFlow is imported only to start one)
        pass
    assert not off.running and not off.done

