#!/usr/bin/env bash
# Installs everything the test suite needs on a fresh Debian machine (as root):
# the Slurm/MPI/Java system packages and a virtual environment with the
# pinned training + preprocessing stack. Idempotent and cached, so a second
# run takes seconds. Used by tests/run.sh (README's test command) and .ci/run.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${RECSYS_VENV:-$here/.venv}
cache=${RECSYS_WHEEL_CACHE:-$HOME/.cache/recsys-submit/wheels}
HOROVOD_VERSION=0.28.1
TF_VERSION=2.15.1

log() { printf '[install %(%H:%M:%S)T] %s\n' -1 "$*"; }

# --- system packages: the Slurm cluster's (munge, slurmdbd, MariaDB, Open MPI
# with PMIx, numactl) plus Horovod's build tools and Java for Spark -------
bash "$here/slurm/dev/local-cluster.sh" install cmake g++ openjdk-17-jre-headless procps

# --- Python environment ------------------------------------------------
if [ ! -x "$venv/bin/python" ]; then
  log "creating $venv"
  python3 -m venv "$venv"
fi
py=$venv/bin/python
# pip < 26: pip 26 refuses merlin-dataloader 23.8.0, whose metadata names a git URL (in its own
# "dev" extra, never installed); pip 25.3 installs it.
"$py" -m pip install -q --upgrade 'pip<26' wheel 'setuptools<70'
log "pip install -e .[train,preproc,nvtabular,dev]"
"$py" -m pip install -q -e "$here[train,preproc,nvtabular,dev]"

# Horovod must be built against the installed TensorFlow with MPI, without
# build isolation (its build imports TensorFlow). Cache the wheel per TF version.
if ! "$py" -c 'import horovod.tensorflow' 2>/dev/null; then
  whl_dir=$cache/tf$TF_VERSION
  mkdir -p "$whl_dir"
  if ! ls "$whl_dir"/horovod-$HOROVOD_VERSION-*.whl >/dev/null 2>&1; then
    log "building horovod $HOROVOD_VERSION against TF $TF_VERSION (about 5 minutes on 2 cores)"
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
    HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 MAKEFLAGS=-j2 \
      "$py" -m pip wheel -q --no-deps --no-build-isolation --no-cache-dir \
      -w "$whl_dir" horovod==$HOROVOD_VERSION
  fi
  "$py" -m pip install -q --no-deps "$whl_dir"/horovod-$HOROVOD_VERSION-*.whl
  "$py" -m pip install -q cloudpickle psutil pyyaml packaging cffi
fi
"$py" -m pip check
log "environment ready: $venv"
