"""What a new user's first runs need from the engine (issue 15 items 2-4): a global batch larger
than the training data is one line before TensorFlow, a run too short to time or too slow for
the hardware found says so (stderr and the JSON log), and missing parents of --checkpoint-dir and
--log-path are created as `mkdir -p` would."""
import subprocess
import sys

import pytest

from conftest import REPO, SMALL, base_env, read_log, records, run_train, summary
from recsys.configuration.slow import slow_warning
from recsys.configuration.train_config import TrainConfig
from recsys.errors import EngineError
from recsys.train import build_parser, resolve

NO_TF = ("import sys, runpy; sys.argv=['recsys-train']+sys.argv[1:]\n"
         "try:\n    runpy.run_module('recsys.train', run_name='__main__')\n"
         "finally:\n    print('TF_LOADED' if 'tensorflow' in sys.modules else 'TF_NOT_LOADED', file=sys.stderr)")


def _cfg(argv):
    return TrainConfig.from_args(build_parser().parse_args(argv))


def test_batch_larger_than_the_training_rows_is_one_line_before_tensorflow(tiny_data):
    data = tiny_data("dlrm")     # 8192 training rows; a batch left unset would get the small-data default
    res = subprocess.run([sys.executable, "-c", NO_TF, "--model", "dlrm", "--data-path", str(data),
                          "--batch-size", "65536"],
                         env=base_env(), cwd=REPO, text=True, capture_output=True, timeout=60)
    assert res.returncode == 2, res.stderr
    lines = [x for x in res.stderr.splitlines() if x.strip() and not x.startswith("TF_")]
    assert lines == [f"recsys-train: error: --batch-size 65536 is larger than the 8192 training rows of "
                     f"{data}/feature_spec.yaml: give --batch-size 8192 or less"], res.stderr
    assert "TF_NOT_LOADED" in res.stderr


def test_batch_checks_of_synthetic_and_ncf_data(tiny_data):
    with pytest.raises(EngineError, match=r"^--batch-size 4096 is larger than --synthetic-rows 1000: "
                                          r"give --batch-size 512 or less"):
        _cfg(["--model", "dlrm", "--synthetic", "--synthetic-rows", "1000", "--batch-size", "4096"])
    # NCF: an epoch is the positives with their negatives (6000 x (1 + 4) samples)
    with pytest.raises(EngineError, match=r"\(30000 samples with negatives\)"):
        _cfg(["--model", "ncf", "--data-path", str(tiny_data("ncf")), "--batch-size", "65536"])
    fits = _cfg(["--model", "ncf", "--data-path", str(tiny_data("ncf")), "--batch-size", "16384", "--epochs", "1"])
    notes = dict(fits.notes)
    assert notes["short_run"].startswith("warning: 1 training step(s)")
    # the batch given stays; the unset schedule flags get the small-data defaults
    assert notes["small_data_defaults"].startswith("small-data defaults: --lr 0.002 --beta1 0.9 --beta2 0.999 "
                                                  "--early-stop-patience 2 --early-stop-min-delta 0.001 --keep-best: ")


def test_short_run_is_stated():
    cfg = _cfg(["--model", "dlrm", "--synthetic", "--synthetic-rows", "2048", "--batch-size", "1024",
                "--epochs", "1"])
    assert cfg.notes == [("short_run", "warning: 2 training step(s) (--synthetic-rows 2048, --batch-size 1024, --epochs 1): "
                         "no more than the --benchmark-warmup-steps 20, so no throughput is measured; a smaller "
                         "--batch-size gives more steps")]
    assert _cfg(["--model", "dlrm", "--synthetic"]).notes == []     # 32 steps per epoch: timed


def test_reference_sizes_on_cpu_warn_and_small_ones_do_not():
    ref = resolve(build_parser().parse_args(["--model", "dlrm", "--synthetic", "--synthetic-rows", "100000",
                                             "--batch-size", "65536", "--embedding-dim", "128",
                                             "--bottom-mlp", "512,256,128", "--top-mlp", "1024,1024,512,256,1",
                                             "--amp", "--xla"]))
    line = slow_warning(ref, gpus=0, cores=2)
    assert line.startswith("warning: no GPU found: this configuration will be very slow here, about ")
    assert "on 2 CPU core(s) (--batch-size 65536 with these layer widths; --amp (float16 is emulated" in line
    assert "--xla compilation on top" in line and "\n" not in line
    assert slow_warning(ref, gpus=1, cores=2) is None
    small = resolve(build_parser().parse_args(["--model", "dlrm", "--synthetic", "--amp", "--xla"]))
    assert slow_warning(small, gpus=0, cores=2) is None        # small sizes: fine even with --amp --xla
    wd = resolve(build_parser().parse_args(["--model", "wide_deep", "--synthetic", "--synthetic-rows", "200000",
                                            "--batch-size", "131072", "--deep-hidden-units", "1024,1024,1024,1024,1024"]))
    assert "--batch-size 131072" in slow_warning(wd, gpus=0, cores=2)


def test_warnings_reach_stderr_and_the_json_log(tmp_path):
    """train.py's start-up notes go through the run logger: one console line and one info record each."""
    import io
    from recsys.monitoring.logger import RunLogger
    from recsys.train import _log_notes
    cfg = resolve(build_parser().parse_args(["--model", "dlrm", "--synthetic", "--synthetic-rows", "65536",
                                             "--batch-size", "65536", "--embedding-dim", "128",
                                             "--bottom-mlp", "512,256,128", "--top-mlp", "1024,1024,512,256,1"]))
    console = io.StringIO()
    log = RunLogger(tmp_path / "new" / "log.jsonl", console=console)   # parent created as mkdir -p
    _log_notes(cfg, 0, log)
    log.close()
    infos = records(read_log(tmp_path / "new" / "log.jsonl"), "info")
    assert [r["warning"] for r in infos] == ["short_run", "slow_on_this_hardware"]
    messages = [r["message"] for r in infos]
    assert len(messages) == 2 and messages[0].startswith("warning: 2 training step(s) (--synthetic-rows 65536")
    assert messages[1].startswith("warning: no GPU found: this configuration will be very slow here")
    assert console.getvalue().splitlines() == [f"[recsys] {m}" for m in messages]


def test_run_creates_missing_parents_and_states_a_short_run(tmp_path):
    """A real run: --log-path and --checkpoint-dir under directories that do not exist yet; 2 steps,
    so the short-run warning is one line on stderr and an info record in the JSON log."""
    log = tmp_path / "logs" / "2026" / "run.jsonl"
    ckpt = tmp_path / "ckpt" / "dlrm" / "a"
    res = run_train(["--model", "dlrm", "--synthetic", "--synthetic-rows", "512", "--epochs", "1",
                     *SMALL["dlrm"], "--log-path", log, "--checkpoint-dir", ckpt])
    assert res.returncode == 0, res.stderr[-3000:]
    recs = read_log(log)
    infos = [r["message"] for r in records(recs, "info")]
    short = [m for m in infos if m.startswith("warning: 2 training step(s)")]
    assert len(short) == 1 and not any(m.startswith("warning: no GPU") for m in infos), infos
    assert [r.get("warning") for r in records(recs, "info") if r.get("warning")] == ["short_run"]
    assert f"[recsys] {short[0]}" in res.stderr
    assert summary(recs)["step"] == 2
    assert any(p.name.startswith("ckpt-") for p in ckpt.iterdir())
