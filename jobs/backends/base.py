"""The Backend interface every scheduler implements, and the dry run it returns.

Like submitit's Executor subclasses, a backend knows how to submit one planned job and how to
poll, cancel, requeue and find the logs of what it submitted; everything else (planning, the
run directory, request.json, jobs.json, breaking a chain cleanly) is the orchestrator's
(jobs.submit) and the same for every backend. As in torchx, the dry run is a value:
`dry_run(specs, run_dir)` refuses what the backend cannot run and returns a DryRun whose drafts
hold exactly what will be submitted (a Slurm draft: the checked script and its token);
`submit(draft, ids)` takes one draft and nothing else. Each backend maps its scheduler's states
onto the toolkit's (jobs.states) in its own `states` module.
"""

import abc
import glob
import os
from dataclasses import dataclass
from typing import Optional, Tuple

from jobs.schedulers import capabilities
from jobs.errors import RequestError
from jobs.planning.plan import JobSpec


@dataclass(frozen=True)
class JobDraft:
    """One planned job as its backend will submit it. `text` says what will run (a Slurm draft:
    the sbatch script; a local one: the commands and environment of its ranks); `script` is the
    file it is written to, None for a backend that writes none (local)."""

    spec: JobSpec
    run_dir: str
    text: str
    script: Optional[str] = None

    @property
    def key(self):
        return self.spec.key

    @property
    def file_note(self):
        """` (<file>)` when the draft is a script file of its own, else empty."""
        return f" ({os.path.basename(self.script)})" if self.script else ""


@dataclass(frozen=True)
class QueuedJob:
    """A job of any user the scheduler's queue shows (Backend.queued_named): what a study on
    shared nodes needs to say which job would run beside or before its points."""

    job_id: str
    user: str
    state: str                  # the toolkit's word (jobs.states)
    reason: str                 # the scheduler's reason a pending job waits ("" when none)
    script: str                 # the batch script it runs ("" when the scheduler does not say)


@dataclass(frozen=True)
class DryRun:
    """What a submission would do, checked: the value `submit` takes (jobs.submit passes each
    draft to Backend.submit in order). `wait`: whether submit runs each job to its end."""

    scheduler: str
    run_dir: str
    wait: bool
    drafts: Tuple[JobDraft, ...]

    def text(self):
        """The drafts as one text (scripts separated by a header when there are several)."""
        if len(self.drafts) == 1:
            return self.drafts[0].text
        return "\n".join(f"# ===== job {d.key}{d.file_note} =====\n{d.text}" for d in self.drafts)


class Backend(abc.ABC):
    """Submit, poll, cancel, requeue and list the logs of the jobs of one run."""

    scheduler = ""
    # whether submit() records each job's intent before asking the scheduler, so that an
    # interrupted submission can be settled by find_submitted (jobs.recovery)
    records_intents = False

    def __init__(self, profile=None):
        self.profile = profile      # None when reading back a run (poll, cancel, ...)

    @property
    def capabilities(self):
        """This backend's row of the registry's capability table (foreground, gpuless_ranks, ...)."""
        return capabilities(self.scheduler)

    # --- submission (called by jobs.submit in this order) ---
    def max_array_size(self, requests):
        """Largest array the plan may use."""
        return int(self.profile.max_array_size or 1001)

    def accounting(self):
        """Whether status can ask an accounting database (recorded in jobs.json)."""
        return False

    def queued_named(self, name):
        """[QueuedJob] of every user whose job name is `name` and that has not ended; None: this
        scheduler has no queue shared with other users (nothing to look at)."""
        return None

    @abc.abstractmethod
    def dry_run(self, specs, run_dir, wait=None, check=True, written=True, token=None):
        """The DryRun of a plan in `run_dir` (which need not exist). With `check`, first refuse
        (RequestError, one line) what this backend cannot run, asking the scheduler where it must
        (--after ids); `wait` is the caller's choice (None: the backend's default). Without
        `check` (render, --dry-run) nothing is asked or refused beyond rendering itself;
        `written`: whether the drafts' scripts will be saved (render -o, a submission); `token`:
        one fixed submission token to show instead of fresh ones (printing only)."""

    @abc.abstractmethod
    def missing_jobs(self, job_ids):
        """The ids among `job_ids` (jobs outside this run that --after waits for) that this
        scheduler does not know, in the order given; asked once for all ids."""

    def check_after(self, specs):
        """Refuse (RequestError, one line) --after ids the scheduler does not know: Slurm would
        drop such a dependency silently and start the job at once."""
        wanted = list(dict.fromkeys(i for spec in specs for i in spec.external_after))
        missing = self.missing_jobs(wanted) if wanted else []
        if missing:
            raise RequestError(f"--after: {self.scheduler} knows no job {', '.join(missing)} "
                               f"({self.unknown_job_hint})")

    unknown_job_hint = "check the id"

    @abc.abstractmethod
    def submit(self, draft, ids, wait, log=None, on_intent=None):
        """Submit one JobDraft of a DryRun; `ids` maps earlier keys to job ids. Returns [JobRecord].
        Raises SubmitError/SlurmCommandError when it could not. A backend that can find a job it
        submitted again (Slurm: by its token) calls `on_intent(JobRecord without job_id)` right
        before the scheduler is asked, so the caller can record what may go in (jobs.recovery)."""

    def find_submitted(self, run_dir, intent):
        """What became of a submission that was interrupted after `intent` (a JobRecord without
        job_id) was recorded: ("submitted", job id), ("absent", why: provably never accepted) or
        ("unknown", why: cannot be told now). Asked by jobs.recovery, never guessed."""
        return "unknown", f"a {self.scheduler} submission cannot be looked up again"

    def failure(self, run_dir, jobs):
        """After a waited-for submit: why its jobs failed, or None (a chain stops there)."""
        return None

    def allocation(self, spec, points, run_dir, token=None, concurrent=False, nodelist=None, exclude=None,
                   schedule=None):
        """The drafts of one allocation that runs a study's points in turn on its first nodes
        (`concurrent`: all at once, each on its own nodes; `schedule`: rounds of points at once on
        given nodes, jobs.backends.slurm.script.render_allocation; `nodelist` / `exclude`: the nodes to
        allocate / to leave out, Slurm host lists):
        (the allocation's draft, [each point's draft]); `spec`: the allocation's JobSpec (its
        size and time), `points`: [(point JobSpec, its run dir)]. The allocation's draft is
        submitted with `submit`; the points' scripts are only written (the allocation runs them)."""
        raise RequestError(f"--allocation: a {self.scheduler} profile cannot run a study's points in one "
                           "allocation; run them as separate jobs")

    # --- a submitted run ---
    @abc.abstractmethod
    def poll(self, run_dir, record, source=None):
        """One jobs.runs.records.StatusResult for the run, in toolkit states (jobs.states)."""

    def poll_many(self, items, source=None):
        """[StatusResult] for several (run_dir, RunRecord) of this backend; a backend whose
        queries cost a call each answers them together (Slurm: one call in all)."""
        return [self.poll(run_dir, record, source) for run_dir, record in items]

    @abc.abstractmethod
    def cancel(self, run_dir, jobs):
        """Cancel jobs (JobRecords); raises SlurmCommandError when that failed."""

    def requeue(self, run_dir, jobs, log=None, timeout=None):
        raise RequestError(f"requeue: {self.scheduler} runs are not requeued; submit again")

    def log_files(self, run_dir, key=None, rank=None):
        """Batch outputs of the run, or one rank's outputs, oldest first."""
        logs = os.path.join(run_dir, "logs")
        prefix = f"{key or '*'}-*"
        pattern = f"{prefix}.rank{rank}.log" if rank is not None else f"{prefix}.out"
        return sorted(glob.glob(os.path.join(logs, pattern)), key=os.path.getmtime)


