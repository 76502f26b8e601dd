#!/usr/bin/env bash
# The TensorFlow compatibility run (docs/testing.md, "TensorFlow versions"): one small venv per
# stack, then a short train + evaluate of every model in each (tests/compat/matrix.py).
#
#   bash tests/compat/run.sh                     # the default stacks below
#   bash tests/compat/run.sh tf2.12 tf2.17-keras3  # some of them
#   bash tests/compat/run.sh --build-only          # only build / refresh the venvs
#   bash tests/compat/run.sh --horovod tf2.17-tfkeras  # also Horovod 0.28.1 and 2-rank mpirun runs
#   bash tests/compat/run.sh --srun tf2.17-tfkeras     # --horovod, and srun --mpi=pmix on a local Slurm
#
# With --horovod the runs hold /tmp/recsys-cluster.lock (one MPI / Slurm user at a time on a box).
# Venvs and pip's wheel cache live under ${XDG_CACHE_HOME:-~/.cache}/recsys-compat (override with
# RECSYS_COMPAT_CACHE); a venv is rebuilt only when its requirement line changes. The project is
# not installed into them: the runs put this checkout on PYTHONPATH, so they test the work tree.
# Not part of CI (building four TensorFlow venvs costs minutes on a 2-core machine).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${RECSYS_COMPAT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/recsys-compat}
python=${RECSYS_COMPAT_PYTHON:-python3}
export PIP_CACHE_DIR=$cache/pip PIP_DISABLE_PIP_VERSION_CHECK=1

# What every stack needs besides TensorFlow: the engine's own imports (setup.cfg [train]).
common="pyyaml==6.0.2 pandas==1.5.3 pyarrow==14.0.2"
# stack -> "pip requirements | tf-keras requirement installed with --no-deps (or empty)".
# numpy: TF 2.12 needs < 1.24, 2.13 <= 1.24.3, 2.14 - 2.17 < 2; 2.18 - 2.20 take 1.26 (pyarrow 14 needs numpy 1.x).
declare -A stacks=(
  [tf2.12]="tensorflow-cpu==2.12.1 numpy==1.23.5|"
  [tf2.13]="tensorflow-cpu==2.13.1 numpy==1.24.3|"
  [tf2.14]="tensorflow-cpu==2.14.1 numpy==1.26.4|"
  [tf2.15]="tensorflow-cpu==2.15.1 numpy==1.26.4|"
  [tf2.16-tfkeras]="tensorflow-cpu==2.16.2 numpy==1.26.4|tf-keras==2.16.0"
  [tf2.17-tfkeras]="tensorflow-cpu==2.17.1 numpy==1.26.4|tf-keras==2.17.0"
  [tf2.16-keras3]="tensorflow-cpu==2.16.2 numpy==1.26.4|"
  [tf2.17-keras3]="tensorflow-cpu==2.17.1 numpy==1.26.4|"
  [tf2.18-tfkeras]="tensorflow-cpu==2.18.1 numpy==1.26.4|tf-keras==2.18.0"
  [tf2.19-tfkeras]="tensorflow-cpu==2.19.1 numpy==1.26.4|tf-keras==2.19.0"
  [tf2.20-tfkeras]="tensorflow-cpu==2.20.0 numpy==1.26.4|tf-keras==2.20.1"
)
default="tf2.12 tf2.15 tf2.17-tfkeras tf2.17-keras3"

build_only=0
horovod=0
matrix_flags=()
chosen=()
for arg in "$@"; do
  case $arg in
    --build-only) build_only=1 ;;
    --horovod) horovod=1; matrix_flags+=(--horovod) ;;
    --srun) horovod=1; matrix_flags+=(--srun) ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) [[ -n ${stacks[$arg]+x} ]] || { echo "run.sh: unknown stack $arg (known: ${!stacks[*]})" >&2; exit 2; }
       chosen+=("$arg") ;;
  esac
done
[[ ${#chosen[@]} -gt 0 ]] || read -r -a chosen <<<"$default"

log() { echo "[compat $(date +%H:%M:%S)] $*" >&2; }

build() {   # build (or reuse) the venv of stack $1
  local name=$1 spec=${stacks[$1]}
  local reqs=${spec%%|*} nodeps=${spec#*|}
  local venv=$cache/venvs/$name stamp="$reqs $common | $nodeps"
  if [[ -x $venv/bin/python && "$(cat "$venv/.stamp" 2>/dev/null)" == "$stamp" ]]; then
    log "$name: cached venv $venv"
    return
  fi
  log "$name: building $venv ($stamp)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade 'pip<26'
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install -q $reqs $common
  # tf-keras declares `tensorflow` (not tensorflow-cpu) as a requirement: --no-deps keeps
  # pip from installing a second, full TensorFlow next to tensorflow-cpu.
  [[ -z $nodeps ]] || "$venv/bin/python" -m pip install -q --no-deps "$nodeps"
  echo "$stamp" >"$venv/.stamp"
}

with_horovod() {   # build Horovod against the venv's TensorFlow once (wheel cached per TF version), install it
  local name=$1 venv=$cache/venvs/$1 tf whl_dir
  # only where the engine runs (not on the Keras 3 stacks it refuses)
  PYTHONPATH=$repo "$venv/bin/python" -c 'import os; from recsys import tfcompat
raise SystemExit(0 if tfcompat.decide(tfcompat.detect(), os.environ).ok else 1)' || return 0
  "$venv/bin/python" -c 'import horovod.tensorflow' 2>/dev/null && return 0
  tf=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu"))')
  whl_dir=$cache/wheels/tf$tf
  "$venv/bin/python" -m pip install -q 'setuptools<70' wheel
  if ! ls "$whl_dir"/horovod-0.28.1-*.whl >/dev/null 2>&1; then
    log "$name: building horovod 0.28.1 against TF $tf (5 to 10 minutes on 2 cores)"
    (cd /tmp && HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
      HOROVOD_WITHOUT_GLOO=1 MAKEFLAGS=-j2 "$venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation \
      --no-cache-dir -w "$whl_dir" horovod==0.28.1)
  fi
  "$venv/bin/python" -m pip install -q --no-deps "$whl_dir"/horovod-0.28.1-*.whl
  # what Horovod's own requirements list (installed with --no-deps above)
  "$venv/bin/python" -m pip install -q cloudpickle psutil packaging cffi
}

start=$(date +%s)
for name in "${chosen[@]}"; do build "$name"; done
if [[ $horovod == 1 ]]; then for name in "${chosen[@]}"; do with_horovod "$name"; done; fi
log "venvs ready in $(( $(date +%s) - start )) s"
[[ $build_only == 1 ]] && exit 0

args=()
for name in "${chosen[@]}"; do args+=("$name=$cache/venvs/$name/bin/python"); done
matrix=("$python" "$here/matrix.py" --repo "$repo" --out "${RECSYS_COMPAT_OUT:-$cache/results}" "${matrix_flags[@]}"
        "${args[@]}")
if [[ $horovod == 1 ]]; then exec flock /tmp/recsys-cluster.lock "${matrix[@]}"; fi
exec "${matrix[@]}"
