# Sourced by spark-standalone.sh and dask-cluster.sh: what every "cluster inside the allocation"
# helper does the same way. The sourcing script defines say(), LOG_DIR, cluster_pids (its live
# pids, driver first) and cluster_summary (one phrase naming the cluster, for the stop message).

# default_worker_memory_gb: 85 % of the node's memory (the allocation's SLURM_MEM_PER_NODE, else
# MemTotal), whole GiB, at least 1: the rest is left to the OS and the driver.
default_worker_memory_gb() {
  local mem_mb
  if [ -n "${SLURM_MEM_PER_NODE:-}" ]; then mem_mb=$SLURM_MEM_PER_NODE
  else mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 )); fi
  local gb=$(( mem_mb * 85 / 100 / 1024 ))
  [ "$gb" -ge 1 ] || gb=1
  echo "$gb"
}

# stop_processes PID...: TERM each (in the order given), wait up to 15 s for all, then KILL what is
# left. Signals are ignored meanwhile, so a second TERM cannot cut the shutdown short.
stop_processes() {
  trap '' TERM INT USR2
  local pid
  for pid in "$@"; do kill -TERM "$pid" 2>/dev/null || true; done
  local deadline=$((SECONDS + 15))
  for pid in "$@"; do
    while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}

# stop_cluster STATUS: once only, stop every process of the cluster, say so, and exit STATUS.
cluster_stopping=0
stop_cluster() {
  local status=$1
  [ "$cluster_stopping" = 0 ] || return 0
  cluster_stopping=1
  # shellcheck disable=SC2046  # one word per pid; an unset pid is no word
  stop_processes $(cluster_pids)
  say "cluster stopped ($(cluster_summary)); logs in $LOG_DIR"
  exit "$status"
}

# trap_stop_signals: the cluster ALWAYS stops: on exit, and on TERM/INT/USR2 (scancel, Ctrl-C,
# the time limit) with 128+N.
trap_stop_signals() {
  trap 'stop_cluster $?' EXIT
  trap 'say "caught SIGTERM"; stop_cluster 143' TERM
  trap 'say "caught SIGINT"; stop_cluster 130' INT
  trap 'say "caught SIGUSR2 (time limit near)"; stop_cluster 140' USR2
}

# The job's container (pyxis), when its profile has one: the rendered sbatch script exports
# RECSYS_CONTAINER_SRUN_FLAGS, its srun container flags one a line (jobs/backends/slurm/script.py),
# and every process a helper starts runs in that container:
#   container  the flags, for the helper's srun steps over all nodes (the workers);
#   entry      what those steps run first in the container (container-entry.sh: the checkout on
#              PYTHONPATH in front of the image's, no user site-packages); empty without one;
#   here       the prefix of what runs on this node (the master/scheduler, the driver, the helper's
#              own python): a one-task srun step on this node in the container, or, without a
#              container, `env`, which execs the command (same process, same pid as without it).
# Without a container nothing else changes: the commands run on the host as before.
container=()
entry=()
here=(env)
container_here() {
  entry=(bash "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/container-entry.sh")
  here=(srun --nodes=1 --ntasks=1 --ntasks-per-node=1 --overlap --kill-on-bad-exit=1
        --nodelist="${SLURMD_NODENAME:-$(hostname)}" "${container[@]}" "${entry[@]}")
}
if [ -n "${RECSYS_CONTAINER_SRUN_FLAGS:-}" ]; then
  mapfile -t container <<< "$RECSYS_CONTAINER_SRUN_FLAGS"
  container_here
fi

# container_env NAME...: the helper's own variables reach its processes in the container over
# any value the image sets. Added to the script's one --container-env flag: Slurm hands a SPANK
# option given twice to the node side once, with its last value.
container_env() {
  [ -n "${RECSYS_CONTAINER_SRUN_FLAGS:-}" ] || return 0
  local IFS=, i found=0
  for i in "${!container[@]}"; do
    if [[ ${container[$i]} == --container-env=* ]]; then container[$i]+=",$*"; found=1; fi
  done
  [ "$found" = 1 ] || container+=("--container-env=$*")
  container_here
}

# containers_on_all_nodes NODES: create the job's named container on every node before anything
# waits on a timeout: pyxis imports the image on each node at its first step (minutes for a large
# image), which would otherwise be counted in the workers' registration time. No container: nothing.
containers_on_all_nodes() {
  [ "${#container[@]}" -gt 0 ] || return 0
  local start=$SECONDS
  srun --nodes="$1" --ntasks="$1" --ntasks-per-node=1 --overlap --kill-on-bad-exit=1 "${container[@]}" true \
    || die "could not start the job's container on its $1 node(s) (see the srun/pyxis error above)"
  say "container ready on $1 node(s) after $((SECONDS - start)) s"
}
