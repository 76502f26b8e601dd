"""Built-in smoke payload: `python -m jobs.hello` (also `--payload hello` / `--model hello`).

Each rank prints one line `HELLO {json}` with what the launch gave it: MPI rank and size (from
mpi4py when started under MPI: srun --mpi=pmix or mpirun), the environment contract (RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, NODE_RANK), host, CPU affinity, allowed memory nodes,
CUDA_VISIBLE_DEVICES and the NIC; under MPI it also checks an allreduce. Options make it a
useful test job: --sleep, --fail, and USR2 handling like the training engine (exit 0 after
"checkpoint saved on signal").
"""

import argparse
import json
import os
import signal
import socket
import sys
import time

_MPI_ENV = ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE")


def _first_env(*names):
    for name in names:
        if os.environ.get(name, "") != "":
            return os.environ[name]
    return None


def _mems_allowed():
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("Mems_allowed_list:"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _as_int(value):
    return None if value is None else int(value)


def report(use_mpi=None):
    """The dict one rank prints."""
    if use_mpi is None:
        use_mpi = any(os.environ.get(n) for n in _MPI_ENV)
    info = {"mpi": False}
    if use_mpi:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        rank, size = comm.Get_rank(), comm.Get_size()
        total = comm.allreduce(rank, op=MPI.SUM)
        info.update(mpi=True, mpi_rank=rank, mpi_size=size,
                    allreduce_ok=(total == size * (size - 1) // 2))
    info.update(
        rank=_as_int(_first_env("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK")),
        world_size=_as_int(_first_env("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")),
        local_rank=_as_int(_first_env("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK")),
        local_world_size=_as_int(_first_env("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE",
                                            "OMPI_COMM_WORLD_LOCAL_SIZE")),
        node_rank=_as_int(_first_env("NODE_RANK", "SLURM_NODEID")),
        host=os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
        cpus=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        mems=_mems_allowed(),
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        nic=os.environ.get("UCX_NET_DEVICES"),
        task_index=_as_int(os.environ.get("RECSYS_TASK_INDEX")),
        job_id=os.environ.get("SLURM_JOB_ID"),
        pid=os.getpid(),
    )
    return info


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m jobs.hello", description=__doc__.splitlines()[0])
    parser.add_argument("--kind", default="benchmark", help="job kind it stands in for (echoed)")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to stay alive after reporting")
    parser.add_argument("--fail", action="store_true", help="exit 1 after reporting (dependency tests)")
    parser.add_argument("--no-mpi", action="store_true", help="do not initialise MPI even under a launcher")
    args, unknown = parser.parse_known_args(argv)

    def on_usr2(signum, frame):
        print("checkpoint saved on signal", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGUSR2, on_usr2)
    info = report(use_mpi=False if args.no_mpi else None)
    info.update(kind=args.kind, start=time.time(), extra_args=unknown)
    print("HELLO " + json.dumps(info, sort_keys=True), flush=True)
    deadline = time.time() + args.sleep
    while time.time() < deadline:
        time.sleep(min(0.2, max(0.0, deadline - time.time())))
    print(f"BYE rank={info['rank']} end={time.time():.3f}", flush=True)
    return 1 if args.fail else 0


if __name__ == "__main__":
    sys.exit(main())
