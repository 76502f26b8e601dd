#!/usr/bin/env bash
# A real Slurm cluster on one host, for tests and benchmarks.
#
# Starts a private munged, slurmctld and one slurmd per emulated node
# (`slurmd -N nodeK`, each on its own port), GPUs declared as GRES backed by
# real character devices, and optionally MariaDB + slurmdbd for accounting.
# Everything lives under one state directory; nothing touches /etc/slurm.
#
#   local-cluster.sh install [PKG...]        apt packages (root), plus PKG...; skips installed ones
#   local-cluster.sh up   [options]          configure + start, wait until nodes are idle
#   local-cluster.sh down [--dir DIR]        stop everything started by `up`
#   local-cluster.sh status [--dir DIR]      daemons and sinfo
#   local-cluster.sh env  [--dir DIR]        print `export SLURM_CONF=...` lines
#   local-cluster.sh stop-ctld [--dir DIR]   stop slurmctld only (SIGTERM: it saves its state first);
#                                            slurmd, munged and running jobs stay up
#   local-cluster.sh start-ctld [--dir DIR]  start slurmctld again from its saved state (jobs, nodes,
#                                            next job id), wait until it answers and every node responds
#   local-cluster.sh restart-ctld [--dir DIR] [--down-for S]   stop-ctld, S seconds (0) without a
#                                            controller, start-ctld: a controller outage for fault tests
#   local-cluster.sh slow-link [--dir DIR] --node NODE [--rate R]   slow NODE's network link on
#                                            purpose (root; tc, iptables, cgroup v2): every TCP
#                                            connection a process of NODE opens or accepts goes
#                                            through an htb class of rate R (200mbit) on lo; the
#                                            other nodes' and clusters' traffic is untouched
#   local-cluster.sh slow-link [--dir DIR] --off   undo it
#
# Options for `up`: --dir DIR (default /tmp/recsys-slurm; at most about 70 characters, since
# slurmstepd's Unix sockets live under it), --nodes N (4),
# --gpus G per node (2), --cpus C per node (2), --mem MB per node (4000),
# --port-base P|auto (a block of 20 ports; auto, the default, picks a free one
# below the ephemeral range and records it in DIR/port-base; clusters coming up
# at the same time, e.g. one per pytest-xdist worker, take turns from the pick until
# their daemons listen, under an flock in ~/.cache), --accounting,
# --min-job-age S (300: seconds Slurm keeps a finished job before it forgets it;
# slurmctld purges once a minute, so a job is forgotten S to S+60 s after it ends).
#
# Known quirks handled here (Debian Slurm 22.05): TmpFS per node or pmix fails
# ("Cannot create directory ...spmix_appdir..."); File-less GRES is dropped, so
# fake GPUs are mknod'ed character devices; slurmd is stopped with
# `scontrol shutdown` while the controller is up; processes are ended by their
# PID files only.
set -euo pipefail

die() { echo "local-cluster: $*" >&2; exit 1; }
log() { echo "local-cluster: $*" >&2; }

cmd=${1:-}; [ -n "$cmd" ] || die "usage: local-cluster.sh install|up|down|status|env|stop-ctld|start-ctld|restart-ctld [options]"
shift
EXTRA_PKGS=()
if [ "$cmd" = install ]; then EXTRA_PKGS=("$@"); set --; fi

DIR=/tmp/recsys-slurm NODES=4 GPUS=2 CPUS=2 MEM=4000 PORT_BASE=auto ACCOUNTING=0 DOWN_FOR=0 MIN_JOB_AGE=300
SLOW_NODE="" SLOW_RATE=200mbit SLOW_OFF=0
while [ $# -gt 0 ]; do
  case "$1" in
    --dir) DIR=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --gpus) GPUS=$2; shift 2 ;;
    --cpus) CPUS=$2; shift 2 ;;
    --mem) MEM=$2; shift 2 ;;
    --port-base) PORT_BASE=$2; shift 2 ;;
    --accounting) ACCOUNTING=1; shift ;;
    --down-for) DOWN_FOR=$2; shift 2 ;;
    --min-job-age) MIN_JOB_AGE=$2; shift 2 ;;
    --node) SLOW_NODE=$2; shift 2 ;;
    --rate) SLOW_RATE=$2; shift 2 ;;
    --off) SLOW_OFF=1; shift ;;
    *) die "unknown option: $1" ;;
  esac
done
for v in NODES GPUS CPUS MEM DOWN_FOR MIN_JOB_AGE; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "--$(tr _ - <<< "${v,,}") must be a whole number, got '${!v}'"
done
[ "$NODES" -ge 1 ] || die "--nodes must be at least 1"
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
# slurmstepd listens on DIR/spool/nodeN/nodeN_JOBID.STEPID, a Unix socket: its path (with the
# NUL) must fit 108 bytes, or every job launch fails ("launch failed requeued held")
sample="$DIR/spool/node$NODES/node${NODES}_9999999.4294967291"
if [ "$cmd" = up ] && [ $(( ${#sample} + 1 )) -gt 108 ]; then
  die "--dir $DIR is too long (${#DIR} characters): slurmstepd's sockets under it would exceed the 108-byte Unix socket path limit; use a shorter directory (at most $(( 107 - ${#sample} + ${#DIR} )) characters), e.g. \$(mktemp -d /tmp/recsys-slurm-XXXX)"
fi
ETC=$DIR/etc RUN=$DIR/run LOGS=$DIR/log
CONF=$ETC/slurm.conf
SLURM_USER=$(id -un)
HOST=$(hostname -s)
export SLURM_CONF=$CONF

# A base port whose block of 20 has no TCP socket on it now; 20000-32767 stays
# below Linux's ephemeral range, so outgoing connections cannot take them later.
pick_port_base() {
  local used base p ok _
  used=" $(ss -Htan 2>/dev/null | awk '{n=split($4, a, ":"); print a[n]}' | sort -u | tr '\n' ' ') "
  for _ in $(seq 200); do
    base=$((20000 + RANDOM % 12700)) ok=1
    for p in $(seq "$base" $((base + 19))); do
      case "$used" in *" $p "*) ok=0; break ;; esac
    done
    [ "$ok" = 1 ] && { echo "$base"; return 0; }
  done
  die "no free block of 20 ports between 20000 and 32767"
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || { log "timed out after ${limit}s waiting for $what"; return 1; }
    sleep 0.1
  done
}

do_install() {
  local pkgs=(slurm-wlm slurmdbd munge mariadb-server numactl openmpi-bin libopenmpi-dev libpmix-dev
              "${EXTRA_PKGS[@]}") missing=() p
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Debian's packages try to start their daemons; the cluster here starts its own.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  rm -f /usr/sbin/policy-rc.d
}

write_config() {
  mkdir -p "$ETC" "$RUN" "$LOGS" "$DIR/state" "$DIR/spool" "$DIR/tmp" "$DIR/dev" "$DIR/munge"
  local last=$((NODES)) gpu_last=$((GPUS - 1)) i
  for i in $(seq 1 "$NODES"); do mkdir -p "$DIR/spool/node$i" "$DIR/tmp/node$i"; done
  # Real character devices (major 195 is NVIDIA's): slurmd drops File-less GPU GRES.
  for i in $(seq 0 "$gpu_last"); do
    [ -c "$DIR/dev/nvidia$i" ] || mknod "$DIR/dev/nvidia$i" c 195 "$i"
  done
  local acct_lines="AccountingStorageType=accounting_storage/none"
  if [ "$ACCOUNTING" = 1 ]; then
    acct_lines="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$((PORT_BASE + 10))
AccountingStoragePass=$DIR/munge/munge.socket
AccountingStorageTRES=gres/gpu"
  fi
  cat > "$CONF" <<EOF
# Generated by slurm/dev/local-cluster.sh for an emulated cluster on $HOST.
ClusterName=recsys
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$PORT_BASE
SlurmdPort=$((PORT_BASE + 1))
# Job ids of its own per port block: tests find a job's processes by SLURM_JOB_ID, and two
# clusters on one host (side-by-side test sessions) must never share one: port blocks are at
# least 20 apart, so ranges start at least 100,000 ids apart.
FirstJobId=$(( (PORT_BASE % 13000 + 1) * 5000 ))
SlurmUser=$SLURM_USER
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
TmpFS=$DIR/tmp/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=$MIN_JOB_AGE
MaxArraySize=1001
MaxJobCount=20000
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
$acct_lines
SlurmctldDebug=info
SlurmdDebug=info
NodeName=DEFAULT CPUs=$CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1 RealMemory=$MEM Gres=gpu:$GPUS State=UNKNOWN
EOF
  # Several slurmd on one host: one port per emulated node.
  for i in $(seq 1 "$NODES"); do
    echo "NodeName=node$i NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((PORT_BASE + 1 + i))" >> "$CONF"
  done
  echo "PartitionName=debug Nodes=node[1-$last] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO" >> "$CONF"
  echo "Name=gpu File=$DIR/dev/nvidia[0-$gpu_last]" > "$ETC/gres.conf"
  cat > "$ETC/cgroup.conf" <<EOF
CgroupPlugin=autodetect
IgnoreSystemd=yes
EOF
}

start_munge() {
  pid_alive "$DIR/munge/munged.pid" && return 0
  [ -f "$DIR/munge/munge.key" ] || { dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none; chmod 400 "$DIR/munge/munge.key"; }
  chmod 700 "$DIR/munge"
  munged --force --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$LOGS/munged.log" --seed-file="$DIR/munge/munged.seed" 9>&-
  wait_for 10 munged test -S "$DIR/munge/munge.socket"
}

start_accounting() {
  local db=$DIR/mysql sock=$DIR/mysql.sock dbport=$((PORT_BASE + 11))
  if [ ! -d "$db/mysql" ]; then
    mkdir -p "$db"
    mariadb-install-db --no-defaults --user=root --datadir="$db" --auth-root-authentication-method=socket >"$LOGS/mariadb-install.log" 2>&1 \
      || die "mariadb-install-db failed, see $LOGS/mariadb-install.log"
  fi
  if ! pid_alive "$RUN/mariadb.pid"; then
    mariadbd --no-defaults --user=root --datadir="$db" --socket="$sock" --port="$dbport" \
      --bind-address=127.0.0.1 --pid-file="$RUN/mariadb.pid" --log-error="$LOGS/mariadb.log" \
      --innodb-buffer-pool-size=64M --skip-name-resolve >/dev/null 2>&1 9>&- &
    wait_for 120 mariadb mariadb --no-defaults -S "$sock" -u root -e 'select 1'
  fi
  mariadb --no-defaults -S "$sock" -u root -e "
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
    CREATE DATABASE IF NOT EXISTS slurm_acct_db;"
  cat > "$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
DbdHost=$HOST
DbdAddr=127.0.0.1
DbdPort=$((PORT_BASE + 10))
SlurmUser=$SLURM_USER
PidFile=$RUN/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$dbport
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  chmod 600 "$ETC/slurmdbd.conf"
  pid_alive "$RUN/slurmdbd.pid" || slurmdbd 9>&-
  wait_for 120 slurmdbd sacctmgr -n list cluster
  sacctmgr -i -Q add cluster recsys >/dev/null 2>&1 || true
  sacctmgr -i -Q add account recsys Cluster=recsys >/dev/null 2>&1 || true
  sacctmgr -i -Q add user "$SLURM_USER" Account=recsys Cluster=recsys >/dev/null 2>&1 || true
}

nodes_idle() {
  local n
  n=$(sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l)
  [ "$n" -ge "$NODES" ]
}

do_up() {
  command -v slurmctld >/dev/null || die "Slurm is not installed: run '$0 install' (as root)"
  local t0=$SECONDS
  if [ "$PORT_BASE" = auto ]; then
    # Until this cluster's daemons listen, a second `up` would see the same ports as free.
    # (fd 9 is closed for every daemon started here, or it would hold the lock for its life.)
    local lockdir="${XDG_CACHE_HOME:-$HOME/.cache}"
    mkdir -p "$lockdir" && exec 9>>"$lockdir/recsys-slurm-ports.lock" && flock -w 300 9 \
      || die "could not take $lockdir/recsys-slurm-ports.lock (another cluster coming up for 300 s?)"
    PORT_BASE=$(pick_port_base)
  fi
  [[ $PORT_BASE =~ ^[0-9]+$ ]] || die "--port-base must be a whole number or auto, got '$PORT_BASE'"
  echo "$PORT_BASE" > "$DIR/port-base"
  trap 'log "bring-up failed, stopping what was started"; do_down' ERR
  write_config
  start_munge
  if [ "$ACCOUNTING" = 1 ]; then start_accounting; fi
  if ! pid_alive "$RUN/slurmctld.pid"; then
    slurmctld -c -i 9>&- || die "slurmctld failed to start, see $LOGS/slurmctld.log"
  fi
  wait_for 30 slurmctld scontrol ping || { tail -n 20 "$LOGS/slurmctld.log" >&2; die "slurmctld did not answer"; }
  local i
  for i in $(seq 1 "$NODES"); do
    pid_alive "$RUN/slurmd-node$i.pid" || slurmd -N "node$i" 9>&- || die "slurmd node$i failed, see $LOGS/slurmd-node$i.log"
  done
  wait_for 60 "$NODES idle nodes" nodes_idle || { sinfo -N >&2; tail -n 20 "$LOGS"/slurmd-node1.log >&2; die "nodes did not become idle"; }
  trap - ERR
  exec 9>&- 2>/dev/null || true     # the ports are taken now: the next `up` may pick
  printf 'export SLURM_CONF=%q\n' "$CONF" > "$DIR/env.sh"
  log "up in $((SECONDS - t0))s: $NODES nodes x $GPUS gpus, accounting=$ACCOUNTING, SLURM_CONF=$CONF"
}

# A slowed link: the emulated nodes share this host's loopback, so a node's "link" is the TCP
# connections its processes open or accept. Its slurmd (and with it every step it starts: with
# proctrack/linuxproc they stay in its cgroup) goes into a cgroup v2 group of its own; iptables
# marks each connection a socket of that group opens or accepts (CONNMARK, so the peer's packets
# of the same connection carry it too), and an htb qdisc on lo sends the marked packets through
# a class of the given rate, everything else through a 100gbit default. State in DIR/slow-link.
do_slow_link() {
  local state=$DIR/slow-link cgroot mark=0x5253 group node rate
  cgroot=$(awk '$3 == "cgroup2" {print $2; exit}' /proc/mounts)
  if [ "$SLOW_OFF" = 1 ]; then
    [ -f "$state" ] || { log "slow-link: no slowed link in $DIR"; return 0; }
    read -r group node rate < "$state"
    tc qdisc del dev lo root 2>/dev/null || true
    iptables -t mangle -D OUTPUT -m cgroup --path "$group" -j CONNMARK --set-mark $mark 2>/dev/null || true
    iptables -t mangle -D POSTROUTING -m connmark --mark $mark -j CLASSIFY --set-class 1:20 2>/dev/null || true
    if [ -n "$cgroot" ] && [ -d "$cgroot/$group" ]; then
      while read -r p; do echo "$p" > "$cgroot/cgroup.procs" 2>/dev/null || true; done < "$cgroot/$group/cgroup.procs"
      rmdir "$cgroot/$group" 2>/dev/null || log "slow-link: $cgroot/$group still holds processes"
    fi
    rm -f "$state"
    log "slow-link: $node's link restored"
    return 0
  fi
  [ -n "$SLOW_NODE" ] || die "slow-link: give --node NODE (or --off)"
  [[ $SLOW_NODE =~ ^node[0-9]+$ ]] || die "slow-link: --node is one of this cluster's nodes (nodeN), got '$SLOW_NODE'"
  [[ $SLOW_RATE =~ ^[0-9]+[kmg]?bit$ ]] || die "slow-link: --rate is a tc rate such as 200mbit, got '$SLOW_RATE'"
  [ "$(id -u)" = 0 ] || die "slow-link: needs root (tc, iptables, cgroups)"
  command -v tc >/dev/null && command -v iptables >/dev/null || die "slow-link: needs tc (iproute2) and iptables"
  [ -n "$cgroot" ] || die "slow-link: no cgroup v2 hierarchy mounted (/proc/mounts)"
  [ ! -f "$state" ] || die "slow-link: a link is slowed already ($(cat "$state")); --off first"
  tc qdisc show dev lo | grep -q "qdisc noqueue" || die "slow-link: lo has a qdisc already: $(tc qdisc show dev lo | head -1)"
  pid_alive "$RUN/slurmd-$SLOW_NODE.pid" || die "slow-link: no slurmd of $SLOW_NODE running in $DIR"
  group="recsys-slow-link-$$"
  echo "$group $SLOW_NODE $SLOW_RATE" > "$state"
  mkdir "$cgroot/$group"
  cat "$RUN/slurmd-$SLOW_NODE.pid" > "$cgroot/$group/cgroup.procs"
  iptables -t mangle -A OUTPUT -m cgroup --path "$group" -j CONNMARK --set-mark $mark
  iptables -t mangle -A POSTROUTING -m connmark --mark $mark -j CLASSIFY --set-class 1:20
  tc qdisc add dev lo root handle 1: htb default 10 r2q 100000 2>/dev/null
  tc class add dev lo parent 1: classid 1:10 htb rate 100gbit 2>/dev/null
  tc class add dev lo parent 1: classid 1:20 htb rate "$SLOW_RATE" 2>/dev/null
  log "slow-link: $SLOW_NODE's connections at $SLOW_RATE (cgroup $group, lo htb class 1:20); undo with --off"
}

stop_pidfile() {  # stop_pidfile FILE NAME
  local f=$1 pid
  pid_alive "$f" || { rm -f "$f"; return 0; }
  pid=$(cat "$f")
  kill "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 20))
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && { log "$2 (pid $pid) ignored SIGTERM, killing"; kill -9 "$pid" 2>/dev/null || true; }
  rm -f "$f"
}

do_down() {
  [ -f "$CONF" ] || { log "nothing to stop in $DIR"; return 0; }
  if [ -f "$DIR/slow-link" ]; then SLOW_OFF=1; do_slow_link; fi
  if pid_alive "$RUN/slurmctld.pid"; then
    scancel --quiet --full --user="$SLURM_USER" 2>/dev/null || true
    scontrol shutdown >/dev/null 2>&1 || true
  fi
  local f
  for f in "$RUN"/slurmd-*.pid "$RUN/slurmctld.pid" "$RUN/slurmdbd.pid" "$RUN/mariadb.pid" "$DIR/munge/munged.pid"; do
    [ -e "$f" ] && stop_pidfile "$f" "$(basename "$f" .pid)"
  done
  log "down: $DIR"
}

# Every node of slurm.conf answers and is usable (no DOWN/DRAIN/FAIL, no `*` = not responding).
nodes_healthy() {
  local want states
  want=$(grep -c '^NodeName=node' "$CONF")
  states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u) || return 1
  [ "$(wc -l <<< "$states")" -ge "$want" ] || return 1
  ! awk '{print $2}' <<< "$states" | grep -Eqv '^(idle|alloc|mix|comp)$'
}

do_stop_ctld() {
  [ -f "$CONF" ] || die "no cluster configured in $DIR"
  pid_alive "$RUN/slurmctld.pid" || { log "slurmctld is not running in $DIR"; return 0; }
  stop_pidfile "$RUN/slurmctld.pid" slurmctld
  log "slurmctld stopped ($DIR); slurmd and jobs keep running"
}

do_start_ctld() {
  [ -f "$CONF" ] || die "no cluster configured in $DIR"
  local t0=$SECONDS
  start_munge
  if ! pid_alive "$RUN/slurmctld.pid"; then
    # No -c: recover jobs, nodes and the next job id from StateSaveLocation.
    slurmctld -i || die "slurmctld failed to start, see $LOGS/slurmctld.log"
  fi
  wait_for 30 slurmctld scontrol ping || { tail -n 20 "$LOGS/slurmctld.log" >&2; die "slurmctld did not answer"; }
  wait_for 90 "every node to respond" nodes_healthy || { sinfo -N >&2; die "nodes did not come back"; }
  log "slurmctld up again in $((SECONDS - t0))s ($DIR)"
}

do_status() {
  local f
  for f in "$DIR/munge/munged.pid" "$RUN"/*.pid; do
    [ -e "$f" ] || continue
    if pid_alive "$f"; then echo "$(basename "$f" .pid): running (pid $(cat "$f"))"; else echo "$(basename "$f" .pid): dead"; fi
  done
  [ -f "$CONF" ] && sinfo -N -o '%N %T %C %G' 2>/dev/null || true
}

case "$cmd" in
  install) do_install ;;
  up) do_up ;;
  down) do_down ;;
  status) do_status ;;
  env) [ -f "$DIR/env.sh" ] && cat "$DIR/env.sh" || die "no cluster configured in $DIR" ;;
  stop-ctld) do_stop_ctld ;;
  start-ctld) do_start_ctld ;;
  restart-ctld) do_stop_ctld; sleep "$DOWN_FOR"; do_start_ctld ;;
  slow-link) do_slow_link ;;
  *) die "unknown command '$cmd' (install|up|down|status|env|stop-ctld|start-ctld|restart-ctld|slow-link)" ;;
esac
