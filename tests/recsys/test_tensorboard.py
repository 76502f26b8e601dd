"""TensorBoard event files and tf.profiler traces of real engine runs, read back with TensorBoard's
own loader and the XSpace proto that ships with TensorFlow (recsys/monitoring/tensorboard.py)."""
from __future__ import annotations

import gzip
import json
import shlex
import shutil
import socket
import subprocess
import sys
import urllib.parse
import urllib.request

import pytest

from conftest import REPO, SMALL, base_env, read_log, records, run_train
from tb_events import accumulator, markers, series, traces
from tests.waiting import wait_for

# 16 steps an epoch: an epoch checkpoint at 16, the end's at 30.
RUN = ["--model", "dlrm", "--synthetic", "--synthetic-rows", "4096", *SMALL["dlrm"], "--epochs", "3",
       "--log-every", "5", "--benchmark-warmup-steps", "2"]


@pytest.fixture(scope="module")
def restored_run(tmp_path_factory):
    """A run to step 30 (profiled at steps 3-4) whose last checkpoint is then lost, as when a job dies
    after its figures of steps 17-30 were written; the same job restarted with --restore (a requeue:
    same log, same event directory) continues from step 16 to 40."""
    out = tmp_path_factory.mktemp("tensorboard")
    log = out / "logs" / "main-7.engine.jsonl"
    common = [*RUN, "--checkpoint-dir", out / "ck", "--log-path", log]
    first = run_train([*common, "--max-steps", "30", "--profile-steps", "3-4"])
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.rmtree(out / "ck" / "ckpt-0000000030")
    second = run_train([*common, "--max-steps", "40", "--restore"])
    assert second.returncode == 0, second.stderr[-3000:]
    return out, read_log(log)


def test_scalars_are_the_json_logs_and_continue_after_a_restore(restored_run):
    out, log = restored_run
    rank0 = out / "logs" / "tensorboard" / "main-7" / "rank0"
    assert len(list(rank0.glob("events.out.tfevents.*"))) == 2       # one file per attempt
    acc = accumulator(rank0)
    restored = [r for r in records(log, "info") if "restored_step" in r]
    assert [r["restored_step"] for r in restored] == [16]
    # The JSON log keeps both attempts (steps 20-30 twice); TensorBoard shows each step once, the
    # figure of the attempt that the run continued from.
    steps = records(log, "step")
    assert [r["step"] for r in steps] == [5, 10, 15, 20, 25, 30, 20, 25, 30, 35, 40]
    last = {r["step"]: r for r in steps}
    for key, tag in (("loss", "train/loss"), ("lr", "train/lr"), ("samples_per_s", "train/samples_per_s"),
                     ("step_time_ms", "train/step_time_ms")):
        got = series(acc, tag)
        assert [s for s, _ in got] == sorted(last), tag
        assert [v for _, v in got] == pytest.approx([last[s][key] for s in sorted(last)], rel=1e-6), tag
    # evaluations: up to the restored step the first attempt's; after it (30 was lost with its
    # checkpoint) the second's: 32 and 40
    cut = log.index(restored[0])
    kept = {r["step"]: r for r in records(log[:cut], "eval") if r["step"] <= 16}
    kept.update({r["step"]: r for r in records(log[cut:], "eval") if r["step"] > 16})
    assert sorted(kept) == [16, 32, 40]
    for metric in ("auc", "bce"):
        assert series(acc, f"eval/{metric}") == [(s, pytest.approx(kept[s][metric], rel=1e-6)) for s in sorted(kept)]
    # the summary's throughput at its step, once per attempt that timed steps
    summaries = records(log, "summary")
    assert series(acc, "summary/throughput_samples_per_s") == [
        (s["step"], pytest.approx(s["throughput_samples_per_s"], rel=1e-6)) for s in summaries[-1:]]


def test_profiled_steps_are_traced_and_open_in_the_profile_plugin(restored_run):
    out, _ = restored_run
    found = traces(out / "logs" / "tensorboard" / "main-7" / "rank0")
    assert len(found) == 1, found
    steps, planes = markers(found[0])
    assert steps == [3, 4]
    assert "/host:CPU" in planes
    convert = pytest.importorskip("tensorboard_plugin_profile.convert.raw_to_tool_data")
    data, content_type = convert.xspace_to_tool_data([found[0]], "trace_viewer^", {})
    assert content_type == "application/json" and b"train" in (data if isinstance(data, bytes) else data.encode())


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _get(port, path, **query):
    """A TensorBoard HTTP API answer (JSON), or None while it is not serving yet."""
    try:
        with urllib.request.urlopen(f"http://localhost:{port}{path}?{urllib.parse.urlencode(query)}", timeout=5) as r:
            return json.loads(r.read())
    except OSError:
        return None


def test_wide_deep_amp_figures(tmp_path):
    """The figures the DLRM run above has not: Wide & Deep's two learning rates, the --amp loss
    scale, MAP@12, each the JSON log's at its step."""
    log = tmp_path / "logs" / "main-9.engine.jsonl"
    res = run_train(["--model", "wide_deep", "--synthetic", "--synthetic-rows", "1024", *SMALL["wide_deep"], "--amp",
                     "--max-steps", "4", "--log-every", "2", "--log-path", log])
    assert res.returncode == 0, res.stderr[-3000:]
    recs = read_log(log)
    steps, evals = records(recs, "step"), records(recs, "eval")
    acc = accumulator(tmp_path / "logs" / "tensorboard" / "main-9" / "rank0")
    for tag, value in (("train/lr/wide", lambda r: r["lrs"]["wide"]), ("train/lr/deep", lambda r: r["lrs"]["deep"]),
                       ("train/loss_scale", lambda r: r["loss_scale"])):
        assert series(acc, tag) == [(r["step"], pytest.approx(value(r), rel=1e-6)) for r in steps], tag
    assert {r["lrs"]["wide"] for r in steps} != {r["lrs"]["deep"] for r in steps}      # two groups, two rates
    assert evals and series(acc, "eval/map_at_12") == [(r["step"], pytest.approx(r["map_at_12"], rel=1e-6))
                                                       for r in evals]


def test_recsys_submit_tensorboard_start_serves_the_job_by_name(restored_run):
    """`recsys-submit tensorboard RUN --start`: TensorBoard itself, the job named as in the printed
    --logdir_spec, its figures read back over TensorBoard's HTTP API (what the Scalars page reads)."""
    out, log = restored_run
    (out / "jobs.json").write_text("{}")          # what makes a directory a run's (jobs.runs.rundir.find_run)
    port = _free_port()
    tb = subprocess.Popen([sys.executable, "-m", "jobs.cli", "tensorboard", str(out), "--start", "--port", str(port)],
                          cwd=REPO, env=base_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        last = {r["step"]: r["loss"] for r in records(log, "step")}       # a restored step: the later attempt's

        def to_the_end():
            """The served curve once TensorBoard, reading in the background, has read both attempts."""
            points = _get(port, "/data/plugin/scalars/scalars", run="main-7/rank0", tag="train/loss") or []
            return points if points and points[-1][1] == max(last) else None
        served = wait_for(to_the_end, timeout=120, what=f"TensorBoard serving main-7/rank0 to step {max(last)}")
        tags = _get(port, "/data/plugin/scalars/tags")["main-7/rank0"]
        assert {"train/loss", "train/lr", "eval/auc", "summary/throughput_samples_per_s"} <= set(tags)
        assert [(s, v) for _, s, v in served] == [(s, pytest.approx(last[s], rel=1e-6)) for s in sorted(last)]
    finally:
        tb.terminate()
        printed = tb.communicate(timeout=60)[0]
    assert f"ssh -N -L {port}:localhost:{port}" in printed, printed[-2000:]
    # the run has a trace, which this TensorBoard's Profile tab cannot see: the command that can
    assert f"tensorboard --logdir {out / 'logs' / 'tensorboard'} --port {port}" in printed, printed[-2000:]


def _profile_runs(port):
    """The profile plugin's run list (gzip-compressed JSON), or None while it is not serving or empty."""
    try:
        with urllib.request.urlopen(f"http://localhost:{port}/data/plugin/profile/runs", timeout=5) as r:
            body = r.read()
    except OSError:
        return None
    return json.loads(gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body) or None


def test_a_traced_rank_without_figures_opens_in_the_profile_tab(tmp_path):
    """Issue 48 item 9: a rank that traces but writes no figures (outside --tensorboard-ranks, the
    default for every rank but 0; here --no-tensorboard, the same path) still opens in the Profile
    tab of the command `recsys-submit tensorboard` prints: its directory gets an event file of no
    figures, without which TensorBoard's profile plugin does not list the rank's trace."""
    log = tmp_path / "logs" / "main-5.engine.jsonl"
    res = run_train([*RUN, "--max-steps", "4", "--profile-steps", "2-3", "--no-tensorboard", "--log-path", log])
    assert res.returncode == 0, res.stderr[-3000:]
    rank = tmp_path / "logs" / "tensorboard" / "main-5" / "rank0"
    assert len(traces(rank)) == 1
    assert not accumulator(rank).Tags()["scalars"]                  # --no-tensorboard: still no figures
    (tmp_path / "jobs.json").write_text("{}")
    printed = subprocess.run([sys.executable, "-m", "jobs.cli", "tensorboard", str(tmp_path)], cwd=REPO,
                             env=base_env(), capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    lines = printed.stdout.splitlines()
    profile = shlex.split(lines[lines.index(next(x for x in lines if x.startswith("# the Profile tab"))) + 1])
    port = _free_port()
    argv = [sys.executable, "-m", "tensorboard.main", *profile[1:]]
    argv[argv.index("--port") + 1] = str(port)
    tb = subprocess.Popen(argv, cwd=REPO, env=base_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        runs = wait_for(lambda: _profile_runs(port), timeout=120, what="TensorBoard's profile plugin listing the run")
    finally:
        tb.terminate()
        tb.wait(timeout=60)
    assert any(run.startswith("main-5/rank0/") for run in runs), runs


def test_a_local_restore_continues_the_first_attempts_tensorboard_run(tmp_path):
    """Issue 48 item 9: a `--restore` that is a run of its own (a local restore: a new run directory
    and log path) made a second TensorBoard run, and `recsys-submit tensorboard` showed only its
    steps. Now the training's first attempt names its directory in the checkpoint directory
    (tensorboard.json), a restored attempt writes there, and the newest run's command opens that
    one directory: every step of the training, each once."""
    from jobs import api

    ck = tmp_path / "ck"
    first_run, second_run = tmp_path / "runs" / "train-1", tmp_path / "runs" / "train-2"
    first = run_train([*RUN, "--max-steps", "20", "--checkpoint-dir", ck,
                       "--log-path", first_run / "logs" / "main-1.engine.jsonl"])
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_train([*RUN, "--max-steps", "40", "--checkpoint-dir", ck, "--restore",
                        "--log-path", second_run / "logs" / "main-2.engine.jsonl"])
    assert second.returncode == 0, second.stderr[-3000:]
    shared = first_run / "logs" / "tensorboard" / "main-1"
    assert not (second_run / "logs" / "tensorboard").exists()
    for run in (first_run, second_run):
        (run / "jobs.json").write_text("{}")
    kind, where, named = api.tensorboard_logdirs(str(second_run), str(tmp_path / "runs"))
    assert (kind, named) == ("run", [("main-2", str(shared))])
    logged = {r["step"]: r["loss"] for log in (first_run / "logs" / "main-1.engine.jsonl",
                                               second_run / "logs" / "main-2.engine.jsonl")
              for r in records(read_log(log), "step")}
    assert series(accumulator(shared / "rank0"), "train/loss") == [
        (s, pytest.approx(logged[s], rel=1e-6)) for s in sorted(logged)]
    assert sorted(logged) == list(range(5, 41, 5))
