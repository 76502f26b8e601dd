#!/usr/bin/env bash
# A standalone Spark cluster inside a Slurm allocation, for the life of one driver command.
#
#   spark-standalone.sh [options] -- driver command...
#
# Runs in the batch script (on the first node of the allocation):
#   1. starts a Spark master here (org.apache.spark.deploy.master.Master from the
#      pyspark package, via its bin/spark-class), on a free port chosen per job, so
#      several jobs on one host never clash;
#   2. starts one worker per node with `srun --ntasks-per-node=1` in the background
#      (cores/memory from the flags, else the allocation: SLURM_CPUS_ON_NODE and
#      85 % of SLURM_MEM_PER_NODE, else the node), and waits until all registered;
#   3. exports SPARK_MASTER_URL, RECSYS_SPARK_NODES, RECSYS_SPARK_WORKER_CORES,
#      RECSYS_SPARK_WORKER_MEMORY_GB (preproc.runtime.spark sizes executors from them)
#      and runs the driver;
#   4. ALWAYS stops the workers and the master: a trap on EXIT, TERM, INT and USR2
#      (Slurm's pre-timeout signal, scancel) ends the driver, the worker step and
#      the master, and waits for them.
# Exit status: the driver's; 128+N when killed by signal N.
# In a job whose profile has a container (RECSYS_CONTAINER_SRUN_FLAGS set by the rendered script),
# every process above runs in it: the workers' srun gets the flags, and what runs on this node
# goes through "${here[@]}" (allocation-cluster.sh, docs/submitting.md "Containers").
#
# Options (environment variable in brackets):
#   --worker-cores N      [SPARK_WORKER_CORES]      cores each worker offers
#   --worker-memory-gb G  [SPARK_WORKER_MEMORY_GB]  memory each worker offers, GiB
#   --gpus-per-node G     [RECSYS_SPARK_GPUS]       GPUs each worker offers (RAPIDS): the worker's
#                         spark.worker.resource.gpu.amount and discovery script
#                         (preproc/runtime/gpu-discovery.sh); the driver asks one GPU per
#                         executor and 1/executor-cores per task (slurm/common/spark_layout.py).
#                         Also the way to run RAPIDS on ONE node: Spark's local mode
#                         schedules no GPUs, so recsys-submit starts this script with 1 node.
#   --local-dirs D        [SPARK_LOCAL_DIRS]        node-local shuffle scratch
#   --log-dir D           [RECSYS_SPARK_LOG_DIR]    master/worker logs (default
#                         $RECSYS_RUN_DIR/logs/spark-<job>, else ./spark-<job>)
#   --master-port P       [SPARK_MASTER_PORT]       default: a free port
#   --timeout S           [RECSYS_CLUSTER_START_SECONDS]  seconds to wait for the master and the
#                         workers (120; recsys-submit passes the profile's
#                         defaults.cluster_start_seconds). With a container, the job's container is
#                         first created on every node, which this does not count.
set -euo pipefail

die() { echo "spark-standalone: error: $*" >&2; exit 2; }
say() { echo "spark-standalone: $*" >&2; }
# shellcheck source=allocation-cluster.sh
source "$(dirname "${BASH_SOURCE[0]}")/allocation-cluster.sh"
# In a container, the Spark variables set here win over the image's (the RECSYS_* ones no image sets).
container_env SPARK_HOME SPARK_MASTER_URL SPARK_LOG_DIR SPARK_NO_DAEMONIZE SPARK_LOCAL_DIRS SPARK_WORKER_OPTS

PY=${RECSYS_PYTHON:-${PYSPARK_PYTHON:-python3}}
WORKER_CORES=${SPARK_WORKER_CORES:-}
WORKER_MEM_GB=${SPARK_WORKER_MEMORY_GB:-}
GPUS=${RECSYS_SPARK_GPUS:-0}
LOCAL_DIRS=${SPARK_LOCAL_DIRS:-}
LOG_DIR=${RECSYS_SPARK_LOG_DIR:-}
MASTER_PORT=${SPARK_MASTER_PORT:-}
TIMEOUT=${RECSYS_CLUSTER_START_SECONDS:-120}
while [ $# -gt 0 ]; do
  case "$1" in
    --worker-cores) WORKER_CORES=$2; shift 2 ;;
    --worker-memory-gb) WORKER_MEM_GB=$2; shift 2 ;;
    --gpus-per-node) GPUS=$2; shift 2 ;;
    --local-dirs) LOCAL_DIRS=$2; shift 2 ;;
    --log-dir) LOG_DIR=$2; shift 2 ;;
    --master-port) MASTER_PORT=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (usage: spark-standalone.sh [options] -- command...)" ;;
  esac
done
[ $# -gt 0 ] || die "no driver command after --"
[ -n "${SLURM_JOB_ID:-}" ] || die "not inside a Slurm allocation (SLURM_JOB_ID unset)"
for v in WORKER_CORES WORKER_MEM_GB GPUS MASTER_PORT TIMEOUT; do
  [ -z "${!v}" ] || [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a whole number, got '${!v}'"
done

NODES=$(scontrol show hostnames "${SLURM_JOB_NODELIST}" | wc -l)
containers_on_all_nodes "$NODES"
SPARK_HOME=$("${here[@]}" "$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))') \
  || die "$PY cannot import pyspark (set RECSYS_PYTHON to the environment's python)"
export SPARK_HOME
JOB_TAG=${SLURM_JOB_ID}${SLURM_ARRAY_TASK_ID:+_${SLURM_ARRAY_TASK_ID}}
if [ -z "$LOG_DIR" ]; then
  if [ -n "${RECSYS_RUN_DIR:-}" ]; then LOG_DIR=$RECSYS_RUN_DIR/logs/spark-$JOB_TAG; else LOG_DIR=$PWD/spark-$JOB_TAG; fi
fi
mkdir -p "$LOG_DIR"
if [ -z "$WORKER_CORES" ]; then WORKER_CORES=${SLURM_CPUS_ON_NODE:-$(nproc)}; fi
if [ -z "$WORKER_MEM_GB" ]; then WORKER_MEM_GB=$(default_worker_memory_gb); fi
MASTER_HOST=${SPARK_MASTER_HOST:-$(hostname)}
if [ -z "$MASTER_PORT" ]; then
  MASTER_PORT=$("${here[@]}" "$PY" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
fi
export SPARK_MASTER_URL="spark://$MASTER_HOST:$MASTER_PORT"
export SPARK_LOG_DIR=$LOG_DIR SPARK_NO_DAEMONIZE=1
[ -z "$LOCAL_DIRS" ] || export SPARK_LOCAL_DIRS=$LOCAL_DIRS
if [ "$GPUS" -gt 0 ]; then
  export SPARK_WORKER_OPTS="${SPARK_WORKER_OPTS:-} -Dspark.worker.resource.gpu.amount=$GPUS"
  SPARK_WORKER_OPTS+=" -Dspark.worker.resource.gpu.discoveryScript=$("${here[@]}" "$PY" -c 'import preproc.runtime.spark as s; print(s.DISCOVERY_SCRIPT)')"
fi

master_pid="" workers_pid="" driver_pid=""
cluster_pids() { echo $driver_pid $workers_pid $master_pid; }
cluster_summary() { echo "master $SPARK_MASTER_URL, $NODES worker(s)"; }
trap_stop_signals

say "master $SPARK_MASTER_URL, $NODES node(s) x $WORKER_CORES cores x ${WORKER_MEM_GB}g x $GPUS GPU(s), shuffle in ${SPARK_LOCAL_DIRS:-/tmp}, logs in $LOG_DIR"
"${here[@]}" "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
  --host "$MASTER_HOST" --port "$MASTER_PORT" --webui-port 0 > "$LOG_DIR/master.log" 2>&1 &
master_pid=$!
deadline=$((SECONDS + TIMEOUT))
until grep -q "I have been elected leader" "$LOG_DIR/master.log" 2>/dev/null; do
  kill -0 "$master_pid" 2>/dev/null || die "Spark master exited; see $LOG_DIR/master.log"
  [ $SECONDS -lt $deadline ] || die "Spark master not up after ${TIMEOUT}s; see $LOG_DIR/master.log"
  sleep 0.5
done

# One worker per node; each gets its own work dir (executor stderr) under the log dir.
srun --nodes="$NODES" --ntasks="$NODES" --ntasks-per-node=1 --overlap --kill-on-bad-exit=0 \
  --output="$LOG_DIR/worker-%t.log" ${container[@]+"${container[@]}"} ${entry[@]+"${entry[@]}"} \
  bash -c 'exec "$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker \
    --cores "$0" --memory "$1g" --webui-port 0 --work-dir "$2/work-${SLURMD_NODENAME:-$(hostname)}" \
    "$SPARK_MASTER_URL"' "$WORKER_CORES" "$WORKER_MEM_GB" "$LOG_DIR" &
workers_pid=$!
until [ "$(grep -c "Registering worker" "$LOG_DIR/master.log" 2>/dev/null)" -ge "$NODES" ]; do
  kill -0 "$workers_pid" 2>/dev/null || die "Spark workers exited; see $LOG_DIR/worker-*.log"
  [ $SECONDS -lt $deadline ] || die "$(grep -c "Registering worker" "$LOG_DIR/master.log") of $NODES workers registered after ${TIMEOUT}s; see $LOG_DIR"
  sleep 0.5
done
say "$NODES worker(s) registered"

export RECSYS_SPARK_NODES=$NODES RECSYS_SPARK_WORKER_CORES=$WORKER_CORES RECSYS_SPARK_WORKER_MEMORY_GB=$WORKER_MEM_GB
export RECSYS_SPARK_GPUS=$GPUS
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
