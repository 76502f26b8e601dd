#!/usr/bin/env bash
# A dask cluster inside a Slurm allocation, for the life of one driver command (NVTabular).
#
#   dask-cluster.sh [options] -- driver command...
#
# Runs in the batch script (on the first node of the allocation), as spark-standalone.sh does
# for Spark:
#   1. starts a dask scheduler here on a free port; it writes its address to a scheduler
#      file in the log dir (on the shared file system, so every node can read it);
#   2. starts one worker per node with `srun --ntasks-per-node=1` in the background:
#      `dask-cuda-worker` (one worker process per GPU) with --gpus-per-node G > 0, else a
#      CPU `dask worker` with one thread per core; waits until all nodes registered;
#   3. exports RECSYS_DASK_SCHEDULER_FILE and RECSYS_DASK_GPUS (preproc.runtime.dask_cluster connects
#      to that scheduler) and runs the driver;
#   4. ALWAYS stops the workers and the scheduler: a trap on EXIT, TERM, INT and USR2.
# Exit status: the driver's; 128+N when killed by signal N.
# In a job whose profile has a container (RECSYS_CONTAINER_SRUN_FLAGS set by the rendered script),
# every process above runs in it: the workers' srun gets the flags, and what runs on this node
# goes through "${here[@]}" (allocation-cluster.sh, docs/submitting.md "Containers").
#
# Options (environment variable in brackets):
#   --worker-cores N      [DASK_WORKER_CORES]      threads each CPU worker runs (default: the node's)
#   --node-memory-gb G    [DASK_NODE_MEMORY_GB]    memory the node's workers share, GiB (default 85 %
#                         of the allocation's); each worker process gets G / workers (one per GPU,
#                         else 1) as its --memory-limit: distributed applies that limit to every
#                         worker process (only "auto" is divided by their number), so a node
#                         value given to 8 workers would let each grow to it before spilling
#   --worker-memory-gb G  [DASK_WORKER_MEMORY_GB]  memory limit of EACH worker process, GiB
#                         (overrides the share above)
#   --rmm-pool-size S     [RECSYS_DASK_RMM_POOL_SIZE]  dask-cuda workers: an RMM pool of S per GPU
#                         (e.g. 60GB or 0.8, a fraction of the GPU's memory), none by default
#   --gpus-per-node G     [RECSYS_DASK_GPUS]       GPUs per node: dask-cuda workers (CPU workers
#                         when cudf/dask-cuda do not import, as Spark runs a CPU plan without RAPIDS)
#   --log-dir D           [RECSYS_DASK_LOG_DIR]    scheduler/worker logs and the scheduler file
#                         (default $RECSYS_RUN_DIR/logs/dask-<job>, else ./dask-<job>)
#   --local-directory D   [DASK_LOCAL_DIRECTORY]   where every worker spills (node-local disk;
#                         recsys-submit passes the profile's scratch), default ${TMPDIR:-/tmp}
#   --timeout S           [RECSYS_CLUSTER_START_SECONDS]  seconds to wait for the scheduler and the
#                         workers (120; recsys-submit passes the profile's
#                         defaults.cluster_start_seconds). With a container, the job's container is
#                         first created on every node, which this does not count.
set -euo pipefail

die() { echo "dask-cluster: error: $*" >&2; exit 2; }
say() { echo "dask-cluster: $*" >&2; }
# shellcheck source=allocation-cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/allocation-cluster.sh"

PY=${RECSYS_PYTHON:-python3}
WORKER_CORES=${DASK_WORKER_CORES:-}
WORKER_MEM_GB=${DASK_WORKER_MEMORY_GB:-}
NODE_MEM_GB=${DASK_NODE_MEMORY_GB:-}
RMM_POOL=${RECSYS_DASK_RMM_POOL_SIZE:-}
GPUS=${RECSYS_DASK_GPUS:-0}
LOG_DIR=${RECSYS_DASK_LOG_DIR:-}
LOCAL_DIR=${DASK_LOCAL_DIRECTORY:-${TMPDIR:-/tmp}}
TIMEOUT=${RECSYS_CLUSTER_START_SECONDS:-120}
while [ $# -gt 0 ]; do
  case "$1" in
    --worker-cores) WORKER_CORES=$2; shift 2 ;;
    --worker-memory-gb) WORKER_MEM_GB=$2; shift 2 ;;
    --node-memory-gb) NODE_MEM_GB=$2; shift 2 ;;
    --rmm-pool-size) RMM_POOL=$2; shift 2 ;;
    --gpus-per-node) GPUS=$2; shift 2 ;;
    --log-dir) LOG_DIR=$2; shift 2 ;;
    --local-directory) LOCAL_DIR=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (usage: dask-cluster.sh [options] -- command...)" ;;
  esac
done
[ $# -gt 0 ] || die "no driver command after --"
[ -n "${SLURM_JOB_ID:-}" ] || die "not inside a Slurm allocation (SLURM_JOB_ID unset)"
[ -z "$RMM_POOL" ] || [[ $RMM_POOL =~ ^[0-9]+(\.[0-9]+)?([KMGT]i?B?)?$ ]] \
  || die "--rmm-pool-size: '$RMM_POOL' is not a size (e.g. 60GB) or a fraction (e.g. 0.8)"
for v in WORKER_CORES WORKER_MEM_GB NODE_MEM_GB GPUS TIMEOUT; do
  [ -z "${!v}" ] || [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a whole number, got '${!v}'"
done
NODES=$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | wc -l)
containers_on_all_nodes "$NODES"
"${here[@]}" "$PY" -c 'import distributed' 2>/dev/null \
  || die "$PY cannot import distributed (pip install .[nvtabular]; set RECSYS_PYTHON to the environment's python)"

if [ "$GPUS" -gt 0 ] && ! "${here[@]}" "$PY" -c 'import cudf, dask_cuda' 2>/dev/null; then
  say "$GPUS GPU(s) per node but cudf/dask-cuda do not import: CPU workers (pandas), as Spark without RAPIDS"
  GPUS=0
fi
JOB_TAG=${SLURM_JOB_ID}${SLURM_ARRAY_TASK_ID:+_${SLURM_ARRAY_TASK_ID}}
if [ -z "$LOG_DIR" ]; then
  if [ -n "${RECSYS_RUN_DIR:-}" ]; then LOG_DIR=$RECSYS_RUN_DIR/logs/dask-$JOB_TAG; else LOG_DIR=$PWD/dask-$JOB_TAG; fi
fi
mkdir -p "$LOG_DIR"
SCHEDULER_FILE=$LOG_DIR/scheduler.json
rm -f "$SCHEDULER_FILE"
if [ -z "$WORKER_CORES" ]; then WORKER_CORES=${SLURM_CPUS_ON_NODE:-$(nproc)}; fi
if [ -z "$NODE_MEM_GB" ]; then NODE_MEM_GB=$(default_worker_memory_gb); fi
# distributed's --memory-limit is per worker process: the node's share split over its workers
WORKERS_PER_NODE=$(( GPUS > 0 ? GPUS : 1 ))
if [ -z "$WORKER_MEM_GB" ]; then
  WORKER_MEM_GB=$(( NODE_MEM_GB / WORKERS_PER_NODE ))
  [ "$WORKER_MEM_GB" -ge 1 ] || WORKER_MEM_GB=1
fi
[ -z "$RMM_POOL" ] || [ "$GPUS" -gt 0 ] || { say "--rmm-pool-size $RMM_POOL ignored: CPU workers"; RMM_POOL=""; }
HOST=${DASK_SCHEDULER_HOST:-$(hostname)}

scheduler_pid="" workers_pid="" driver_pid=""
cluster_pids() { echo $driver_pid $workers_pid $scheduler_pid; }
cluster_summary() { echo "scheduler file $SCHEDULER_FILE, $NODES worker node(s)"; }
trap_stop_signals

say "scheduler on $HOST, $NODES node(s) x $WORKER_CORES cores, GPUs/node $GPUS, $WORKERS_PER_NODE worker(s)/node x ${WORKER_MEM_GB}g${RMM_POOL:+ (RMM pool $RMM_POOL/GPU)}, spilling to $LOCAL_DIR, logs in $LOG_DIR"
"${here[@]}" "$PY" -m distributed.cli.dask_scheduler --host "$HOST" --port 0 --dashboard-address :0 --no-show \
  --scheduler-file "$SCHEDULER_FILE" > "$LOG_DIR/scheduler.log" 2>&1 &
scheduler_pid=$!
deadline=$((SECONDS + TIMEOUT))
until [ -s "$SCHEDULER_FILE" ]; do
  kill -0 "$scheduler_pid" 2>/dev/null || die "dask scheduler exited; see $LOG_DIR/scheduler.log"
  [ $SECONDS -lt $deadline ] || die "dask scheduler not up after ${TIMEOUT}s; see $LOG_DIR/scheduler.log"
  sleep 0.5
done

# One worker (process) per node; dask-cuda-worker starts one process per visible GPU itself
# (next to $PY when that is a path, else from PATH: a bare `python3` in a container).
if [ "$GPUS" -gt 0 ]; then
  worker=("$([[ $PY != */* ]] || echo "${PY%/*}/")dask-cuda-worker" --scheduler-file "$SCHEDULER_FILE"
          --memory-limit "${WORKER_MEM_GB}GiB" --dashboard-address :0 --local-directory "$LOCAL_DIR")
  [ -z "$RMM_POOL" ] || worker+=(--rmm-pool-size "$RMM_POOL")
else
  worker=("$PY" -m distributed.cli.dask_worker --scheduler-file "$SCHEDULER_FILE" --nworkers 1
          --nthreads "$WORKER_CORES" --memory-limit "${WORKER_MEM_GB}GiB" --dashboard-address :0
          --local-directory "$LOCAL_DIR")
fi
srun --nodes="$NODES" --ntasks="$NODES" --ntasks-per-node=1 --overlap --kill-on-bad-exit=0 \
  --output="$LOG_DIR/worker-%t.log" ${container[@]+"${container[@]}"} ${entry[@]+"${entry[@]}"} "${worker[@]}" &
workers_pid=$!
"${here[@]}" "$PY" - "$SCHEDULER_FILE" "$NODES" "$TIMEOUT" <<'EOF' || die "workers did not register; see $LOG_DIR/worker-*.log"
import sys
from distributed import Client
with Client(scheduler_file=sys.argv[1], timeout="60s") as client:
    client.wait_for_workers(int(sys.argv[2]), timeout=float(sys.argv[3]))
    hosts = sorted({w["host"] for w in client.scheduler_info()["workers"].values()})
    print(f"dask-cluster: {len(client.scheduler_info()['workers'])} worker(s) on {', '.join(hosts)}", file=sys.stderr)
EOF

export RECSYS_DASK_SCHEDULER_FILE=$SCHEDULER_FILE RECSYS_DASK_GPUS=$GPUS RECSYS_DASK_NODES=$NODES
# The driver runs in the background so that the traps fire at once on a signal.
"${here[@]}" "$@" &
driver_pid=$!
set +e
wait "$driver_pid"
status=$?
set -e
driver_pid=""
say "driver exited with status $status"
stop_cluster "$status"
