"""The pure parts behind the training fault tests, without Slurm or TensorFlow: what a killed
checkpoint writer leaves is listed and cleared correctly, and the submission-time lead-time warning."""
from __future__ import annotations

import json
import os

import pytest

from jobs.backends.slurm.script import render
from jobs.planning.engine_args import checkpoint_dir
from jobs.planning.plan import plan
from jobs.planning.request import JobRequest
from jobs.planning.requeue import MAX_IDLE_REQUEUES, lead_time_warning
from jobs.profiles import load_profile
from recsys.checkpoints.atomic import AtomicCheckpointer, recover

pytestmark = [pytest.mark.faults, pytest.mark.fast]


def _ckpt(path, step=None):
    os.makedirs(path)
    if step is not None:
        with open(os.path.join(path, "meta.json"), "w") as f:
            json.dump({"step": step}, f)


def test_leftovers_of_killed_writers_are_listed_right_and_cleared(tmp_path):
    d = tmp_path / "ck"
    _ckpt(d / "ckpt-0000000005", 5)
    _ckpt(d / "ckpt-0000000006.old-123", 6)    # killed between the two renames of a replacement
    _ckpt(d / "ckpt-0000000007.old-124", 7)    # killed after the new copy was in place
    _ckpt(d / "ckpt-0000000007", 7)
    _ckpt(d / "ckpt-0000000008")                # no meta.json: never complete
    _ckpt(d / ".tmp-ckpt-0000000009-125", 9)    # killed mid-write
    _ckpt(d / ".trash-ckpt-0000000004-126", 4)  # killed mid-prune
    reader = AtomicCheckpointer(str(d), None, writer=False)
    assert [(s, os.path.basename(p)) for s, p in reader.list()] == [
        (5, "ckpt-0000000005"), (6, "ckpt-0000000006.old-123"), (7, "ckpt-0000000007")]
    recover(str(d))
    assert sorted(os.listdir(d)) == ["ckpt-0000000005", "ckpt-0000000006", "ckpt-0000000007", "ckpt-0000000008"]
    assert [s for s, _ in reader.list()] == [5, 6, 7]


def _spec(tmp_path, *engine_args, time="5", signal=60, requeue=True):
    req = JobRequest(kind="train", model="dlrm", nodes=1, time=time, signal_seconds=signal, requeue=requeue,
                     engine_args=list(engine_args))
    return plan([req], load_profile("ci"))[1][0]


def test_lead_time_warning_from_the_previous_attempt(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    assert checkpoint_dir(["--checkpoint-dir", str(ck)]) == str(ck)
    assert checkpoint_dir([f"--checkpoint-dir={ck}"]) == str(ck)
    spec = _spec(tmp_path, "--checkpoint-dir", str(ck))
    assert spec.checkpoint_dir == str(ck)
    assert lead_time_warning(spec) is None                       # no earlier attempt measured
    (ck / "attempt.json").write_text(json.dumps({"startup_s": 250.0, "checkpoint_s": 5.0}))
    warning = lead_time_warning(spec)                            # 300 s - 60 s < 255 s
    assert warning and "240 s" in warning and "250 s of start-up" in warning and "attempt.json" in warning
    assert lead_time_warning(_spec(tmp_path, "--checkpoint-dir", str(ck), time="10")) is None
    assert lead_time_warning(_spec(tmp_path, "--checkpoint-dir", str(ck), requeue=False)) is None
    (ck / "attempt.json").write_text(json.dumps({"startup_s": 20.0, "checkpoint_s": 90.0}))
    assert "shorter than the previous attempt's checkpoint write" in lead_time_warning(
        _spec(tmp_path, "--checkpoint-dir", str(ck), time="10"))
    (ck / "attempt.json").write_text("{torn")
    assert lead_time_warning(spec) is None


def test_guard_rendered_only_for_training_with_checkpoints(tmp_path):
    with_ckpt = render(_spec(tmp_path, "--checkpoint-dir", "/ck dir/x"), str(tmp_path / "run"))
    assert "recsys_ckpt_dir='/ck dir/x'" in with_ckpt
    assert f"recsys_max_idle={MAX_IDLE_REQUEUES}" in with_ckpt
    # the USR2 trap comes before the profile's set-up lines
    assert with_ckpt.index("trap recsys_on_usr2 USR2") < with_ckpt.index("# --- profile setup")
    without = render(_spec(tmp_path), str(tmp_path / "run"))
    assert "recsys_ckpt_dir=''" in without


def test_a_chained_train_job_guards_the_checkpoint_dir_it_is_handed(tmp_path):
    """Issue 20: a train -> evaluate chain hands the train job `--checkpoint-dir
    "$RECSYS_RUN_DIR/checkpoints-train"`; the requeue guard and the lead-time warning read that
    same directory (they read the job's engine argv, not only the user's arguments)."""
    data = tmp_path / "data"
    data.mkdir()
    chain = [JobRequest(kind="train", model="ncf", nodes=1, time="5", signal_seconds=60,
                        engine_args=["--data-path", str(data)]),
             JobRequest(kind="evaluate", model="ncf", nodes=1, time="5", engine_args=["--data-path", str(data)])]
    train = plan(chain, load_profile("ci"))[1][0]
    assert train.key == "train" and train.checkpoint_dir == "$RECSYS_RUN_DIR/checkpoints-train"
    assert train.checkpoint_dir == checkpoint_dir(train.command)
    run_dir = tmp_path / "run"
    script = render(train, str(run_dir))
    assert 'recsys_ckpt_dir="$RECSYS_RUN_DIR/checkpoints-train"' in script
    assert lead_time_warning(train, str(run_dir)) is None                 # no earlier attempt
    (run_dir / "checkpoints-train").mkdir(parents=True)
    (run_dir / "checkpoints-train" / "attempt.json").write_text(json.dumps({"startup_s": 250.0, "checkpoint_s": 5.0}))
    warning = lead_time_warning(train, str(run_dir))
    assert warning and "250 s of start-up" in warning and "checkpoints-train/attempt.json" in warning
