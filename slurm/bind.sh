#!/usr/bin/env bash
# Per-rank binding wrapper: exec'ed once per rank (by srun, mpirun or the local
# launcher) just before the program.
#
#   bind.sh [--mode exclusive|numa|interleave|off] [--ht] [--dry] -- cmd args...
#
# It finds the rank's local rank (SLURM_LOCALID | OMPI_COMM_WORLD_LOCAL_RANK |
# LOCAL_RANK), exports RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE NODE_RANK,
# gives the rank one GPU (CUDA_VISIBLE_DEVICES), one NIC when the job spans
# several nodes (UCX_NET_DEVICES, OMPI_MCA_btl_openib_if_include), and execs
# `numactl <cpu set> <memory policy> -- cmd`.  The per-node tables come from the
# environment the batch script exports (jobs.profiles.binding.bind_env):
#   RECSYS_BIND_GPUS=8  RECSYS_BIND_CPUS="48-55;56-63;..."  RECSYS_BIND_MEMS="3;3;1;..."
#   RECSYS_BIND_NICS="mlx5_0;..."  RECSYS_BIND_NUMA="0-15;16-31;..." (by NUMA id)
#   RECSYS_BIND_CORES="0-127"  RECSYS_HT_OFFSET=128
# Other knobs: RECSYS_BIND_MODE / RECSYS_BIND_HT (defaults of --mode / --ht),
# RECSYS_BIND_STRICT=0 (warn and run unbound instead of failing when the host
# cannot honour the binding), RECSYS_BIND_VERBOSE=1 (print the binding line to
# stderr), RECSYS_NNODES (node count when not under Slurm).
# jobs/binding.py is the reference implementation; tests compare the two.
set -euo pipefail

die() { printf 'bind.sh: %s\n' "$*" >&2; exit 2; }
warn() { printf 'bind.sh: warning: %s\n' "$*" >&2; }
usage="usage: bind.sh [--mode exclusive|numa|interleave|off] [--ht] [--dry] -- cmd args..."

mode=${RECSYS_BIND_MODE:-exclusive}
ht=${RECSYS_BIND_HT:-0}
dry=0
while (($#)); do
    case $1 in
        --mode) (($# >= 2)) || die "--mode needs a value ($usage)"; mode=$2; shift 2 ;;
        --mode=*) mode=${1#--mode=}; shift ;;
        --ht) ht=1; shift ;;
        --dry) dry=1; shift ;;
        --) shift; break ;;
        -*) die "unknown option '$1' ($usage)" ;;
        *) break ;;
    esac
done
(($#)) || die "no command to run ($usage)"
case $mode in
    exclusive|numa|interleave|off) ;;
    *) die "--mode: must be exclusive, numa, interleave or off, got '$mode'" ;;
esac
[[ $ht == 0 || $ht == 1 ]] || die "RECSYS_BIND_HT: must be 0 or 1, got '$ht'"

# ---------------------------------------------------------------- helpers
# (helpers set a named variable instead of printing: no subshell per call)
# first_of OUT VAR... : OUT = value of the first non-empty VAR (names are ours, not user input)
first_of() {
    local out=$1 name
    shift
    printf -v "$out" '%s' ""
    for name in "$@"; do
        if [[ -n ${!name:-} ]]; then printf -v "$out" '%s' "${!name}"; return 0; fi
    done
}
# uint OUT WHAT VALUE: OUT = VALUE checked to be a non-negative integer (leading zeros dropped)
uint() {
    [[ $3 =~ ^[0-9]+$ ]] || die "$2: not a non-negative integer: '$3'"
    printf -v "$1" '%s' "$((10#$3))"
}
# expand_list CPULIST -> global array EXPANDED of ints
expand_list() {
    EXPANDED=()
    local part lo hi i
    local -a parts=()
    [[ -n $1 ]] || return 0
    IFS=, read -ra parts <<<"$1"
    for part in "${parts[@]}"; do
        if [[ $part =~ ^([0-9]+)-([0-9]+)$ ]]; then
            lo=$((10#${BASH_REMATCH[1]})); hi=$((10#${BASH_REMATCH[2]}))
        elif [[ $part =~ ^[0-9]+$ ]]; then
            lo=$((10#$part)); hi=$lo
        else
            die "malformed CPU/node list '$1' in the RECSYS_BIND_* tables"
        fi
        for ((i = lo; i <= hi; i++)); do EXPANDED+=("$i"); done
    done
}
# compress_list INT... -> global COMPRESSED, canonical sorted cpulist ("48-55,176-183")
compress_list() {
    local -a mark=()
    local c start=-1 prev=-1
    COMPRESSED=""
    for c in "$@"; do mark[c]=1; done
    for c in "${!mark[@]}"; do  # indices of a bash array come out ascending
        if ((start < 0)); then
            start=$c
        elif ((c != prev + 1)); then
            COMPRESSED+="${COMPRESSED:+,}$start"; ((prev == start)) || COMPRESSED+="-$prev"
            start=$c
        fi
        prev=$c
    done
    if ((start >= 0)); then
        COMPRESSED+="${COMPRESSED:+,}$start"; ((prev == start)) || COMPRESSED+="-$prev"
    fi
}
# slurm_tasks_here: TASKS_HERE = tasks of this step on this node, from "2(x3),1"-style counts
slurm_tasks_here() {
    local spec=${SLURM_STEP_TASKS_PER_NODE:-${SLURM_TASKS_PER_NODE:-}} node=${SLURM_NODEID:-0}
    local part n count seen=0
    local -a parts=()
    TASKS_HERE=""
    [[ -n $spec && $node =~ ^[0-9]+$ ]] || return 0
    IFS=, read -ra parts <<<"$spec"
    for part in "${parts[@]}"; do
        if [[ $part =~ ^([0-9]+)\(x([0-9]+)\)$ ]]; then
            n=${BASH_REMATCH[1]}; count=${BASH_REMATCH[2]}
        elif [[ $part =~ ^[0-9]+$ ]]; then
            n=$part; count=1
        else
            return 0
        fi
        if ((10#$node < seen + 10#$count)); then TASKS_HERE=$n; return 0; fi
        seen=$((seen + 10#$count))
    done
}

# ------------------------------------------------------------ rank identity
first_of lr_raw SLURM_LOCALID OMPI_COMM_WORLD_LOCAL_RANK LOCAL_RANK
uint local_rank "local rank (SLURM_LOCALID|OMPI_COMM_WORLD_LOCAL_RANK|LOCAL_RANK)" "${lr_raw:-0}"
first_of rank_raw SLURM_PROCID OMPI_COMM_WORLD_RANK RANK
uint rank "rank (SLURM_PROCID|OMPI_COMM_WORLD_RANK|RANK)" "${rank_raw:-$local_rank}"
first_of world_raw SLURM_NTASKS OMPI_COMM_WORLD_SIZE WORLD_SIZE
uint world "world size (SLURM_NTASKS|OMPI_COMM_WORLD_SIZE|WORLD_SIZE)" "${world_raw:-1}"
TASKS_HERE=""
[[ -z ${SLURM_LOCALID:-} ]] || slurm_tasks_here
lws_raw=$TASKS_HERE
[[ -n $lws_raw ]] || first_of lws_raw OMPI_COMM_WORLD_LOCAL_SIZE LOCAL_WORLD_SIZE
uint local_world "local world size (SLURM_STEP_TASKS_PER_NODE|OMPI_COMM_WORLD_LOCAL_SIZE|LOCAL_WORLD_SIZE)" \
    "${lws_raw:-1}"
((local_world > 0)) || die "local world size must be positive"
first_of node_raw SLURM_NODEID NODE_RANK
uint node_rank "node rank (SLURM_NODEID|NODE_RANK)" "${node_raw:-$((rank / local_world))}"
first_of nn_raw SLURM_NNODES RECSYS_NNODES
uint nnodes "node count (SLURM_NNODES|RECSYS_NNODES)" "${nn_raw:-1}"

# ---------------------------------------------------------------- the tables
uint gpus RECSYS_BIND_GPUS "${RECSYS_BIND_GPUS:-0}"
IFS=';' read -ra t_cpus <<<"${RECSYS_BIND_CPUS:-}"
IFS=';' read -ra t_mems <<<"${RECSYS_BIND_MEMS:-}"
IFS=';' read -ra t_nics <<<"${RECSYS_BIND_NICS:-}"
IFS=';' read -ra t_numa <<<"${RECSYS_BIND_NUMA:-}"
ht_offset=${RECSYS_HT_OFFSET:-}
[[ -z $ht_offset ]] || uint ht_offset RECSYS_HT_OFFSET "$ht_offset"

# cpu -> NUMA node id
declare -a numa_of=()
for ((n = 0; n < ${#t_numa[@]}; n++)); do
    expand_list "${t_numa[n]}"
    for c in "${EXPANDED[@]}"; do numa_of[c]=$n; done
done

# -------------------------------------------------------------------- the GPU
gpu="" cvd=""
if ((gpus > 0)); then
    first_of step_gpus_raw SLURM_STEP_GPUS SLURM_JOB_GPUS
    IFS=, read -ra step_gpus <<<"$step_gpus_raw"
    if ((${#step_gpus[@]} > local_rank)); then
        uint gpu SLURM_STEP_GPUS "${step_gpus[local_rank]}"
    elif ((${#step_gpus[@]} == 1)); then  # Slurm already gave this task its own GPU
        uint gpu SLURM_STEP_GPUS "${step_gpus[0]}"
    else
        gpu=$local_rank
    fi
    ((gpu < gpus)) || die "local rank $local_rank has no GPU: the node type has $gpus GPUs (RECSYS_BIND_GPUS)"
    IFS=, read -ra visible <<<"${CUDA_VISIBLE_DEVICES:-}"
    if ((${#visible[@]} > local_rank)); then
        cvd=${visible[local_rank]}   # Slurm may renumber devices inside the cgroup
    elif ((${#visible[@]} == 1)); then
        cvd=${visible[0]}
    else
        cvd=$gpu
    fi
fi

# ------------------------------------------------------------- CPUs and memory
cpus=() mems=() policy=off
if [[ $mode != off ]]; then
    if ((gpus > 0)); then
        [[ -n ${t_cpus[gpu]:-} ]] || die "RECSYS_BIND_CPUS has no core set for GPU $gpu"
        [[ -n ${t_mems[gpu]:-} ]] || die "RECSYS_BIND_MEMS has no NUMA node for GPU $gpu"
        expand_list "${t_cpus[gpu]}"; own=("${EXPANDED[@]}")
        uint home RECSYS_BIND_MEMS "${t_mems[gpu]}"
    else  # no GPUs: an even, contiguous share of the cores per local rank
        expand_list "${RECSYS_BIND_CORES:-}"; all=("${EXPANDED[@]}")
        ((${#all[@]} > 0)) || die "no binding tables in the environment (RECSYS_BIND_GPUS/CPUS/CORES are empty): export jobs.profiles.binding.bind_env(node), or use --mode off"
        ((local_rank < local_world)) ||
            die "local rank $local_rank is not below the $local_world ranks of the node (LOCAL_WORLD_SIZE)"
        n=${#all[@]}
        if ((local_world > n)); then
            own=("${all[local_rank % n]}")
        else
            lo=$((local_rank * n / local_world)); hi=$(((local_rank + 1) * n / local_world))
            own=("${all[@]:lo:hi-lo}")
        fi
        [[ -n ${numa_of[own[0]]:-} ]] || die "core ${own[0]} is in no NUMA node of RECSYS_BIND_NUMA"
        home=${numa_of[own[0]]}
    fi
    if [[ $mode == exclusive ]]; then
        cpus=("${own[@]}")
        if ((gpus > 0)); then
            mems=("$home")
        else
            for c in "${own[@]}"; do mems+=("${numa_of[c]}"); done
        fi
        policy=membind
    else
        expand_list "${t_numa[home]:-}"; cpus=("${EXPANDED[@]}")
        ((${#cpus[@]} > 0)) || die "RECSYS_BIND_NUMA has no cores for NUMA node $home"
        if [[ $mode == numa ]]; then mems=("$home"); policy=membind; else policy=interleave; fi
    fi
    if [[ $ht == 1 && -n $ht_offset ]]; then
        for c in "${cpus[@]}"; do cpus+=($((c + ht_offset))); done
    fi
fi
compress_list "${cpus[@]}"; cpus_str=$COMPRESSED
compress_list "${mems[@]}"; mems_str=$COMPRESSED

# ------------------------------------------------------------------------ NIC
nic=""
if ((nnodes > 1)) && [[ -n $gpu && ${#t_nics[@]} -gt 0 ]]; then
    nic=${t_nics[gpu]:-}
    [[ -z $nic || $nic =~ ^[A-Za-z0-9_.:-]+$ ]] || die "RECSYS_BIND_NICS: invalid device name '$nic'"
fi

# -------------------------------------------------------------------- report
printf -v cmd_str '%q ' "$@"
line="rank=$rank local_rank=$local_rank cpus=${cpus_str:-all} mems=${mems_str:-all} policy=$policy"
line+=" gpu=${gpu:-none} nic=${nic:-none} cmd=${cmd_str% }"
if ((dry)); then
    printf '%s\n' "$line"
    exit 0
fi

export RANK=$rank LOCAL_RANK=$local_rank WORLD_SIZE=$world LOCAL_WORLD_SIZE=$local_world
export NODE_RANK=$node_rank
[[ -z $gpu ]] || export CUDA_VISIBLE_DEVICES=$cvd
if [[ -n $nic ]]; then
    export UCX_NET_DEVICES="$nic:1" OMPI_MCA_btl_openib_if_include="$nic:1"
fi
[[ ${RECSYS_BIND_VERBOSE:-0} != 1 ]] || printf '%s\n' "$line" >&2

[[ $policy != off ]] || exec "$@"

# ------------------------------------------- can this host honour the binding?
strict=${RECSYS_BIND_STRICT:-1}
allowed_cpus="" allowed_mems=""
if [[ -r /proc/self/status ]]; then  # this shell's own limits, inherited by the exec'ed program
    while IFS=$' \t' read -r key value; do
        case $key in
            Cpus_allowed_list:) allowed_cpus=$value ;;
            Mems_allowed_list:) allowed_mems=$value ;;
        esac
    done </proc/self/status
fi
if [[ -z $allowed_cpus && -r /sys/devices/system/cpu/online ]]; then
    read -r allowed_cpus </sys/devices/system/cpu/online || true
fi
problem=""
if [[ -n $allowed_cpus ]]; then
    expand_list "$allowed_cpus"
    declare -a ok=()
    for c in "${EXPANDED[@]}"; do ok[c]=1; done
    for c in "${cpus[@]}"; do
        if [[ -z ${ok[c]:-} ]]; then
            problem="cannot bind to cpus $cpus_str: cpu $c is not available here (allowed: $allowed_cpus)"
            break
        fi
    done
fi
if [[ -z $problem && -n $allowed_mems && $policy == membind ]]; then
    expand_list "$allowed_mems"
    declare -a okm=()
    for c in "${EXPANDED[@]}"; do okm[c]=1; done
    for c in "${mems[@]}"; do
        if [[ -z ${okm[c]:-} ]]; then
            problem="cannot bind memory to NUMA node $c: not available here (allowed: $allowed_mems)"
            break
        fi
    done
fi
if [[ -n $problem ]]; then
    if [[ $strict == 0 ]]; then
        warn "rank $rank: $problem; running unbound (RECSYS_BIND_STRICT=0)"
        exec "$@"
    fi
    die "rank $rank: $problem (set RECSYS_BIND_STRICT=0 to run unbound)"
fi

if command -v numactl >/dev/null 2>&1; then
    if [[ $policy == interleave ]]; then
        exec numactl --physcpubind="$cpus_str" --interleave=all -- "$@"
    fi
    exec numactl --physcpubind="$cpus_str" --membind="$mems_str" -- "$@"
fi
if command -v taskset >/dev/null 2>&1; then
    warn "rank $rank: numactl not found; binding CPUs with taskset, memory policy not applied"
    exec taskset -c "$cpus_str" "$@"
fi
if [[ $strict == 0 ]]; then
    warn "rank $rank: neither numactl nor taskset found; running unbound (RECSYS_BIND_STRICT=0)"
    exec "$@"
fi
die "rank $rank: neither numactl nor taskset found (install numactl, or set RECSYS_BIND_STRICT=0 to run unbound)"
