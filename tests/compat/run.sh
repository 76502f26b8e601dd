#!/usr/bin/env bash
# The TensorFlow compatibility run (docs/testing.md, "TensorFlow versions"): one small venv per
# stack, then a short train + evaluate of every model in each (tests/compat/matrix.py).
#
#   bash tests/compat/run.sh                     # the default stacks below
#   bash tests/compat/run.sh tf2.12 tf2.17-keras3  # some of them
#   bash tests/compat/run.sh --build-only          # only build / refresh the venvs
#   bash tests/compat/run.sh --horovod tf2.17-tfkeras  # also Horovod 0.28.1 and 2-rank mpirun runs
#   bash tests/compat/run.sh --srun tf2.17-tfkeras     # --horovod, and srun --mpi=pmix on a local Slurm
#   bash tests/compat/run.sh --horovod-only tf2.19-tfkeras  # only the Horovod build, allreduce and 2-rank runs
#   bash tests/compat/run.sh --horovod-only --horovod-without-xla-ops tf2.19-tfkeras
#       # Horovod 0.28.1 with horovod/tensorflow/xla_mpi_ops.cc left out of its build (TF 2.19+: docs/engine.md)
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

# What every stack needs besides TensorFlow: the engine's own imports (setup.cfg [train], at
# install/constraints.txt's versions; not installed with that file: each stack pins its own TensorFlow).
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
no_xla_ops=0
matrix_flags=()
chosen=()
for arg in "$@"; do
  case $arg in
    --build-only) build_only=1 ;;
    --horovod) horovod=1; matrix_flags+=(--horovod) ;;
    --srun) horovod=1; matrix_flags+=(--srun) ;;
    --horovod-only) horovod=1; matrix_flags+=(--horovod-only) ;;
    --horovod-without-xla-ops) no_xla_ops=1; horovod=1; matrix_flags+=(--horovod) ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
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
  # a Horovod already there is kept, unless it is not the build asked for (with / without the XLA ops)
  if "$venv/bin/python" -c 'import horovod.tensorflow' 2>/dev/null; then
    [[ $no_xla_ops == "$(cat "$venv/.horovod-noxla" 2>/dev/null || echo 0)" ]] && return 0
    "$venv/bin/python" -m pip uninstall -q -y horovod
  fi
  tf=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("tensorflow-cpu"))')
  local what=horovod==0.28.1 kind=""
  if [[ $no_xla_ops == 1 ]]; then
    # Horovod's XLA ops (off unless HOROVOD_ENABLE_XLA_OPS=1; the engine never sets it) include TensorFlow's
    # tf2xla headers, which TF 2.19+ wheels cannot compile (tensorflow/compiler/xla/client/xla_builder.h
    # moved, xla/stream_executor/gpu/tma_metadata.h needs LLVM headers the wheel lacks): the sdist with
    # that one source dropped from horovod/tensorflow/CMakeLists.txt. Never done by install/user-env.sh.
    local src=$cache/src/horovod-0.28.1-noxla
    if [[ ! -f $src/.patched ]]; then
      rm -rf "$src" && mkdir -p "$cache/src"
      "$venv/bin/python" -m pip download -q --no-deps --no-binary :all: -d "$cache/src" horovod==0.28.1
      tar -xzf "$cache/src/horovod-0.28.1.tar.gz" -C "$cache/src" && mv "$cache/src/horovod-0.28.1" "$src"
      grep -q 'horovod/tensorflow/xla_mpi_ops.cc' "$src/horovod/tensorflow/CMakeLists.txt"
      sed -i '\#horovod/tensorflow/xla_mpi_ops.cc#d' "$src/horovod/tensorflow/CMakeLists.txt"
      touch "$src/.patched"
    fi
    # pip builds a local directory in place: a fresh copy per TensorFlow (no CMake cache of another one)
    kind=-noxla what=$cache/tmp/horovod-0.28.1-noxla-tf$tf
    rm -rf "$what" && mkdir -p "$cache/tmp" && cp -r "$src" "$what"
  fi
  whl_dir=$cache/wheels/tf$tf$kind
  local build_log=$cache/wheels/horovod-0.28.1$kind-tf$tf.log failed=$venv/horovod-build-failed.txt
  rm -f "$failed"
  "$venv/bin/python" -m pip install -q 'setuptools<70' wheel
  if ! ls "$whl_dir"/horovod-0.28.1-*.whl >/dev/null 2>&1; then
    log "$name: building horovod 0.28.1 against TF $tf (5 to 10 minutes on 2 cores), log: $build_log"
    mkdir -p "$cache/wheels" "$cache/tmp"
    # the flags install/user-env.sh chooses for a CPU build (RECSYS_HOROVOD_GPU=0)
    if ! (cd /tmp && TMPDIR=$cache/tmp HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 \
          HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 MAKEFLAGS=-j2 nice -n 10 "$venv/bin/python" -m pip wheel \
          -v --no-deps --no-build-isolation --no-cache-dir -w "$whl_dir" "$what") >"$build_log" 2>&1; then
      # the first compiler / linker / Python error lines; the matrix reports them as the stack's Horovod row
      grep -m 5 -E 'error:|Error:|undefined reference|ImportError|ModuleNotFoundError' "$build_log" >"$failed" \
        || tail -n 5 "$build_log" >"$failed"
      log "$name: horovod 0.28.1 does not build against TF $tf (first errors in $failed, all in $build_log)"
      return 0
    fi
  fi
  "$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$whl_dir"/horovod-0.28.1-*.whl
  echo "$no_xla_ops" >"$venv/.horovod-noxla"
  # what Horovod's own requirements list (installed with --no-deps above)
  "$venv/bin/python" -m pip install -q cloudpickle psutil packaging cffi
  # built, but does it load against this TensorFlow? (the matrix reports the error as the stack's Horovod row)
  if ! PYTHONPATH=$repo TF_CPP_MIN_LOG_LEVEL=2 "$venv/bin/python" -c 'from recsys import tfcompat; tfcompat.prepare()
import horovod.tensorflow' >"$failed" 2>&1; then
    log "$name: horovod 0.28.1 built against TF $tf but does not import: $(tail -n 1 "$failed")"
  else
    rm -f "$failed"
  fi
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
