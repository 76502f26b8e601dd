"""Starting a local job with submitit's LocalExecutor.

submitit starts a detached controller that outlives this command, enforces the time limit and
sends USR2 `signal_seconds` before it (like Slurm's --signal), keeps the job's state and result,
and starts `tasks_per_node` processes with their local ids. When a job of >1 ranks needs an MPI
world (the training engine, the hello payload) the single submitit task runs `mpirun -np N`
instead, because submitit's tasks are plain processes that do not form an MPI communicator.
Either way each rank gets the contract of slurm/bind.sh (RANK, LOCAL_RANK, WORLD_SIZE, ... from
submitit's ids or from Open MPI's), and writes logs/<key>-<tag>.rank<r>.log like a Slurm step.
"""

import os
import signal
import subprocess
import sys

from jobs.planning.argv import EngineLog, RunPath, SlurmHelper, slurm_dir
from jobs.planning.plan import ENGINES, rank_command
from jobs.profiles.binding import bind_env
from jobs.profiles.schema import SHARED_NODES_ENV

from .states import folder

_RANK_SHIM = ('exec "$@" > "$RECSYS_RANK_LOG_PREFIX.rank${OMPI_COMM_WORLD_RANK:-${RANK:-0}}.log" 2>&1')


class LocalJobCommand:
    """The picklable callable a submitit local task runs: one rank (or mpirun of all ranks)."""

    def __init__(self, argv, env, log_prefix, mpi_ranks=0, cwd=None):
        self.argv, self.env, self.log_prefix, self.mpi_ranks = list(argv), dict(env), log_prefix, mpi_ranks
        self.cwd = cwd      # the run dir, as for a Slurm job (never the submitter's cwd)

    def command(self):
        """The argv this task runs: the rank behind its log shim, or mpirun of all ranks."""
        argv = ["bash", "-c", _RANK_SHIM, "recsys-rank"] + self.argv
        if not self.mpi_ranks:
            return argv
        mpirun = ["mpirun", "-np", str(self.mpi_ranks), "--bind-to", "none", "--oversubscribe"]
        if os.geteuid() == 0:
            mpirun.append("--allow-run-as-root")
        return mpirun + argv

    def __call__(self):
        import submitit

        env = dict(os.environ)
        env.update(self.env)
        env["RECSYS_RANK_LOG_PREFIX"] = self.log_prefix
        if self.mpi_ranks:
            # the ranks share this machine (and its cores with their TensorFlow threads): what ranks
            # on shared cores need (Open MPI would spin while a rank waits: a 2-rank run here took 2x
            # the wall time, 12-18 s of system CPU against 2-4 s; tests/mpi_env.py)
            for name, value in SHARED_NODES_ENV.items():
                env.setdefault(name, value)
        else:
            job_env = submitit.JobEnvironment()
            env.update(RANK=str(job_env.global_rank), LOCAL_RANK=str(job_env.local_rank),
                       WORLD_SIZE=str(job_env.num_tasks), LOCAL_WORLD_SIZE=str(job_env.num_tasks),
                       NODE_RANK="0")
        child = subprocess.Popen(self.command(), env=env, start_new_session=True, cwd=self.cwd)

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


def job_env(spec, run_dir, task_index=None):
    """The environment a local job's ranks get on top of this process's."""
    env = {k: str(v) for k, v in (spec.profile.env or {}).items()}
    env.update({k: str(v) for k, v in spec.env.items()})
    if spec.bind:
        env.update(bind_env(spec.profile.node))
    if spec.code_dir:       # a study's frozen code (jobs.study.running.frozen): the engines from the copy, in front
        before = env.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        env["PYTHONPATH"] = spec.code_dir + (os.pathsep + before if before else "")
    env.update(RECSYS_RUN_DIR=run_dir, RECSYS_SLURM_DIR=_helpers(spec), RECSYS_JOB_KEY=spec.key,
               RECSYS_NNODES="1", RECSYS_JOB_PROFILE=spec.profile.name,
               RECSYS_JOB_PROFILE_SHA256=spec.profile.content_sha256())
    if task_index is not None:
        env.update(RECSYS_TASK_INDEX=str(task_index), RECSYS_TASK_COUNT=str(spec.task_count))
    return env


def _helpers(spec):
    """The slurm/ helpers a job runs: its frozen copy's (JobSpec.code_dir), else this checkout's."""
    return os.path.join(spec.code_dir, "slurm") if spec.code_dir else slurm_dir()


def rank_argv(spec, run_dir, log_prefix):
    """The rank argv with our helper paths, the EngineLog and other run-dir paths written out."""
    out = []
    for arg in rank_command(spec):
        if isinstance(arg, EngineLog):
            out.append(f"{log_prefix}{EngineLog.SUFFIX}")
        elif isinstance(arg, RunPath):
            out.append(arg.under(run_dir))
        elif isinstance(arg, SlurmHelper):
            out.append(os.path.join(_helpers(spec), arg.name))
        else:
            out.append(str(arg))
    return out


def uses_mpi(spec):
    """One submitit task running mpirun over the ranks (an MPI engine with >1 rank)."""
    return ENGINES[spec.engine]["mpi"] and spec.ntasks_per_node > 1


def log_prefix(spec, run_dir, pid, task_index=None):
    """logs/<key>-local<pid>[_<task>]: the prefix of a local job's log files (its tag follows the key)."""
    tag_index = "" if task_index is None else f"_{task_index}"
    return os.path.join(run_dir, "logs", f"{spec.key}-local{pid}{tag_index}")


def command(spec, run_dir, task_index=None, pid=None):
    """The LocalJobCommand of one local job (or array task)."""
    prefix = log_prefix(spec, run_dir, os.getpid() if pid is None else pid, task_index)
    mpi = uses_mpi(spec)
    return LocalJobCommand(rank_argv(spec, run_dir, prefix), job_env(spec, run_dir, task_index), prefix,
                           mpi_ranks=spec.ntasks_per_node if mpi else 0, cwd=run_dir)


def launch(spec, run_dir, task_index=None):
    """Start one local job (or one array task) with submitit; returns (submitit job, tag)."""
    import submitit

    mpi = uses_mpi(spec)
    executor = submitit.LocalExecutor(folder=folder(run_dir))
    executor.update_parameters(timeout_min=spec.time_seconds / 60.0, signal_delay_s=spec.signal_seconds,
                               tasks_per_node=1 if mpi else spec.ntasks_per_node, gpus_per_node=spec.gpus_per_node)
    job_command = command(spec, run_dir, task_index)
    job = _submit_detached(executor, job_command, f"{job_command.log_prefix}.controller.log")
    return job, os.path.basename(job_command.log_prefix)[len(spec.key) + 1:]


def _submit_detached(executor, job_command, log_path):
    """executor.submit with fds 1 and 2 pointing at a log file while submitit starts its
    controller, so the controller (which outlives us) never holds our stdout/stderr open."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        return executor.submit(job_command)
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved + [log_fd]:
            os.close(fd)
