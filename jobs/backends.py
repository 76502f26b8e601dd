"""Where jobs run: one Backend interface, one implementation per profile `scheduler`.

Like submitit's Executor subclasses, a backend knows how to submit one planned job and how to
poll, cancel, requeue and find the logs of what it submitted; everything else (planning, the
run directory, request.json, jobs.json, breaking a chain cleanly) is the orchestrator's, in
jobs.submit, and the same for every backend. The profile's `scheduler` picks the class through
REGISTRY, the only place that maps names to backends. Implementations are imported lazily so
that `recsys-submit --help` and `render` stay cheap.
"""

import abc
import importlib
import os
from .errors import RequestError

# scheduler name -> (module, class); the profile schema's `scheduler` choices come from here
REGISTRY = {
    "slurm": ("jobs.backends", "SlurmBackend"),
    "local": ("jobs.local", "LocalBackend"),
}
SCHEDULERS = tuple(REGISTRY)


def backend_class(scheduler):
    """The Backend subclass of a scheduler name (one registry lookup)."""
    try:
        module, name = REGISTRY[scheduler]
    except KeyError:
        raise RequestError(f"scheduler: unknown scheduler {scheduler!r} "
                           f"(choose from {', '.join(SCHEDULERS)})") from None
    return getattr(importlib.import_module(module), name)


def backend_for(profile):
    """A backend instance for a loaded Profile."""
    return backend_class(profile.scheduler)(profile)


class Backend(abc.ABC):
    """Submit, poll, cancel, requeue and list the logs of the jobs of one run."""

    scheduler = ""
    foreground = False      # submit() runs each job to its end by default (no queue to leave it in)
    gpuless_ranks = False   # on a GPU-less node, --gpus-per-node counts CPU ranks
    max_nodes = None        # most nodes one job can span (None: as many as the profile has)

    def __init__(self, profile=None):
        self.profile = profile      # None when reading back a run (poll, cancel, ...)

    # --- submission (called by jobs.submit in this order) ---
    def max_array_size(self, requests):
        """Largest array the plan may use."""
        return int(self.profile.max_array_size or 1001)

    def accounting(self):
        """Whether status can ask an accounting database (recorded in jobs.json)."""
        return False

    @abc.abstractmethod
    def check(self, specs, run_dir, wait):
        """Refuse (RequestError) what this backend cannot run, before the run dir exists.
        `wait` is the caller's choice (None: the backend's default); returns the effective one."""

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
    def submit(self, spec, run_dir, ids, wait, log=None):
        """Submit one JobSpec; `ids` maps earlier keys to job ids. Returns [JobRecord].
        Raises SubmitError/SlurmCommandError when it could not."""

    def failure(self, run_dir, jobs):
        """After a waited-for submit: why its jobs failed, or None (a chain stops there)."""
        return None

    # --- a submitted run ---
    @abc.abstractmethod
    def poll(self, run_dir, record, source=None):
        """One jobs.records.StatusResult for the run."""

    def poll_many(self, items, source=None):
        """[StatusResult] for several (run_dir, RunRecord) of this backend; a backend whose
        queries cost a call each answers them together (Slurm: one call in all)."""
        return [self.poll(run_dir, record, source) for run_dir, record in items]

    @abc.abstractmethod
    def cancel(self, run_dir, jobs):
        """Cancel jobs (JobRecords); raises SlurmCommandError when that failed."""

    def requeue(self, run_dir, jobs):
        raise RequestError(f"requeue: {self.scheduler} runs are not requeued; submit again")

    def log_files(self, run_dir, key=None, rank=None):
        """Batch outputs of the run, or one rank's outputs, oldest first."""
        import glob

        logs = os.path.join(run_dir, "logs")
        prefix = f"{key or '*'}-*"
        pattern = f"{prefix}.rank{rank}.log" if rank is not None else f"{prefix}.out"
        return sorted(glob.glob(os.path.join(logs, pattern)), key=os.path.getmtime)


class SlurmBackend(Backend):
    """sbatch / squeue / sacct / scancel / scontrol through jobs.slurmcli."""

    scheduler = "slurm"

    def __init__(self, profile=None):
        super().__init__(profile)
        self._checked = {}      # (run dir, key) -> (token, script text) rendered by check()

    def max_array_size(self, requests):
        """The cluster's MaxArraySize, asked of Slurm only when the plan has an array."""
        from . import slurmcli

        default = super().max_array_size(requests)
        if not any(r.array or r.shards for r in requests):
            return default
        return slurmcli.max_array_size(default)

    def accounting(self):
        from . import slurmcli

        return slurmcli.accounting_enabled()

    def check(self, specs, run_dir, wait):
        if wait is not None:
            flag = "--no-wait" if wait is False else "wait"
            raise RequestError(f"{flag}: Slurm submissions never wait; follow a run with "
                               "`recsys-submit status --watch` (--no-wait is for the local profile)")
        from .render import render

        for spec in specs:      # every value sbatch must take, checked before anything exists
            token = os.urandom(8).hex()
            text = render(spec, run_dir, os.path.join(run_dir, f"{spec.key}.sbatch"), token=token)
            if not (spec.after_ok or spec.after_any):   # no job id of this run to fill in: final
                self._checked[(run_dir, spec.key)] = (token, text)
        self.check_after(specs)
        return False

    unknown_job_hint = "a typo? without accounting, Slurm forgets a job MinJobAge after it ends"

    def missing_jobs(self, job_ids):
        """One sacct call (accounting: finished jobs too) or one squeue call for all ids."""
        from . import slurmcli
        from .status import _expand

        ids = [str(i) for i in job_ids]
        if self.accounting():
            proc = slurmcli.run(["sacct", "-X", "-n", "--parsable2", "-o", "JobID", "-j", ",".join(ids)],
                                timeout=60)
            if proc.returncode != 0:
                raise slurmcli.SlurmCommandError(f"sacct: {slurmcli.first_line(proc.stderr)}")
        else:
            proc = slurmcli.run(["squeue", "-h", "-r", "--states=all", "-o", "%i", "-j", ",".join(ids)], timeout=60)
            if proc.returncode != 0:
                if "invalid job id" in (proc.stderr or "").lower():
                    return ids      # squeue says so only when it knows none of them
                raise slurmcli.SlurmCommandError(f"squeue: {slurmcli.first_line(proc.stderr)}")
        known = set()
        for line in proc.stdout.split():
            for task in _expand(line.strip()):
                known.update((task, task.split("_")[0]))    # a task, and its array as a whole
        return [i for i in ids if i not in known]

    def submit(self, spec, run_dir, ids, wait, log=None):
        from . import slurmcli
        from .records import JobRecord
        from .render import render
        from .runs import write_text

        script = os.path.join(run_dir, f"{spec.key}.sbatch")
        checked = self._checked.pop((run_dir, spec.key), None)
        if checked is not None:     # the script check() rendered is the one submitted
            token, text = checked
        else:
            token = os.urandom(8).hex()
            text = render(spec, run_dir, script, ids=ids, token=token)
        write_text(script, text)
        job_id = slurmcli.sbatch(script, token, log=log)
        return [JobRecord(key=spec.key, name=spec.name, job_id=job_id, array_size=spec.array_size,
                          task_offset=spec.task_offset, ntasks=spec.nodes * spec.ntasks_per_node,
                          script=script, token=token,
                          after_ok=[ids[k] for k in spec.after_ok] + list(spec.external_after),
                          after_any=[ids[k] for k in spec.after_any])]

    def poll(self, run_dir, record, source=None):
        from .status import poll_slurm

        return poll_slurm(run_dir, record, source)

    def poll_many(self, items, source=None):
        from .status import poll_slurm_many

        return poll_slurm_many(items, source)

    def cancel(self, run_dir, jobs):
        from . import slurmcli

        ids = [j.job_id for j in jobs]
        if ids:
            proc = slurmcli.run(["scancel"] + ids)
            if proc.returncode != 0:
                raise slurmcli.SlurmCommandError(f"scancel: {slurmcli.first_line(proc.stderr)}")
        return ids

    def requeue(self, run_dir, jobs):
        from . import slurmcli

        ids = [j.job_id for j in jobs]
        if ids:
            proc = slurmcli.run(["scontrol", "requeue", ",".join(ids)])
            if proc.returncode != 0:
                raise slurmcli.SlurmCommandError(f"scontrol requeue: {slurmcli.first_line(proc.stderr)}")
            cache = os.path.join(run_dir, "status.json")
            if os.path.exists(cache):
                os.remove(cache)
        return ids

