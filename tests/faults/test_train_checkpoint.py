"""Faults while a checkpoint is written: a rank SIGKILLed mid-write (and its job scancelled), and a
full disk. The newest complete checkpoint must always restore; nothing partial may be listed,
restored or left behind."""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.faults.record import FaultResult, record
from tests.faults.train_helpers import DLRM, REPO, engine_env, make_data, run_engine, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.slurm]

# Kills of a checkpoint writer (each costs one TensorFlow start); RECSYS_FAULT_KILL_TRIALS overrides.
TRIALS = int(os.environ.get("RECSYS_FAULT_KILL_TRIALS", "20"))


def _progress(path):
    """(reports, [(writer index, saved step)]) of a progress file: one report per writer start."""
    reports, saved = [], []
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return reports, saved
    for line in lines:
        if line.startswith("saved "):
            saved.append((len(reports) - 1, int(line.split()[1])))   # (index of its writer's report, step)
        elif line.startswith("{"):
            reports.append(json.loads(line))
    return reports, saved


def _writer(cluster, directory, progress, layout, once=False):
    cmd = ["srun", "-N1", "-n1", "-p", cluster.partition, "--time=5", "--job-name=ckpt-writer",
           sys.executable, "-m", "tests.faults.ckpt_writer", str(directory), str(progress), layout]
    if once:
        cmd.append("--once")
    return subprocess.Popen(cmd, cwd=REPO, env=engine_env(cluster.env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _kill_chain(cluster, directory, progress, layout, trials, rng):
    """`trials` writers in turn on one directory, each SIGKILLed by Slurm at a random moment while
    it saves after every step, then its job scancelled; a last writer only reports. Returns how
    many kills left a write in progress and the seconds from each kill to the next restore."""
    kills_mid_write, recover_s, last_kill = 0, [], None
    for trial in range(trials):
        n_reports = len(_progress(progress)[0])
        proc = _writer(cluster, directory, progress, layout)
        wait_for(lambda: len(_progress(progress)[0]) > n_reports or proc.poll() is not None,
                 timeout=300, what=f"{layout} trial {trial}: the writer to start")
        if last_kill is not None:   # from the kill to the next writer having restored
            recover_s.append(time.monotonic() - last_kill)
        # the writer reports what it found, then saves after every step: kill after a random delay
        wait_for(lambda: sum(1 for r, _ in _progress(progress)[1] if r == n_reports) >= 2 or proc.poll() is not None,
                 timeout=300, what=f"{layout} trial {trial}: the writer to save twice")
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        time.sleep(rng.uniform(0.0, 0.4))      # the random kill point (not a synchronisation)
        job = _progress(progress)[0][n_reports]["job"]
        cluster.run(["scancel", "--signal=KILL", job])
        last_kill = time.monotonic()
        cluster.run(["scancel", job])
        proc.wait(timeout=120)
        names = os.listdir(directory)
        if any(n.startswith((".tmp-", ".trash-")) or ".old-" in n for n in names):
            kills_mid_write += 1
    # one last start only reports (it verifies the last kill)
    proc = _writer(cluster, directory, progress, layout, once=True)
    assert proc.wait(timeout=300) == 0, proc.stderr.read()[-2000:]
    return kills_mid_write, recover_s


def test_kill_during_checkpoint_write(slurm_cluster, tmp_path):
    """20 writers (10 replicated-layout, 10 sharded-layout checkpoints), each SIGKILLed by Slurm
    at a random moment while it saves after every step, then its job scancelled; the next
    writer on the same directory reports what it lists and restores. The two layouts' chains
    share nothing and run side by side (on 2 cores one writer's TensorFlow start fills what the
    other's waits leave idle)."""
    chains = {layout: (tmp_path / layout, tmp_path / f"{layout}.progress") for layout in ("replicated", "sharded")}
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = [pool.submit(_kill_chain, slurm_cluster, directory, progress, layout,
                                   TRIALS // 2 + (TRIALS % 2 if layout == "replicated" else 0),
                                   random.Random(13 + index))
                       for index, (layout, (directory, progress)) in enumerate(chains.items())]
            results = [future.result() for future in futures]
    finally:
        slurm_cluster.run(["scancel", "--name=ckpt-writer"])
    kills_mid_write = sum(kills for kills, _ in results)
    recover_s = [s for _, seconds in results for s in seconds]

    partial_listed = restored_bad = stale_steps = leftovers = 0
    checked = 0
    for layout, (directory, progress) in chains.items():
        reports, saved = _progress(progress)
        assert reports[0]["restored"] is None                     # the first writer started empty
        for index, report in enumerate(reports[1:], start=1):
            checked += 1
            partial_listed += sum(1 for c in report["listed"] if not c["complete"])
            done = [s for r, s in saved if r == index - 1]
            restored = report["restored"] or {}
            if not restored.get("weights_ok") or restored.get("step") != restored.get("meta_step"):
                restored_bad += 1
            # the newest complete save (announced, or published just before the kill) is the one restored
            elif not done[-1] <= restored["step"] <= done[-1] + 1:
                stale_steps += 1
            leftovers += sum(1 for n in report["after_recover"]
                             if n.startswith((".tmp-", ".trash-")) or ".old-" in n)
    lost = partial_listed + restored_bad + stale_steps + leftovers
    record(FaultResult(
        fault="kill during checkpoint write", trials=TRIALS, survived=checked - restored_bad - stale_steps,
        data_lost=lost, recover_s=round(statistics.median(recover_s), 1) if recover_s else None,
        detail=f"SIGKILL via scancel at random points of a save-every-step loop ({kills_mid_write} kills left a "
               f"write in progress); next start lists only complete checkpoints and restores the newest: "
               f"{partial_listed} partial listed, {restored_bad} bad restores, {stale_steps} stale, {leftovers} leftovers"))
    assert checked == TRIALS
    assert kills_mid_write >= 1, "no kill landed during a write: the test did not exercise the fault"
    assert lost == 0, (partial_listed, restored_bad, stale_steps, leftovers)


def _tree_digest(path):
    h = hashlib.sha1()
    for root, dirs, files in sorted(os.walk(path)):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            h.update(os.path.relpath(full, path).encode())
            h.update(open(full, "rb").read())
    return h.hexdigest()


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MB tmpfs (we are root in CI); unmounted afterwards."""
    mnt = tmp_path / "small-fs"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_full_disk_during_checkpoint(small_fs, tmp_path):
    data = make_data(tmp_path / "data")
    src = tmp_path / "ck"
    res = run_engine([*DLRM, "--data-path", data, "--epochs", "1", "--max-steps", "4", "--checkpoint-dir", src,
                      "--log-path", tmp_path / "first.jsonl"])
    assert res.returncode == 0, res.stderr[-3000:]
    ck = small_fs / "ck"
    shutil.copytree(src / "ckpt-0000000004", ck / "ckpt-0000000004")
    before = _tree_digest(ck / "ckpt-0000000004")
    # fill the file system, then give back 8 KiB: far less than one checkpoint
    with open(small_fs / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    size = os.path.getsize(small_fs / "filler")
    os.truncate(small_fs / "filler", max(0, size - 8192))
    t0 = time.monotonic()
    res = run_engine([*DLRM, "--data-path", data, "--epochs", "1", "--max-steps", "8", "--checkpoint-dir", ck,
                      "--restore", "--log-path", tmp_path / "second.jsonl"])
    elapsed = time.monotonic() - t0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith("[recsys]")]
    left = sorted(os.listdir(ck))
    partial = [n for n in left if n not in ("ckpt-0000000004", "attempt.json", "tensorboard.json")]
    changed = int(_tree_digest(ck / "ckpt-0000000004") != before) if (ck / "ckpt-0000000004").is_dir() else 1
    one_line = len(lines) == 1 and lines[0].startswith("recsys-train: error: cannot write checkpoint") \
        and "No space left on device" in lines[0] and "ckpt-0000000004" in lines[0]
    # the sharded layout (every rank writes its part; the ranks agree on failure) on the same full disk
    sharded = small_fs / "sharded"
    writer = subprocess.run([sys.executable, "-m", "tests.faults.ckpt_writer", str(sharded), str(tmp_path / "w.progress"),
                             "sharded"], cwd=REPO, env=engine_env(), capture_output=True, text=True, timeout=300)
    sharded_left = [n for n in os.listdir(sharded) if n.startswith((".tmp", ".trash", "ckpt-"))]
    sharded_ok = writer.returncode != 0 and "CheckpointWriteError: cannot write checkpoint" in writer.stderr \
        and "No space left on device" in writer.stderr and not sharded_left
    survived = int(res.returncode == 1 and one_line and not partial and not changed) + int(sharded_ok)
    record(FaultResult(
        fault="full disk during checkpoint", trials=2, survived=survived,
        data_lost=len(partial) + changed + len(sharded_left), recover_s=None,
        detail=f"checkpoint dir on a full 4 MB tmpfs: training exits 1 after {elapsed:.0f} s with one line, previous "
               f"checkpoint byte-identical, nothing partial left (left: {', '.join(left)}); a sharded-layout save "
               f"fails the same way, leaving {len(sharded_left)} entries"))
    assert res.returncode == 1, res.stderr[-3000:]
    assert one_line, lines
    assert not partial, left
    assert not changed
    assert sharded_ok, (writer.returncode, writer.stderr[-2000:], sharded_left)
