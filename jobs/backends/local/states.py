"""A local job's state, read from submitit's records and the process table, in the toolkit's
words (jobs.states): RUNNING while its controller lives, then COMPLETED when every task's result
says success with exit 0, FAILED otherwise, CANCELLED when it ended without results."""

import glob
import os
import pickle

from jobs import states
from jobs.polling import poll_until

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


def wait_for(run_dir, job):
    """Wait for a job of this run to end; its final state."""
    return poll_until(lambda: job_state(folder(run_dir), job.job_id, job.ntasks),
                      lambda state: state != states.RUNNING, first=0.2, factor=1.0, ceiling=0.2)
