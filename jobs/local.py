"""The local launcher (`--profile local`, scheduler: local): the same plan, no Slurm.

submitit's LocalExecutor runs each job: it starts a detached controller that outlives this
command, enforces the time limit and sends USR2 `signal_seconds` before it (like Slurm's
--signal), keeps the job's state and result, and starts `tasks_per_node` processes with
their local ids. When a job of >1 ranks needs an MPI world (the training engine, the hello
payload) the single submitit task runs `mpirun -np N` instead, because submitit's tasks are
plain processes that do not form an MPI communicator. Either way each rank gets the contract
of slurm/bind.sh (RANK, LOCAL_RANK, WORLD_SIZE, ... from submitit's ids or from Open MPI's),
and writes logs/<key>-<tag>.rank<r>.log like a Slurm step does. Jobs of a chain run one after
another; a failure stops the chain (afterok). LocalBackend is the jobs.backends.Backend of
`scheduler: local`.
"""

import os
import signal
import subprocess
import sys
import time

from .backends import Backend
from .errors import RequestError, SubmitError
from .plan import ENGINES, EngineLog, RunPath, SlurmHelper, slurm_dir
from .records import JobRecord, JobStatus, StatusResult
from .render import rank_command

_RANK_SHIM = ('exec "$@" > "$RECSYS_RANK_LOG_PREFIX.rank${OMPI_COMM_WORLD_RANK:-${RANK:-0}}.log" 2>&1')


class LocalJobCommand:
    """The picklable callable a submitit local task runs: one rank (or mpirun of all ranks)."""

    def __init__(self, argv, env, log_prefix, mpi_ranks=0, cwd=None):
        self.argv, self.env, self.log_prefix, self.mpi_ranks = list(argv), dict(env), log_prefix, mpi_ranks
        self.cwd = cwd      # the run dir, as for a Slurm job (never the submitter's cwd)

    def __call__(self):
        import submitit

        job_env = submitit.JobEnvironment()
        env = dict(os.environ)
        env.update(self.env)
        env["RECSYS_RANK_LOG_PREFIX"] = self.log_prefix
        argv = ["bash", "-c", _RANK_SHIM, "recsys-rank"] + self.argv
        if self.mpi_ranks:
            argv = ["mpirun", "-np", str(self.mpi_ranks), "--bind-to", "none", "--oversubscribe"]
            if os.geteuid() == 0:
                argv.append("--allow-run-as-root")
            argv += ["bash", "-c", _RANK_SHIM, "recsys-rank"] + self.argv
        else:
            env.update(RANK=str(job_env.global_rank), LOCAL_RANK=str(job_env.local_rank),
                       WORLD_SIZE=str(job_env.num_tasks), LOCAL_WORLD_SIZE=str(job_env.num_tasks),
                       NODE_RANK="0")
        child = subprocess.Popen(argv, env=env, start_new_session=True, cwd=self.cwd)

        def forward(signum, frame):
            try:
                os.killpg(child.pid, signum)
            except OSError:
                pass

        for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, forward)
        rc = child.wait()
        print(f"rank command exit code {rc}", flush=True)
        return rc


def _job_env(spec, run_dir, task_index=None):
    from .binding import bind_env

    env = {k: str(v) for k, v in (spec.profile.env or {}).items()}
    env.update({k: str(v) for k, v in spec.env.items()})
    if spec.bind:
        env.update(bind_env(spec.profile.node))
    env.update(RECSYS_RUN_DIR=run_dir, RECSYS_SLURM_DIR=slurm_dir(), RECSYS_JOB_KEY=spec.key,
               RECSYS_NNODES="1")
    if task_index is not None:
        env.update(RECSYS_TASK_INDEX=str(task_index), RECSYS_TASK_COUNT=str(spec.task_count))
    return env


def _argv(spec, run_dir, log_prefix):
    """The rank argv with our helper paths, the EngineLog and other run-dir paths written out."""
    out = []
    for arg in rank_command(spec):
        if isinstance(arg, EngineLog):
            out.append(f"{log_prefix}{EngineLog.SUFFIX}")
        elif isinstance(arg, RunPath):
            out.append(os.path.join(run_dir, arg.relative))
        elif isinstance(arg, SlurmHelper):
            out.append(os.path.join(slurm_dir(), arg.name))
        else:
            out.append(str(arg))
    return out


def _mpi(spec):
    """One submitit task running mpirun over the ranks (an MPI engine with >1 rank)."""
    return ENGINES[spec.engine]["mpi"] and spec.ntasks_per_node > 1


def _folder(run_dir):
    return os.path.join(run_dir, "submitit")


def launch(spec, run_dir, task_index=None):
    """Start one local job (or one array task) with submitit; returns (submitit job, tag)."""
    import submitit

    ranks = spec.ntasks_per_node
    mpi = _mpi(spec)
    executor = submitit.LocalExecutor(folder=_folder(run_dir))
    timeout_min = spec.time_seconds / 60.0
    executor.update_parameters(timeout_min=timeout_min, signal_delay_s=spec.signal_seconds,
                               tasks_per_node=1 if mpi else ranks, gpus_per_node=spec.gpus_per_node)
    tag_index = "" if task_index is None else f"_{task_index}"
    log_prefix = os.path.join(run_dir, "logs", f"{spec.key}-local{os.getpid()}{tag_index}")
    command = LocalJobCommand(_argv(spec, run_dir, log_prefix), _job_env(spec, run_dir, task_index),
                              log_prefix, mpi_ranks=ranks if mpi else 0, cwd=run_dir)
    job = _submit_detached(executor, command, f"{log_prefix}.controller.log")
    return job, os.path.basename(log_prefix)[len(spec.key) + 1:]


def _submit_detached(executor, command, log_path):
    """executor.submit with fds 1 and 2 pointing at a log file while submitit starts its
    controller, so the controller (which outlives us) never holds our stdout/stderr open."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        return executor.submit(command)
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved + [log_fd]:
            os.close(fd)


def _job_state(folder, job_id, ntasks):
    """COMPLETED/FAILED from submitit's result files, RUNNING while the controller lives."""
    from submitit.core.utils import JobPaths

    results = [JobPaths(folder, job_id, t).result_pickle for t in range(ntasks)]
    if all(p.exists() for p in results):
        return _results_state(results)
    try:
        os.kill(int(job_id), 0)
        return "RUNNING"
    except (OSError, ValueError):
        return "CANCELLED"


def _controller_folder(job_id):
    """The submitit folder of a running local job (its controller's pid is the job id), else None."""
    try:
        with open(f"/proc/{int(job_id)}/cmdline", "rb") as handle:
            argv = handle.read().decode(errors="replace").split("\0")
    except (OSError, ValueError):
        return None
    if "submitit.local._local" not in argv:
        return None
    at = argv.index("submitit.local._local")
    return argv[at + 1] if at + 1 < len(argv) else None


def _after_state(folder, job_id):
    """Wait for a local job outside this run to end; COMPLETED when every task of it succeeded."""
    import glob

    from .status import poll_until

    poll_until(lambda: _controller_folder(job_id) == folder, lambda alive: not alive, first=0.2, ceiling=2)
    results = glob.glob(os.path.join(folder, f"{glob.escape(str(job_id))}_*_result.pkl"))
    return _results_state(results) if results else "CANCELLED"


def _results_state(results):
    """COMPLETED when every task's submitit result pickle says success with exit 0, else FAILED."""
    import pickle

    for path in results:
        with open(path, "rb") as handle:
            outcome, value = pickle.load(handle)
        if outcome != "success" or value != 0:
            return "FAILED"
    return "COMPLETED"


def _wait(run_dir, job):
    while _job_state(_folder(run_dir), job.job_id, job.ntasks) == "RUNNING":
        time.sleep(0.2)
    return _job_state(_folder(run_dir), job.job_id, job.ntasks)


class LocalBackend(Backend):
    """This machine: submitit's LocalExecutor per job, mpirun for an MPI world; a chain runs
    in the foreground, one job after another, stopping at the first failure."""

    scheduler = "local"
    foreground = True
    gpuless_ranks = True
    max_nodes = 1

    unknown_job_hint = "a local job id is the pid of a running local job (one started with --no-wait)"

    def missing_jobs(self, job_ids):
        """Local jobs are the submitit controllers of this machine: an id is known while its
        controller runs (a finished one leaves no trace outside its run dir)."""
        return [str(i) for i in job_ids if _controller_folder(i) is None]

    def check(self, specs, run_dir, wait):
        for spec in specs:
            if spec.nodes > self.max_nodes:
                raise RequestError(f"--nodes: the local profile runs on one node, not {spec.nodes}")
        self.check_after(specs)
        self._after_folders = {i: _controller_folder(i) for spec in specs for i in spec.external_after}
        wait = self.foreground if wait is None else bool(wait)
        if not wait and len(specs) > 1:
            raise RequestError("--no-wait: the local profile runs chains and split arrays only "
                               "in the foreground")
        return wait

    def submit(self, spec, run_dir, ids, wait, log=None):
        for job_id in spec.external_after:      # afterok on running local jobs (--after)
            folder = getattr(self, "_after_folders", {}).get(job_id) or _controller_folder(job_id)
            if folder is None or _after_state(folder, job_id) != "COMPLETED":
                raise SubmitError(f"--after {job_id}: that local job did not complete, so {spec.key!r} "
                                  "never starts (afterok)")
        tasks = [None] if not spec.array else [spec.task_offset + i for i in range(spec.array_size)]
        jobs = []
        for task_index in tasks:
            job, _tag = launch(spec, run_dir, task_index)
            record = JobRecord(key=spec.key, name=spec.name, job_id=str(job.job_id), task_index=task_index,
                               ntasks=1 if _mpi(spec) else spec.ntasks_per_node)
            jobs.append(record)
            if log:
                log(f"local job {spec.key} (pid {job.job_id}) started; logs in {run_dir}/logs")
            if wait and _wait(run_dir, record) != "COMPLETED":
                break       # afterok: later array tasks and jobs do not start
        return jobs

    def failure(self, run_dir, jobs):
        for job in jobs:
            if _wait(run_dir, job) != "COMPLETED":
                return f"local job {job.key!r} failed; later jobs of the chain were not started"
        return None

    def poll(self, run_dir, record, source=None):
        out = []
        for job in record.jobs:
            state = _job_state(_folder(run_dir), job.job_id, job.ntasks)
            if state != "RUNNING" and os.path.exists(os.path.join(run_dir, f"cancelled-{job.job_id}")):
                state = "CANCELLED"
            out.append(JobStatus(key=job.key, job_id=job.job_id, name=job.name, state=state,
                                 tasks={job.job_id: state}))
        done = all(j.state != "RUNNING" for j in out)
        return StatusResult(run_dir=run_dir, jobs=out, done=done, calls=0, source="local",
                            submission=record.state)

    def cancel(self, run_dir, jobs):
        """SIGTERM to each controller: submitit forwards it to the tasks, which pass it on to the
        ranks' process group; a marker makes status say CANCELLED rather than FAILED."""
        for job in jobs:
            if _job_state(_folder(run_dir), job.job_id, job.ntasks) != "RUNNING":
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
            import glob

            pattern = os.path.join(run_dir, "logs", f"{key or '*'}-*.rank*.log")
            found = sorted(glob.glob(pattern), key=os.path.getmtime)
        return found
