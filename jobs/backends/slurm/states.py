"""Slurm's job states (squeue, sacct, scontrol words) mapped onto the toolkit's (jobs.states).

The one place that knows Slurm's vocabulary: a word Slurm may print in the middle of a job's
life maps to an active state, an ending to its terminal state, and anything else (a state of a
newer Slurm, a word we could not read) to UNKNOWN, which nobody treats as failed.
"""

from jobs import states

STATE_MAP = {
    "PENDING": states.PENDING,
    "CONFIGURING": states.PENDING,      # allocated, nodes booting: nothing runs yet
    "REQUEUE_HOLD": states.PENDING,
    "REQUEUE_FED": states.PENDING,
    "RESV_DEL_HOLD": states.PENDING,
    "REQUEUED": states.REQUEUED,
    "SUSPENDED": states.SUSPENDED,
    "STOPPED": states.SUSPENDED,
    "RUNNING": states.RUNNING,
    "COMPLETING": states.RUNNING,       # the step ended, epilogs still run
    "RESIZING": states.RUNNING,
    "SIGNALING": states.RUNNING,
    "STAGE_OUT": states.RUNNING,
    "COMPLETED": states.COMPLETED,
    "FAILED": states.FAILED,
    "SPECIAL_EXIT": states.FAILED,
    "CANCELLED": states.CANCELLED,
    "REVOKED": states.CANCELLED,        # a sibling cluster of a federation started it instead
    "TIMEOUT": states.TIMEOUT,
    "DEADLINE": states.TIMEOUT,
    "NODE_FAIL": states.NODE_FAIL,
    "BOOT_FAIL": states.NODE_FAIL,
    "OUT_OF_MEMORY": states.OUT_OF_MEMORY,
    "PREEMPTED": states.PREEMPTED,
}


def to_state(word):
    """The toolkit state of a Slurm state word as the commands print it ("CANCELLED by 0",
    "COMPLETED+", "running" ...); UNKNOWN for a word this map does not know."""
    base = (word or "").split()[0].rstrip("+").upper() if (word or "").strip() else ""
    return STATE_MAP.get(base, states.UNKNOWN)
