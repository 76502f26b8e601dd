#!/usr/bin/env bash
# Whether this node has the network interfaces that NCCL_SOCKET_IFNAME names, checked by the job
# script before its step (slurm/job.sbatch.tmpl): NCCL would otherwise fail at its first
# collective ("no socket interface found") after the whole start-up. NCCL's syntax: a
# comma-separated list of name prefixes, `=NAME` for exact names, a leading `^` to exclude (an
# exclusion list always leaves something: not checked). Unset or empty: nothing to check.
# Exit 0 when an interface matches, else one line on stderr and exit 2.
set -u
value=${NCCL_SOCKET_IFNAME:-}
[ -n "$value" ] || exit 0
[ "${value#^}" = "$value" ] || exit 0
exact=0
if [ "${value#=}" != "$value" ]; then exact=1; value=${value#=}; fi
names=$(ls -1 /sys/class/net 2>/dev/null)
IFS=, read -r -a wanted <<< "$value"
for want in "${wanted[@]}"; do
  for name in $names; do
    if [ "$exact" = 1 ]; then [ "$name" = "$want" ] && exit 0
    else case "$name" in "$want"*) exit 0 ;; esac
    fi
  done
done
echo "recsys: error: NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME}: no such network interface on ${SLURMD_NODENAME:-$(hostname)} (it has: $(echo $names | tr ' ' ','); set env NCCL_SOCKET_IFNAME in your profile to one of them, or remove it)" >&2
exit 2
