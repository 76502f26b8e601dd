"""What Slurm says about jobs: the squeue / sacct / scontrol queries of a status poll and their
parsers.

The parsers are pure functions of a command's text output, tested on outputs recorded from the
real test cluster (tests/jobs/recorded/, re-recorded by tests/jobs/record_slurm_outputs.py),
array job ids (`123_[4-9%2]`) included: parsed here, not by submitit's private helpers, so the
toolkit shares an environment with any submitit release (issue 48). States come back in the
toolkit's words (jobs.backends.slurm.states).
"""

import re

from jobs import states

from . import commands
from .states import to_state

CALLS = {"count": 0}    # Slurm commands issued by status queries (the benchmark and tests read it)
# squeue's reason for a pending job whose afterok dependency failed: it can never start
NEVER = "DependencyNeverSatisfied"

SACCT_STATES = ["sacct", "-X", "--parsable2", "-o", "JobID,State,ExitCode,NodeList"]
SQUEUE_STATES = ["squeue", "-h", "-r", "--states=all", "-o", "%i|%T|%r"]
SACCT_IDS = ["sacct", "-X", "-n", "--parsable2", "-o", "JobID"]
SQUEUE_IDS = ["squeue", "-h", "-r", "--states=all", "-o", "%i"]
# the jobs of every user under one job name that have not ended (the batch script last: a path
# may hold the separator); followed by --name=<name>
SQUEUE_NAMED = ["squeue", "-h", "-a", "-o", "%i|%u|%T|%r|%o"]


# a pending array's tasks as squeue and sacct print them: 12_[0-3], 12_[1,4-6%2]
_ARRAY_RANGE = re.compile(r"(\d+)_\[([\d,-]+)(?:%\d+)?\]")


def expand_job_id(job_id):
    """Task ids of a job id as Slurm prints it: `12` -> 12, `12_3` -> 12_3, `12_[0-3%2]` -> 12_0 ..
    12_3, `12_[1,4-5]` -> 12_1, 12_4, 12_5. ValueError for an array task that is not a number."""
    text = str(job_id).strip()
    match = _ARRAY_RANGE.fullmatch(text)
    if match:
        main, out = match.group(1), []
        for part in filter(None, match.group(2).split(",")):
            first, _, last = part.partition("-")
            out += [f"{main}_{task}" for task in range(int(first), int(last or first) + 1)]
        return out
    main, array, task = text.partition("_")
    return [f"{main}_{int(task)}"] if array else [main]     # a heterogeneous job's 12+0 stays itself


# --- parsers of recorded text -------------------------------------------------------------

def parse_sacct(text):
    """{task id: toolkit state} from `sacct -X --parsable2 -o JobID,State,ExitCode,NodeList` (a
    header line, then one `|`-separated row per job or array range; job steps `12.batch` and ids
    that are not a job's are skipped)."""
    lines = text.splitlines()
    if len(lines) < 2:
        return {}
    names = lines[0].split("|")
    found = {}
    for line in lines[1:]:
        row = dict(zip(names, (value.strip() for value in line.split("|"))))
        job_id = row.get("JobID", "")
        if not job_id or "." in job_id:
            continue
        try:
            tasks = expand_job_id(job_id)
        except ValueError:
            continue
        for task in tasks:
            found[task] = to_state(row.get("State"))
    return found


def parse_squeue(text):
    """({task id: toolkit state}, {pending tasks that can never start}) from
    `squeue -h -r --states=all -o %i|%T|%r`; jobs squeue no longer knows are absent."""
    found, never = {}, set()
    for line in text.splitlines():
        job_id, _, rest = line.strip().partition("|")
        word, _, reason = rest.partition("|")
        if job_id:
            for task in expand_job_id(job_id):
                found[task] = to_state(word)
                if found[task] == states.PENDING and reason.strip() == NEVER:
                    never.add(task)
    return found, never


def parse_named(text):
    """[QueuedJob] from `squeue -h -a -o %i|%u|%T|%r|%o --name=NAME` (every user's, not ended)."""
    from ..base import QueuedJob

    out = []
    for line in text.splitlines():
        fields = line.strip().split("|", 4)
        if len(fields) == 5 and fields[0]:
            job_id, user, word, reason, script = fields
            out.append(QueuedJob(job_id=job_id, user=user, state=to_state(word),
                                 reason="" if reason.strip() in ("None", "(null)") else reason.strip(),
                                 script=script.strip()))
    return out


def parse_scontrol_job(text):
    """The toolkit state in `scontrol show job ID` output (one or several lines), else None."""
    for word in text.split():
        if word.startswith("JobState="):
            return to_state(word.split("=", 1)[1])
    return None


def parse_known_ids(text):
    """Every job and array id named by `sacct -X -n -o JobID` or `squeue -h -r -o %i` output:
    each task, and its array as a whole."""
    known = set()
    for line in text.split():
        for task in expand_job_id(line.strip()):
            known.update((task, task.split("_")[0]))
    return known


# --- the calls -----------------------------------------------------------------------------

def _call(args):
    CALLS["count"] += 1
    return commands.run(args, timeout=60)


def query_sacct(ids):
    """{task id: state} from one sacct call; None when sacct cannot answer."""
    proc = _call(SACCT_STATES + ["-j", ",".join(ids)])
    if proc.returncode != 0:
        return None
    return parse_sacct(proc.stdout)


def query_squeue(ids, never=None):
    """{task id: state} from one squeue call (jobs it no longer knows are absent); the pending
    tasks that can never start (an afterok job failed) are added to the set `never`."""
    proc = _call(SQUEUE_STATES + ["-j", ",".join(ids)])
    if proc.returncode != 0 and "invalid job id" not in (proc.stderr or "").lower():
        raise commands.failed("squeue", proc)
    found, cannot_start = parse_squeue(proc.stdout)
    if never is not None:
        never.update(cannot_start)
    return found


def query_scontrol(task):
    """The state of one job from `scontrol show job`: None when the controller says it has no
    such job ("Invalid job id specified": forgotten after MinJobAge); any other failure (the
    controller unreachable) raises, since it says nothing about the job."""
    proc = _call(["scontrol", "show", "job", task])
    if proc.returncode != 0:
        if "invalid job id" in (proc.stderr or "").lower():
            return None
        raise commands.failed("scontrol", proc)
    return parse_scontrol_job(proc.stdout) or states.UNKNOWN


def queued_named(name):
    """[QueuedJob] of every user with job name `name` that has not ended, from one squeue call
    (a cluster with PrivateData=jobs shows only the caller's own)."""
    proc = commands.run(SQUEUE_NAMED + [f"--name={name}"], timeout=60)
    if proc.returncode != 0:
        raise commands.failed("squeue", proc)
    return parse_named(proc.stdout)


def missing_jobs(ids, accounting):
    """The ids Slurm does not know: one sacct call with accounting (finished jobs too), else one
    squeue call for all of them."""
    ids = [str(i) for i in ids]
    if accounting:
        proc = commands.run(SACCT_IDS + ["-j", ",".join(ids)], timeout=60)
        if proc.returncode != 0:
            raise commands.failed("sacct", proc)
    else:
        proc = commands.run(SQUEUE_IDS + ["-j", ",".join(ids)], timeout=60)
        if proc.returncode != 0:
            if "invalid job id" in (proc.stderr or "").lower():
                return ids      # squeue says so only when it knows none of them
            raise commands.failed("squeue", proc)
    known = parse_known_ids(proc.stdout)
    return [i for i in ids if i not in known]
