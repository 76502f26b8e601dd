#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine (as root): the Slurm/MPI/Java
# system packages of the test cluster, then the user-level environment (install/user-env.sh: a
# virtual environment with the pinned training + preprocessing stack and Horovod built against
# TensorFlow and MPI). Idempotent and cached, so a second run takes seconds. Used by tests/run.sh
# (README's test command) and .ci/run. `--print-horovod-flags`: the Horovod build choice only.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = --print-horovod-flags ]; then
  exec bash "$here/install/user-env.sh" --print-horovod-flags
fi

# --- system packages: the Slurm cluster's (munge, slurmdbd, MariaDB, Open MPI
# with PMIx, numactl) plus Horovod's build tools, Java for Spark, and tc and iptables for a link
# slowed on purpose (local-cluster.sh slow-link) -------
bash "$here/slurm/dev/local-cluster.sh" install cmake g++ openjdk-17-jre-headless procps iproute2 iptables

# --- the Python environment: the same command a user without root runs -----
exec bash "$here/install/user-env.sh" --venv "${RECSYS_VENV:-$here/.venv}" --extras preproc,nvtabular,dev
