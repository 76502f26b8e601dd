"""A local job's state, read from submitit's records and the process table, in the toolkit's
words (jobs.states): RUNNING while its controller lives, then COMPLETED when every task's result
says success with exit 0, FAILED otherwise, CANCELLED when it ended without results."""

import glob
import os
import pickle
import re
import time

from jobs import states
from jobs.polling import poll_until
from jobs.runs.enginelog import tail_text
from jobs.slurmtime import elapsed_clock

CONTROLLER = "submitit.local._local"     # the module a submitit local controller runs


def folder(run_dir):
    """Where submitit keeps the run's jobs."""
    return os.path.join(run_dir, "submitit")


def job_state(submitit_folder, job_id, ntasks):
    """COMPLETED/FAILED from submitit's result files, RUNNING while the controller lives."""
    from submitit.core.utils import JobPaths

    results = [JobPaths(submitit_folder, job_id, t).result_pickle for t in range(ntasks)]
    if all(p.exists() for p in results):
        return results_state(results)
    try:
        os.kill(int(job_id), 0)
        return states.RUNNING
    except (OSError, ValueError):
        return states.CANCELLED


def results_state(results):
    """COMPLETED when every task's submitit result pickle says success with exit 0, else FAILED."""
    for path in results:
        with open(path, "rb") as handle:
            outcome, value = pickle.load(handle)
        if outcome != "success" or value != 0:
            return states.FAILED
    return states.COMPLETED


def controller_folder(job_id):
    """The submitit folder of a running local job (its controller's pid is the job id), else None."""
    try:
        with open(f"/proc/{int(job_id)}/cmdline", "rb") as handle:
            argv = handle.read().decode(errors="replace").split("\0")
    except (OSError, ValueError):
        return None
    if CONTROLLER not in argv:
        return None
    at = argv.index(CONTROLLER)
    return argv[at + 1] if at + 1 < len(argv) else None


def after_state(submitit_folder, job_id):
    """Wait for a local job outside this run to end; COMPLETED when every task of it succeeded."""
    poll_until(lambda: controller_folder(job_id) == submitit_folder, lambda alive: not alive,
               first=0.2, ceiling=2)
    results = glob.glob(os.path.join(submitit_folder, f"{glob.escape(str(job_id))}_*_result.pkl"))
    return results_state(results) if results else states.CANCELLED


PROGRESS_S = 30.0      # a foreground job's progress line, this often (a plain line: a terminal and a log file alike)
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|[\x00-\x1f\x7f]")     # terminal escapes, control characters


def wait_for(run_dir, job, progress=None, every=PROGRESS_S):
    """Wait for a job of this run to end; its final state. `progress(line)`, when given, gets a
    line every `every` s while the job runs: its elapsed time and the newest line of its output."""
    start = time.monotonic()
    said = [start]

    def once():
        state = job_state(folder(run_dir), job.job_id, job.ntasks)
        now = time.monotonic()
        if progress and state == states.RUNNING and now - said[0] >= every:
            said[0] = now
            progress(progress_line(run_dir, job, now - start))
        return state

    return poll_until(once, lambda state: state != states.RUNNING, first=0.2, factor=1.0, ceiling=0.2)


def progress_line(run_dir, job, elapsed_s):
    """`local job main (pid 123) running 0:01:30; last output: <line>` (its rank 0 log's newest line,
    control characters dropped, at most 160 characters)."""
    line = f"local job {job.key} (pid {job.job_id}) running {elapsed_clock(elapsed_s)}"
    last = _newest_line(glob.glob(os.path.join(glob.escape(run_dir), "logs", f"{glob.escape(job.key)}-*.rank0.log")))
    return f"{line}; last output: {last}" if last else line


def _newest_line(paths, tail=4096):
    """The last non-empty line of the newest file (a carriage return starts a line: progress bars)."""
    try:
        text = tail_text(max(paths, key=os.path.getmtime), tail)
    except (OSError, ValueError):
        return None
    lines = [_CONTROL.sub("", part).strip() for part in re.split(r"[\r\n]", text)]
    lines = [part for part in lines if part]
    if not lines:
        return None
    return lines[-1] if len(lines[-1]) <= 160 else lines[-1][:157] + "..."
