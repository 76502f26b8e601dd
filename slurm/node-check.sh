#!/usr/bin/env bash
# What every node of a job needs before its first step, checked by the job script
# (slurm/job.sbatch.tmpl) on each node (issue 47, item 7), so that a node that lacks it stops the
# job in one line naming that node, not at the first inter-node collective after the start-up:
#
#   - the network interfaces NCCL_SOCKET_IFNAME names (slurm/nccl-ifname.sh);
#   - on a node with InfiniBand devices, a locked-memory limit (`ulimit -l`) the verbs can
#     register memory under: unlimited, or at least RECSYS_MIN_MEMLOCK_KB when a site sets it
#     (Slurm propagates the submitting shell's limit unless slurm.conf says
#     PropagateResourceLimitsExcept=MEMLOCK);
#   - python3 for the hardware sampler (slurm/hwsample.py) where it is on: a warning only.
#
#   node-check.sh          on the batch host: every node of the job (one srun task per node,
#                          on the step's nodes inside a study allocation), or this node alone
#                          outside Slurm or on one node
#   node-check.sh --here   this node only
#
# Exit 0 when every node passes, else 2 after one line per failing node on stderr. A fan-out
# that srun itself cannot run is a warning (the batch host is then checked alone).
set -u
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
node=${SLURMD_NODENAME:-$(hostname)}

check_here() {
    bash "$here/nccl-ifname.sh" || return 2
    local ib_root=${RECSYS_NODE_CHECK_IB_ROOT:-/sys/class/infiniband} devices memlock
    devices=$(ls -1 "$ib_root" 2>/dev/null | head -n 4 || true)
    devices=${devices//$'\n'/,}
    memlock=$(ulimit -l)
    if [ -n "$devices" ] && [ "$memlock" != unlimited ]; then
        local min=${RECSYS_MIN_MEMLOCK_KB:-}
        if [ -z "$min" ] || [ "$memlock" -lt "$min" ]; then
            echo "recsys: error: node $node: locked-memory limit (ulimit -l) is $memlock KiB; InfiniBand ($devices) needs ${min:+at least $min KiB, or }unlimited for NCCL and MPI to register memory (slurm.conf PropagateResourceLimitsExcept=MEMLOCK, or a site's limits.conf)" >&2
            return 2
        fi
    fi
    if [ "${RECSYS_HW_SAMPLE:-1}" != 0 ] && ! command -v python3 >/dev/null 2>&1; then
        echo "recsys: warning: node $node: no python3 on PATH: the hardware sampler (slurm/hwsample.py) records nothing here" >&2
    fi
    return 0
}

nodes=${SLURM_JOB_NUM_NODES:-1}
if [ "${1:-}" = --here ] || [ -z "${SLURM_JOB_ID:-}" ] || [ "$nodes" -le 1 ] || ! command -v srun >/dev/null 2>&1; then
    check_here
    exit $?
fi
srun --overlap --nodes="$nodes" --ntasks="$nodes" --ntasks-per-node=1 \
    ${RECSYS_STEP_NODES:+"--nodelist=$RECSYS_STEP_NODES"} bash "$here/node-check.sh" --here
rc=$?
[ "$rc" = 0 ] && exit 0
[ "$rc" = 2 ] && exit 2
echo "recsys: warning: the per-node check could not run on every node (srun exit $rc); checking $node alone" >&2
check_here
