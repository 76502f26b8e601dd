"""LocalBackend: the Backend of `scheduler: local`. Jobs of a chain run one after another on
this machine (jobs.backends.local.launch); a failure stops the chain (afterok)."""

import glob
import os
import shlex
import signal
from dataclasses import dataclass, field
from typing import Dict, Optional

from jobs import states
from jobs.errors import RequestError, SubmitError
from jobs.runs.records import JobRecord, JobStatus, StatusResult
from jobs.slurmtime import format_time

from ..base import Backend, DryRun, JobDraft
from . import launch
from .states import after_state, controller_folder, folder, job_state, wait_for


@dataclass(frozen=True)
class LocalDraft(JobDraft):
    """A local job as it will start: `after_folders` maps each --after id to the submitit folder of
    that running local job (looked up when checked, so its end can be waited for)."""

    after_folders: Dict[str, Optional[str]] = field(default_factory=dict)


def _describe(spec, run_dir):
    """What a local job runs, readable: its ranks' environment and command (the pid in its log
    names is only known when it starts)."""
    job_command = launch.command(spec, run_dir, pid="<pid>")
    ranks = spec.ntasks_per_node
    how = f"mpirun -np {ranks}" if job_command.mpi_ranks else f"{ranks} submitit task(s)"
    lines = [f"# local job {spec.key} ({spec.kind} {spec.subject}): {ranks} rank(s) via {how}, "
             f"time limit {format_time(spec.time_seconds)}, USR2 {spec.signal_seconds} s before",
             f"# run dir {run_dir}; each rank's output in {job_command.log_prefix}.rank<r>.log"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(job_command.env.items())]
    lines.append(" ".join(shlex.quote(a) for a in job_command.command()))
    return "\n".join(lines) + "\n"


class LocalBackend(Backend):
    """This machine: submitit's LocalExecutor per job, mpirun for an MPI world; a chain runs
    in the foreground, one job after another, stopping at the first failure."""

    scheduler = "local"
    unknown_job_hint = "a local job id is the pid of a running local job (one started with --no-wait)"

    def missing_jobs(self, job_ids):
        """Local jobs are the submitit controllers of this machine: an id is known while its
        controller runs (a finished one leaves no trace outside its run dir)."""
        return [str(i) for i in job_ids if controller_folder(i) is None]

    def dry_run(self, specs, run_dir, wait=None, check=True, written=True, token=None):
        limit = self.capabilities.max_nodes
        wait = self.capabilities.foreground if wait is None else bool(wait)
        if check:
            for spec in specs:
                if spec.nodes > limit:
                    raise RequestError(f"--nodes: the local profile runs on one node, not {spec.nodes}")
            self.check_after(specs)
            if not wait and len(specs) > 1:
                raise RequestError("--no-wait: the local profile runs chains and split arrays only "
                                   "in the foreground")
        drafts = tuple(LocalDraft(spec=spec, run_dir=run_dir, text=_describe(spec, run_dir),
                                  after_folders={i: controller_folder(i) for i in spec.external_after})
                       for spec in specs)
        return DryRun(scheduler=self.scheduler, run_dir=run_dir, wait=wait, drafts=drafts)

    def submit(self, draft, ids, wait, log=None, on_intent=None):
        spec, run_dir = draft.spec, draft.run_dir
        for job_id in spec.external_after:      # afterok on running local jobs (--after)
            submitit_folder = draft.after_folders.get(job_id) or controller_folder(job_id)
            if submitit_folder is None or after_state(submitit_folder, job_id) != states.COMPLETED:
                raise SubmitError(f"--after {job_id}: that local job did not complete, so {spec.key!r} "
                                  "never starts (afterok)")
        tasks = [None] if not spec.array else [spec.task_offset + i for i in range(spec.array_size)]
        jobs = []
        for task_index in tasks:
            job, _tag = launch.launch(spec, run_dir, task_index)
            record = JobRecord(key=spec.key, name=spec.name, job_id=str(job.job_id), task_index=task_index,
                               ntasks=1 if launch.uses_mpi(spec) else spec.ntasks_per_node)
            jobs.append(record)
            if log:
                log(f"local job {spec.key} (pid {job.job_id}) started; logs in {run_dir}/logs")
            if wait and wait_for(run_dir, record, progress=log) != states.COMPLETED:
                break       # afterok: later array tasks and jobs do not start
        return jobs

    def failure(self, run_dir, jobs):
        for job in jobs:
            if wait_for(run_dir, job) != states.COMPLETED:
                return f"local job {job.key!r} failed; later jobs of the chain were not started"
        return None

    def poll(self, run_dir, record, source=None):
        out = []
        for job in record.jobs:
            state = job_state(folder(run_dir), job.job_id, job.ntasks)
            if state != states.RUNNING and os.path.exists(os.path.join(run_dir, f"cancelled-{job.job_id}")):
                state = states.CANCELLED
            out.append(JobStatus(key=job.key, job_id=job.job_id, name=job.name, state=state,
                                 tasks={job.job_id: state}))
        done = all(j.state != states.RUNNING for j in out)
        return StatusResult(run_dir=run_dir, jobs=out, done=done, calls=0, source="local",
                            submission=record.state)

    def cancel(self, run_dir, jobs):
        """SIGTERM to each controller: submitit forwards it to the tasks, which pass it on to the
        ranks' process group; a marker makes status say CANCELLED rather than FAILED."""
        for job in jobs:
            if job_state(folder(run_dir), job.job_id, job.ntasks) != states.RUNNING:
                continue
            open(os.path.join(run_dir, f"cancelled-{job.job_id}"), "w").close()
            try:
                os.kill(int(job.job_id), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        return [j.job_id for j in jobs]

    def log_files(self, run_dir, key=None, rank=None):
        """Local runs have no batch output: the ranks' logs stand in for it."""
        found = super().log_files(run_dir, key, rank)
        if not found and rank is None:
            pattern = os.path.join(run_dir, "logs", f"{key or '*'}-*.rank*.log")
            found = sorted(glob.glob(pattern), key=os.path.getmtime)
        return found
