"""Named points of the submission path where a fault can be injected on purpose.

A submission can be killed anywhere (a login node's OOM killer, a closed terminal, kill -9); the
records must make every such moment recoverable (jobs.recovery). The fault tests prove it at each
named point: `RECSYS_FAULT_AT=NAME[:N]` makes the N-th arrival (default the first) at NAME run
the shell command `RECSYS_FAULT_CMD` and go on, or, without a command, SIGKILL this process
(no handler, no `finally`, as a real crash). Unset, a point costs one dictionary lookup.

The points, in the order a job passes them:
  intent-recorded  jobs.json names the job and its token, sbatch not run yet
  sbatch-returned  Slurm accepted the job; its id is in no record yet
  job-recorded     jobs.json holds the job id
"""

import os
import signal
import subprocess
import threading
from typing import Dict

POINTS = ("intent-recorded", "sbatch-returned", "job-recorded")
_COUNTS: Dict[str, int] = {}
_LOCK = threading.Lock()


def reached(name):
    """Called at point `name`; acts only when RECSYS_FAULT_AT names it (see the module doc)."""
    wanted = os.environ.get("RECSYS_FAULT_AT")
    if not wanted:
        return
    point, _, nth = wanted.partition(":")
    if point != name:
        return
    with _LOCK:
        _COUNTS[name] = _COUNTS.get(name, 0) + 1
        if _COUNTS[name] != int(nth or 1):
            return
        command = os.environ.get("RECSYS_FAULT_CMD")
        if command:
            subprocess.run(["bash", "-c", command], check=False)
            return
        os.kill(os.getpid(), signal.SIGKILL)
