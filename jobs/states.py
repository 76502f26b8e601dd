"""The toolkit's job states: the one vocabulary status, studies and both backends speak.

Each backend maps its scheduler's own words onto these (jobs.backends.slurm.states for Slurm's
squeue/sacct/scontrol states, jobs.backends.local.states for submitit's local jobs); everything
above the backends reads only these. The names are Slurm's, the words HPC users already know.
A state the toolkit cannot see (yet) is UNKNOWN: neither active nor finished, never a failure.
"""

PENDING, REQUEUED, SUSPENDED, RUNNING = "PENDING", "REQUEUED", "SUSPENDED", "RUNNING"
COMPLETED, FAILED, CANCELLED, TIMEOUT = "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"
NODE_FAIL, OUT_OF_MEMORY, PREEMPTED = "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"
UNKNOWN = "UNKNOWN"
# Slurm says FAILED; the engine's no-progress watchdog says why: no step completed within its limit
# (recsys.monitoring.watchdog, read back by jobs.status from the engine log's `hang` records)
HUNG = "HUNG"

# queued or running: the job may still produce a result
ACTIVE = frozenset({PENDING, REQUEUED, SUSPENDED, RUNNING})
# finished, for good; only COMPLETED finished well
TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, HUNG})
STATES = ACTIVE | TERMINAL | {UNKNOWN}


def summarize(states):
    """One word for a job, or counts for an array: 'COMPLETED', '3 RUNNING, 5 PENDING'."""
    if len(states) == 1:
        return states[0]
    counts = {}
    for state in states:
        counts[state] = counts.get(state, 0) + 1
    if len(counts) == 1:
        return f"{len(states)} {states[0]}"
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: -kv[1]))
