"""Faults 4 and 5: Criteo preprocessing killed mid-write, finalize given damaged shards, a full disk.

* An array transform task is killed by Slurm while its shard is being written (`scontrol requeue`
  of the running task: what a node failure or preemption does to a `--requeue` job: the
  processes are killed and the task goes back to the queue), runs again, and the chain's finalize
  publishes a dataset byte-identical to an uninterrupted in-process run; nothing temporary is left.
* A multinode (standalone Spark) job gets SIGKILL on every one of its processes while it writes
  its shard (found by SLURM_JOB_ID in their environment; `scancel --signal=KILL` would not do: Slurm
  turns it into a cancel, SIGTERM first, and the script's trap runs); no Spark process outlives
  it, nothing is published, and the same command submitted again produces the same bytes.
* finalize is given shards damaged the ways a kill or a bad disk leaves them (a short piece file,
  a missing one, a cut or missing manifest, a cut dictionary file) and must refuse each with one
  line naming the file (exit 2) and publish nothing.
* `criteo run --overwrite` on a small tmpfs that fills up in each stage in turn: one line naming
  the output (exit 1), the previous output byte for byte as it was, nothing else left on it.

All share one uninterrupted in-process run as the reference (3000 rows, 3 days).
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.processes import live_commands

from preproc import cli as preproc_cli
from preproc.criteo.layout import Staging
from tests.faults.record import FaultResult, record
from tests.preproc.criteo_jobs import logs, submit

pytestmark = [pytest.mark.faults, pytest.mark.slurm, pytest.mark.spark, pytest.mark.slow]


@pytest.fixture(scope="module")
def raw_and_reference(criteo_reference, tmp_path_factory):
    """(this module's work dir, raw days, the session's in-process reference output, stages kept)."""
    return (tmp_path_factory.mktemp("faults_data_kill"), *criteo_reference)


def differing_files(out: Path, reference: Path) -> list[str]:
    """Dataset files (binaries and specs) that are missing or differ from the reference."""
    wanted = sorted(p.relative_to(reference) for p in reference.glob("*/*.bin"))
    wanted += [Path("feature_spec.yaml"), Path("feature_spec_validation.yaml")]
    assert len(wanted) == 3 * 28 + 2
    return [str(rel) for rel in wanted
            if not (out / rel).is_file() or (out / rel).read_bytes() != (reference / rel).read_bytes()]


def leftovers(base: Path) -> list[str]:
    """Temporary or set-aside directories anywhere under ``base``."""
    return [str(p) for p in base.rglob(".*") if re.search(r"\.(tmp|old)-", p.name)]


def wait_for_piece(shards: Path, prefix: str, timeout: float = 600) -> Path:
    """Poll until a temporary shard directory holds a written piece file; returns that directory."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for tmp in shards.glob(f".{prefix}.tmp-*") if shards.exists() else ():
            if any(tmp.glob("piece-*/*.bin")):
                return tmp
        time.sleep(0.02)
    raise TimeoutError(f"no piece written under {shards} within {timeout} s")


def test_array_task_killed_mid_write_reruns_to_identical_bytes(slurm_cluster, raw_and_reference):
    base, raw, reference = raw_and_reference
    out = base / "array_out"
    # both tasks at once (two of the four nodes): task 1 and task 0's second run overlap instead of
    # queueing behind each other; the array cap itself is test_criteo_slurm.py's
    jobs, run_dir = submit(slurm_cluster, "--mode", "array", "--shards", 2, "--array-parallelism", 2,
                           "--input", raw, "--output", out, "--runs-dir", base / "runs", "--time", "00:15:00",
                           "--", "--threshold", 2)
    task = f"{jobs['transform']}_0"
    shard = Staging(out).shard(0, 2)
    writing = wait_for_piece(shard.parent, shard.name)
    assert slurm_cluster.job_state(task) == "RUNNING", slurm_cluster.job_state(task)
    node = slurm_cluster.run(["squeue", "-h", "-j", task, "-o", "%N"], check=True).stdout.strip()
    slurm_cluster.run(["scontrol", "requeue", task], check=True)
    killed_at = time.monotonic()
    mid_write = not shard.exists()          # killed before its shard was published
    deadline = time.monotonic() + 120
    while slurm_cluster.job_state(task) not in ("PENDING", "REQUEUED"):
        assert time.monotonic() < deadline, slurm_cluster.job_state(task)
        time.sleep(0.2)
    # Slurm holds a requeued job back (BeginTime = now + CredExpire); let it start now, on another
    # node: started at once where it was killed, slurmd refuses it ("Job credential revoked", the
    # task FAILED); under a cap of 1, task 1 ran there first. A rerun after a node failure is elsewhere too.
    slurm_cluster.run(["scontrol", "update", f"JobId={task}", "StartTime=now", f"ExcNodeList={node}"], check=True)
    state = slurm_cluster.wait_job(jobs["finalize"], timeout=900)
    recover = time.monotonic() - killed_at
    restarts = slurm_cluster.run(["scontrol", "-o", "show", "job", task]).stdout
    different = differing_files(out, reference) if state == "COMPLETED" else ["(no dataset)"]
    left = leftovers(base / "array_out.stages") + leftovers(base)
    record(FaultResult(
        fault="Criteo array transform task killed mid-write", trials=1,
        survived=int(state == "COMPLETED" and not different and not left),
        data_lost=len(different) + len(left), recover_s=round(recover, 1),
        detail=f"scontrol requeue of the running task {'while' if mid_write else 'after'} it wrote its shard; "
               "finalize bytes == uninterrupted run, no temporary left"))
    assert state == "COMPLETED", f"finalize {state}\n{logs(run_dir, 3000)}"
    assert "Restarts=1" in restarts, restarts
    assert not writing.exists(), f"the killed attempt's {writing} was not cleared"
    assert not different, different
    assert not left, left
    assert not Path(f"{out}.stages").exists()


def _spark_processes(marker: str) -> list[str]:
    return live_commands(marker, "deploy")


def job_processes(jobid: str) -> list[int]:
    """PIDs of every process a job started (batch script, srun, Spark master, workers, executors,
    driver, Python workers): they all carry SLURM_JOB_ID in their environment; slurmstepd does not."""
    marker = f"SLURM_JOB_ID={jobid}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if marker in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def sigkill_job(jobid: str, timeout: float = 60) -> int:
    """SIGKILL every process of the job at once (no trap or shutdown hook runs), until none is left."""
    killed, deadline = set(), time.monotonic() + timeout
    while True:
        pids = job_processes(jobid)
        if not pids:
            return len(killed)
        assert time.monotonic() < deadline, f"job {jobid}: processes {pids} survive SIGKILL"
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
            killed.add(pid)
        time.sleep(0.05)


def test_multinode_job_sigkilled_mid_write_resubmits_to_identical_bytes(slurm_cluster, raw_and_reference):
    base, raw, reference = raw_and_reference
    out = base / "multinode_out"
    args = ["--mode", "multinode", "--nodes", 2, "--input", raw, "--output", out, "--runs-dir", base / "runs",
            "--time", "00:15:00", "--", "--threshold", 2]
    jobs, run_dir = submit(slurm_cluster, *args)
    (jobid,) = jobs.values()
    shard = Staging(out).shard(0, 1)
    wait_for_piece(shard.parent, shard.name)
    killed = sigkill_job(jobid)
    killed_at = time.monotonic()
    mid_write = not shard.exists()
    state = slurm_cluster.wait_job(jobid, timeout=120)
    deadline = time.monotonic() + 60
    spark_logs = str(run_dir / "logs")
    while _spark_processes(spark_logs):
        assert time.monotonic() < deadline, _spark_processes(spark_logs)
        time.sleep(0.5)
    assert not out.exists(), "a killed run must not publish"
    again, run_dir2 = submit(slurm_cluster, *args)
    (jobid2,) = again.values()
    state2 = slurm_cluster.wait_job(jobid2, timeout=900)
    recover = time.monotonic() - killed_at
    different = differing_files(out, reference) if state2 == "COMPLETED" else ["(no dataset)"]
    left = leftovers(base)
    record(FaultResult(
        fault="Criteo multinode Spark job SIGKILLed mid-write", trials=1,
        survived=int(state2 == "COMPLETED" and not different and not left),
        data_lost=len(different) + len(left), recover_s=round(recover, 1),
        detail=f"SIGKILL to all {killed} processes of the job {'while' if mid_write else 'after'} it wrote its "
               "shard, then the same command again: bytes == uninterrupted run, no Spark process or temporary left"))
    assert state in ("FAILED", "CANCELLED", "NODE_FAIL"), state
    assert state2 == "COMPLETED", f"{state2}\n{logs(run_dir2, 3000)}"
    assert not different, different
    assert not left, left


def _finalize(output: Path) -> tuple[int, str]:
    """`python -m preproc criteo finalize --output OUT` in this process; (exit status, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = preproc_cli.main(["criteo", "finalize", "--output", str(output)])
    return status, err.getvalue()


def _first_piece(stages: Path) -> Path:
    return sorted((stages / "shards").glob("shard-*/piece-train-*"))[0]


DAMAGE = {
    "short piece file": lambda s: os.truncate(_first_piece(s) / "cat_3.bin",
                                              (_first_piece(s) / "cat_3.bin").stat().st_size - 1),
    "missing piece file": lambda s: (_first_piece(s) / "numerical.bin").unlink(),
    "missing piece directory": lambda s: shutil.rmtree(_first_piece(s)),
    "cut manifest": lambda s: [os.truncate(m, m.stat().st_size // 2) for m in (s / "shards").glob("*/manifest.json")],
    "missing manifest": lambda s: [m.unlink() for m in (s / "shards").glob("*/manifest.json")],
    "missing shard": lambda s: [shutil.rmtree(d) for d in (s / "shards").glob("shard-*")],
    "cut dictionary file": lambda s: [os.truncate(f, 10) for f in sorted((s / "dictionary" / "values")
                                                                          .glob("col=2/*.parquet"))[:1]],
}


def test_finalize_refuses_damaged_shards(raw_and_reference, tmp_path):
    _, _, reference = raw_and_reference
    refused, published, wrong = [], [], []
    for name, damage in DAMAGE.items():
        output = tmp_path / name.replace(" ", "_")
        stages = Staging(output).root
        shutil.copytree(Staging(reference).root, stages)
        damage(stages)
        status, err = _finalize(output)
        lines = [line for line in err.splitlines() if line.startswith("preproc: error:")]
        if output.exists():
            published.append(name)
        if status == 2 and len(lines) == 1 and str(stages) in lines[0] and "Traceback" not in err:
            refused.append(name)
        else:
            wrong.append(f"{name}: exit {status}: {err.strip()[-400:]}")
    record(FaultResult(
        fault="finalize given a damaged shard", trials=len(DAMAGE), survived=len(refused),
        data_lost=len(published), recover_s=None,
        detail="refused with one line naming the file, exit 2, nothing published: " + ", ".join(DAMAGE)))
    assert not published, published
    assert not wrong, wrong
    # and the intact stages still finalize to the reference bytes
    output = tmp_path / "intact"
    shutil.copytree(Staging(reference).root, Staging(output).root)
    status, err = _finalize(output)
    assert status == 0, err
    assert not differing_files(output, reference)


# --- fault 5: the output's file system fills up ---------------------------------------------------

def _usage(path: Path) -> int:
    """Bytes of file-system blocks the files under ``path`` take (what counts against a tmpfs)."""
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def _tree(path: Path) -> dict:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of a few MiB, mounted for this test only (we are root in CI)."""
    mount = tmp_path / "small"
    mount.mkdir()
    size_mib = 8
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
    yield mount
    if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "--lazy", str(mount)], capture_output=True)   # a file still open in it


@contextlib.contextmanager
def same_sql_conf(session):
    """Put the session's runtime SQL settings back after an in-process CLI run changed them."""
    before = {r["key"]: r["value"] for r in session.sql("SET").collect()}
    try:
        yield
    finally:
        after = {r["key"]: r["value"] for r in session.sql("SET").collect()}
        for key in after:
            if after[key] == before.get(key):
                continue
            try:
                if key in before:
                    session.conf.set(key, before[key])
                else:
                    session.conf.unset(key)
            except Exception:  # Spark core settings (app name, memory) refuse runtime changes: no effect anyway
                pass


def test_full_disk_in_each_stage_keeps_the_previous_output(spark, raw_and_reference, small_disk):  # noqa: F811
    """`python -m preproc criteo run --overwrite` on a file system that fills up in the dictionary,
    the transform and the finalize stage in turn: one line naming the output, exit 1, the previous
    output byte for byte as it was, and nothing else left on the file system."""
    _, raw, reference = raw_and_reference
    stages = Staging(reference).root
    need = {"dictionary": _usage(stages / "dictionary"), "transform": _usage(stages / "shards")}
    need["finalize"] = _usage(reference)
    out = small_disk / "criteo"
    shutil.copytree(reference, out)          # the previous output, which must survive
    previous = _tree(out)
    filler = small_disk / "filler"
    outcomes, lost, times = [], 0, []
    for stage, before in (("dictionary", 0), ("transform", need["dictionary"]),
                          ("finalize", need["dictionary"] + need["transform"])):
        free = before + need[stage] // 2     # room for the stages before this one and half of it
        with open(filler, "wb") as handle:
            handle.truncate(0)
            spare = shutil.disk_usage(small_disk).free - free
            assert spare > 0, f"the tmpfs is too small for this data ({need})"
            handle.write(b"\0" * spare)
        err = io.StringIO()
        start = time.monotonic()
        with same_sql_conf(spark), contextlib.redirect_stderr(err):
            status = preproc_cli.main(["criteo", "run", "--input", str(raw), "--output", str(out), "--overwrite",
                                       "--threshold", "2", "--shuffle-partitions", "4", "--node-cores", "2"])
        times.append(time.monotonic() - start)
        errors = [line for line in err.getvalue().splitlines() if line.startswith("preproc: error:")]
        left = sorted({str(p.relative_to(small_disk)) for p in small_disk.iterdir()} - {"criteo", "filler"})
        intact = _tree(out) == previous
        lost += (not intact) + len(left)
        clean = (status == 1 and len(errors) == 1 and "no space left on device" in errors[0]
                 and str(out) in errors[0] and "Traceback" not in err.getvalue())
        outcomes.append((stage, status, errors, left, intact, clean, err.getvalue()[-1500:]))
        filler.unlink()
    record(FaultResult(
        fault="preprocessing output disk full", trials=len(outcomes),
        survived=sum(1 for o in outcomes if o[4] and o[5] and not o[3]), data_lost=lost,
        recover_s=None,
        detail="tmpfs filled during the dictionary, transform and finalize stage of `criteo run --overwrite`: "
               "one line, exit 1, previous output byte-identical, nothing else left"))
    for stage, status, errors, left, intact, clean, tail in outcomes:
        assert intact, f"{stage}: the previous output changed"
        assert not left, f"{stage}: left behind {left}"
        assert clean, f"{stage}: exit {status}, {errors}\n{tail}"
