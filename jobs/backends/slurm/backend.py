"""SlurmBackend: the Backend of `scheduler: slurm`, through sbatch / squeue / sacct / scancel /
scontrol (jobs.backends.slurm.commands).

Rendering needs only the script module; the client commands, queries and records are imported
by the methods that use them, so `recsys-submit render` (a dry run without checks) loads
nothing else of this package.
"""

import os
from dataclasses import dataclass

from jobs.errors import RequestError
from jobs.runs.atomic import write_text

from ..base import Backend, DryRun, JobDraft
from .script import render


@dataclass(frozen=True)
class SlurmDraft(JobDraft):
    """A job's sbatch script as checked (its `text`, written to `script`) and its unique token,
    `--comment=recsys:<token>` (how a retried sbatch finds out whether it went in)."""

    token: str = ""


class SlurmBackend(Backend):
    """sbatch / squeue / sacct / scancel / scontrol through jobs.backends.slurm.commands."""

    scheduler = "slurm"
    records_intents = True
    unknown_job_hint = "a typo? without accounting, Slurm forgets a job MinJobAge after it ends"

    def max_array_size(self, requests):
        """The cluster's MaxArraySize, asked of Slurm only when the plan has an array."""
        default = super().max_array_size(requests)
        if not any(r.array or r.shards for r in requests):
            return default
        from . import commands

        return commands.max_array_size(default)

    def accounting(self):
        from . import commands

        return commands.accounting_enabled()

    def queued_named(self, name):
        """Every user's jobs of that name in the queue: one squeue call (queries.queued_named)."""
        from . import queries

        return queries.queued_named(name)

    def dry_run(self, specs, run_dir, wait=None, check=True, written=True, token=None):
        """Every script rendered (values sbatch cannot take are refused here, before anything
        exists), each with a fresh token (`token`: one fixed text instead, e.g. `<token>` when
        printing); jobs that wait for jobs of the run show <key> placeholders until submitted."""
        if check and wait is not None:
            flag = "--no-wait" if wait is False else "wait"
            raise RequestError(f"{flag}: Slurm submissions never wait; follow a run with "
                               "`recsys-submit status --watch` (--no-wait is for the local profile)")
        drafts = []
        for spec in specs:
            script = os.path.join(run_dir, f"{spec.key}.sbatch")
            job_token = token or os.urandom(8).hex()
            drafts.append(SlurmDraft(spec=spec, run_dir=run_dir, script=script, token=job_token,
                                     text=render(spec, run_dir, script, token=job_token, written=written)))
        if check:
            self.check_after(specs)
        return DryRun(scheduler=self.scheduler, run_dir=run_dir, wait=False, drafts=tuple(drafts))

    def allocation(self, spec, points, run_dir, token=None, concurrent=False, nodelist=None, exclude=None,
                   schedule=None):
        """Each point's own script (render(..., in_allocation=True): its steps on the node set the
        allocation gives it) and the allocation's script that runs them in turn (`concurrent`: at
        once, each on its own nodes: a node screen), one token."""
        from .script import render_allocation

        token = token or os.urandom(8).hex()
        drafts = []
        for point, point_dir in points:
            script = os.path.join(point_dir, f"{point.key}.sbatch")
            drafts.append(SlurmDraft(spec=point, run_dir=point_dir, script=script, token=token,
                                     text=render(point, point_dir, script, in_allocation=True)))
        script = os.path.join(run_dir, f"{spec.key}.sbatch")
        text = render_allocation(spec, run_dir, [(d.spec, d.run_dir, d.script) for d in drafts], token,
                                 concurrent=concurrent, nodelist=nodelist, exclude=exclude, schedule=schedule)
        return SlurmDraft(spec=spec, run_dir=run_dir, script=script, token=token, text=text), drafts

    def missing_jobs(self, job_ids):
        """One sacct call (accounting: finished jobs too) or one squeue call for all ids."""
        from . import queries

        return queries.missing_jobs(job_ids, self.accounting())

    def submit(self, draft, ids, wait, log=None, on_intent=None):
        import time

        from jobs import faultpoints
        from jobs.runs.records import JobRecord

        from . import commands

        spec = draft.spec
        text = draft.text
        if spec.after_ok or spec.after_any:     # the job ids of the run it waits for are known now
            text = render(spec, draft.run_dir, draft.script, ids=ids, token=draft.token)
        write_text(draft.script, text)
        job = JobRecord(key=spec.key, name=spec.name, job_id=None, array_size=spec.array_size,
                        task_offset=spec.task_offset, ntasks=spec.nodes * spec.ntasks_per_node,
                        script=draft.script, token=draft.token,
                        after_ok=[ids[k] for k in spec.after_ok] + list(spec.external_after),
                        after_any=[ids[k] for k in spec.after_any], submitted_at=round(time.time(), 3))
        if on_intent is not None:
            on_intent(job)
        job.job_id = commands.sbatch(draft.script, draft.token, log=log)
        faultpoints.reached("sbatch-returned")
        return [job]

    def find_submitted(self, run_dir, intent):
        """By the job's token in the queue (one squeue call); else by the batch output a started
        job leaves in logs/ (its name holds the job id); else the job provably never went in when
        the intent is younger than the controller's MinJobAge (an accepted job stays in squeue at
        least that long after it ends); else nothing can be told."""
        from jobs.errors import SlurmCommandError

        from . import commands

        try:
            found = commands.find_by_token(intent.token)
        except SlurmCommandError as exc:
            return "unknown", f"squeue cannot say whether comment recsys:{intent.token} went in ({exc})"
        if found:
            return "submitted", found
        started = commands.job_id_from_logs(run_dir, intent.key)
        if started:
            return "submitted", started
        age = commands.seconds_since(intent.submitted_at)
        min_job_age = commands.min_job_age()
        if age is not None and min_job_age is not None and age < min_job_age:
            return "absent", (f"comment recsys:{intent.token} is not in the queue {age:.0f} s after the "
                              f"submission began (Slurm keeps every job it accepted for MinJobAge "
                              f"{min_job_age} s after its end)")
        return "unknown", (f"comment recsys:{intent.token} is no longer in the queue and no job output is "
                           f"in {os.path.join(run_dir, 'logs')}; it may have been accepted and cancelled "
                           f"while pending")

    def poll(self, run_dir, record, source=None):
        return self.poll_many([(run_dir, record)], source)[0]

    def poll_many(self, items, source=None):
        from .poll import poll_many

        return poll_many(items, source)

    def cancel(self, run_dir, jobs):
        from . import commands

        ids = [j.job_id for j in jobs]
        if ids:
            proc = commands.run(["scancel"] + ids)
            if proc.returncode != 0:
                raise commands.failed("scancel", proc)
        return ids

    def requeue(self, run_dir, jobs, log=None, timeout=None):
        """Checkpoint, then requeue (jobs.backends.slurm.requeue): no trained step lost, and a job
        that ended meanwhile is refused by Slurm rather than run again."""
        from .requeue import requeue_with_checkpoint

        return requeue_with_checkpoint(run_dir, jobs, log=log, timeout=timeout) if jobs else []
