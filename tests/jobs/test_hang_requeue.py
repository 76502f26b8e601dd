"""A hung step is never requeued (issue 35, item 4): the rendered batch script of a train job (ci
profile, checkpoints, requeue on) run by bash outside Slurm, its step replaced by a stand-in that
answers USR2 the way a hung engine does (the watchdog fires: the hang marker, a non-zero exit).
The script records `hung=`, exits 86 and never calls `scontrol requeue`; the same stand-in without
the hang is requeued (the control). The real hang under srun: tests/jobs/test_hang_slurm.py."""

import os
import re
import shlex
import signal
import subprocess

import pytest

from jobs.planning.request import JobRequest
from jobs.submit import render_plan
from tests.waiting import wait_for

pytestmark = pytest.mark.fast

# what the step does on USR2: a hung engine's watchdog fires (marker, exit); a healthy one saves and exits 0
HUNG = 'trap \'touch "$RECSYS_HANG_MARKER"; exit 143\' USR2; echo up > "$RECSYS_RUN_DIR/step.up"; while :; do sleep 0.05; done'
HEALTHY = 'trap \'exit 0\' USR2; echo up > "$RECSYS_RUN_DIR/step.up"; while :; do sleep 0.05; done'


def _run(tmp_path, step):
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    request = JobRequest(kind="train", profile="ci", model="ncf", nodes=1,
                         engine_args=["--synthetic", "--checkpoint-dir", str(tmp_path / "ckpt")])
    [(spec, text)] = render_plan([request], "ci", run_dir=str(run_dir))
    lines = text.splitlines()
    start = lines.index("# --- the step ---") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].endswith(" &"))
    assert lines[start].startswith("srun --mpi=")
    lines[start:end + 1] = [f"bash -c {shlex.quote(step)} &"]
    script = tmp_path / "job.sh"
    script.write_text("\n".join(lines) + "\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$@" >> {tmp_path}/scontrol.calls\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", SLURM_JOB_ID="42")
    env.pop("SLURM_ARRAY_JOB_ID", None)
    proc = subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (run_dir / "step.up").exists() or proc.poll() is not None, timeout=30, what="the stand-in step")
    proc.send_signal(signal.SIGUSR2)
    out, err = proc.communicate(timeout=30)
    info = (run_dir / "logs" / "main-42.info").read_text()
    calls = (tmp_path / "scontrol.calls").read_text() if (tmp_path / "scontrol.calls").exists() else ""
    return proc.returncode, err, info, calls


def test_a_step_that_hung_is_not_requeued(tmp_path):
    rc, err, info, calls = _run(tmp_path, HUNG)
    assert rc == 86, err
    assert "not requeueing: the step hung" in err
    assert re.search(r"^hung=\d+$", info, re.M) and "exit_code=86" in info and "requeue_requested" not in info
    assert "requeue" not in calls


def test_a_healthy_step_is_requeued_as_before(tmp_path):
    rc, err, info, calls = _run(tmp_path, HEALTHY)
    assert rc == 0, err
    assert "hung=" not in info and "requeue_requested=" in info
    assert calls.strip() == "requeue 42"
