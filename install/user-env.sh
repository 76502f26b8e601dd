#!/usr/bin/env bash
# The install without root: a virtual environment with the tested training stack (setup.cfg's extras
# at install/constraints.txt's versions) and Horovod built
# against the MPI, CUDA and NCCL this shell has loaded (on a managed DGX node, its modules:
# `module load cuda nccl hpcx`). tests/install.sh (root, test machines) installs the test cluster's
# system packages, then runs this script. docs/dgx.md, "Bare metal without root".
#
#   bash install/user-env.sh [--venv DIR] [--python PY] [--extras LIST] [--plan | --print-horovod-flags | --print-cache-key]
#
# --extras: extras besides the TensorFlow one (e.g. preproc,dev); the TensorFlow extra is chosen
# here: [gpu] where CUDA, NCCL and a GPU are found, else [train]. --plan prints what would be done
# and installs nothing; --print-cache-key prints the Horovod wheel cache directory this shell's
# Python, MPI, CUDA and NCCL key to. Every refusal is one line and comes before anything is created.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${RECSYS_VENV:-$here/.venv}
python=python3
extras=""
mode=install
cache=${RECSYS_WHEEL_CACHE:-$HOME/.cache/recsys-submit/wheels}
HOROVOD_VERSION=0.28.1
TF_VERSION=2.15.1   # install/constraints.txt's tensorflow(-cpu)
constraints=$here/install/constraints.txt

log() { printf '[install %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() { printf 'install/user-env.sh: %s\n' "$*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case $1 in
    --venv) [ $# -ge 2 ] || die "--venv needs a directory"; venv=$2; shift 2 ;;
    --python) [ $# -ge 2 ] || die "--python needs an interpreter"; python=$2; shift 2 ;;
    --extras) [ $# -ge 2 ] || die "--extras needs a comma-separated list"; extras=$2; shift 2 ;;
    --plan) mode=plan; shift ;;
    --print-horovod-flags) mode=flags; shift ;;
    --print-cache-key) mode=key; shift ;;
    *) die "unknown argument '$1' (see the header of this script)" ;;
  esac
done
case $extras in *[!a-z0-9,_-]*) die "--extras '$extras': extras are names separated by commas" ;; esac

# --- GPU build detection: CUDA (nvcc) and NCCL (nccl.h + a libnccl Horovod's FindNCCL.cmake
# links: libnccl.so or libnccl_static.a) -> Horovod with HOROVOD_GPU_OPERATIONS=NCCL and the
# [gpu] extra (tensorflow[and-cuda]); else the CPU build. RECSYS_HOROVOD_GPU=0 forces the
# CPU build. Sets horovod_flags (KEY=VALUE words), tf_extra and gpu_key (the CUDA and NCCL build, for
# the wheel cache: cudaX.Y-ncclA.B.C-<cksum of their paths>).
detect_gpu_build() {
  horovod_flags="HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1"
  tf_extra=train
  gpu_key=""
  gpu_reason="no CUDA compiler (nvcc) found"
  [ "${RECSYS_HOROVOD_GPU:-}" = 0 ] && { gpu_reason="RECSYS_HOROVOD_GPU=0"; return 0; }
  local nvcc="" cand
  # an nvcc that runs (a wrapper script left by a partial CUDA install does not count)
  for cand in ${CUDA_HOME:+"$CUDA_HOME/bin/nvcc"} ${CUDA_PATH:+"$CUDA_PATH/bin/nvcc"} /usr/local/cuda/bin/nvcc "$(command -v nvcc || true)"; do
    [ -n "$cand" ] && [ -x "$cand" ] && "$cand" --version >/dev/null 2>&1 && { nvcc=$(readlink -f "$cand"); break; }
  done
  [ -n "$nvcc" ] || return 0
  # a CUDA toolkit alone (CPU build machines, CI) keeps the CPU build: a GPU must be listed, or
  # RECSYS_HOROVOD_GPU=1 asks for the NCCL build (a build node without GPUs)
  if [ "${RECSYS_HOROVOD_GPU:-}" != 1 ] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    gpu_reason="CUDA at $(cd "$(dirname "$nvcc")/.." && pwd) but nvidia-smi lists no GPU (RECSYS_HOROVOD_GPU=1 builds with NCCL anyway)"
    return 0
  fi
  local cuda_home nccl_inc="" nccl_lib="" link="" root dir
  cuda_home=$(cd "$(dirname "$nvcc")/.." && pwd)
  for root in ${HOROVOD_NCCL_HOME:+"$HOROVOD_NCCL_HOME"} ${NCCL_HOME:+"$NCCL_HOME"} "$cuda_home" /usr/local/nccl /usr; do
    [ -f "$root/include/nccl.h" ] || continue
    for dir in "$root/lib" "$root/lib64" "$root/lib/x86_64-linux-gnu" "$root/lib/aarch64-linux-gnu"; do
      if [ -e "$dir/libnccl_static.a" ]; then nccl_inc=$root/include; nccl_lib=$dir; link=STATIC; break 2; fi
      if [ -e "$dir/libnccl.so" ]; then nccl_inc=$root/include; nccl_lib=$dir; link=SHARED; break 2; fi
    done
  done
  if [ -z "$nccl_lib" ]; then
    gpu_reason="CUDA at $cuda_home but no NCCL (include/nccl.h with lib*/libnccl.so or libnccl_static.a; set NCCL_HOME)"
    # the nvidia-nccl-cu12 wheel (PyTorch, tensorflow[and-cuda]) ships lib/libnccl.so.2 only, which
    # Horovod's FindNCCL.cmake (find_library "nccl") does not pick up
    local wheel
    wheel=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__ or list(nvidia.nccl.__path__)[0]))' 2>/dev/null || true)
    if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ]; then
      gpu_reason="$gpu_reason; the NCCL wheel at $wheel has no lib/libnccl.so: ln -s libnccl.so.2 $wheel/lib/libnccl.so, then NCCL_HOME=$wheel"
    fi
    return 0
  fi
  horovod_flags="HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1 HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME=$cuda_home HOROVOD_NCCL_INCLUDE=$nccl_inc HOROVOD_NCCL_LIB=$nccl_lib HOROVOD_NCCL_LINK=$link"
  tf_extra=gpu
  gpu_reason="CUDA at $cuda_home, NCCL $nccl_lib ($link)"
  local cuda_version nccl_version
  cuda_version=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9.]*\),.*/\1/p' | head -1 || true)
  local part
  nccl_version=""
  for part in MAJOR MINOR PATCH; do
    nccl_version=$nccl_version${nccl_version:+.}$(sed -n "s/^#define NCCL_$part *\([0-9][0-9]*\).*/\1/p" "$nccl_inc/nccl.h" | head -1 || true)
  done
  gpu_key=cuda${cuda_version:-unknown}-nccl${nccl_version:-unknown}-$(printf '%s %s %s' "$cuda_home" "$nccl_lib" "$link" | cksum | cut -d' ' -f1)
  # tensorflow[and-cuda]==2.15.1 runs on CUDA 12.2 wheels: Horovod's GPU ops should be compiled by a
  # CUDA 12 nvcc too (set CUDA_HOME to one)
  local release
  release=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p' | head -1 || true)
  if [ -n "$release" ] && [ "$release" != 12 ]; then
    gpu_reason="$gpu_reason; warning: nvcc is CUDA $release, TensorFlow $TF_VERSION is built for CUDA 12 (set CUDA_HOME to a CUDA 12 toolkit)"
  fi
  return 0
}

# The flags as JSON (one object: the KEY=VALUE words, the extra, why, the MPI built against).
horovod_flags_json() {
  python3 -c 'import json, sys
flags = dict(w.split("=", 1) for w in sys.argv[1].split())
print(json.dumps({"horovod_version": sys.argv[2], "tensorflow_extra": sys.argv[3], "reason": sys.argv[4],
                  "mpicc": sys.argv[5] or None, "flags": flags}, sort_keys=True))' \
    "$horovod_flags" "$HOROVOD_VERSION" "$tf_extra" "$gpu_reason" "${mpicc:-}"
}

mpicc=$(command -v mpicc || true)
[ -n "$mpicc" ] && mpicc=$(readlink -f "$mpicc")
detect_gpu_build
if [ "$mode" = flags ]; then   # the detection only, nothing checked or installed
  horovod_flags_json
  exit 0
fi

# The Horovod wheel's cache directory: per TensorFlow version, Python (a cp310 wheel does not install
# on 3.11), build kind with the CUDA and NCCL it was compiled against, and MPI (a wheel built against
# one MPI does not run on another; the system MPI keeps the plain name). Needs pyver.
wheel_dir() {
  local dir=$cache/tf$TF_VERSION-cp${pyver/./}
  [ "$tf_extra" = gpu ] && dir=$dir-nccl-$gpu_key   # never reuse the CPU wheel on a GPU node, nor another CUDA's
  case ${mpicc:-} in
    ""|/usr/bin/*) ;;
    *) dir=$dir-mpi-$(printf '%s' "$mpicc" | cksum | cut -d' ' -f1) ;;
  esac
  printf '%s\n' "$dir"
}
if [ "$mode" = key ]; then     # the key only, nothing checked or installed
  command -v "$python" >/dev/null 2>&1 || die "--python $python: no such interpreter on PATH"
  pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  wheel_dir
  exit 0
fi

# --- what this machine can take: one line each, before anything is created -------------------
machine=$(uname -m)
[ "$machine" = x86_64 ] || die "$machine: the pinned TensorFlow $TF_VERSION wheels (tensorflow-cpu, tensorflow[and-cuda]) are for x86_64 only; on $machine use an NGC TensorFlow container for your architecture (docs/dgx.md, 'Container or bare metal')"
command -v "$python" >/dev/null 2>&1 || die "--python $python: no such interpreter on PATH"
pyver=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
case $pyver in
  3.9|3.10|3.11) ;;
  *) die "Python $pyver ($python): TensorFlow $TF_VERSION has wheels for Python 3.9-3.11 only; give --python python3.11 (e.g. 'module load python/3.11', 'uv python install 3.11', or conda), or use the NGC container (DGX OS 7 ships Python 3.12)" ;;
esac
horovod_ready=0
[ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import horovod.tensorflow' 2>/dev/null && horovod_ready=1
if [ $horovod_ready = 0 ]; then
  [ -n "$mpicc" ] || die "no mpicc on PATH: Horovod is built against your MPI; load it first (e.g. 'module load hpcx' or 'module load openmpi'), or install Open MPI's development package"
  command -v c++ >/dev/null 2>&1 || command -v g++ >/dev/null 2>&1 || die "no C++ compiler (c++ or g++) on PATH: Horovod is compiled; load a compiler module (e.g. 'module load gcc')"
  [ "$mode" = plan ] || mkdir -p "$cache" 2>/dev/null || die "cannot create the Horovod wheel cache $cache: set RECSYS_WHEEL_CACHE to a directory you may write"
fi
[ -e "$venv" ] && [ ! -x "$venv/bin/python" ] && die "--venv $venv exists and is not a virtual environment"
parent=$(dirname "$venv")
[ -w "$parent" ] || [ -x "$venv/bin/python" ] || die "--venv $venv: $parent is not writable by $(id -un)"

all_extras=$tf_extra${extras:+,$extras}
whl_dir=$(wheel_dir)

if [ "$mode" = plan ]; then
  printf 'user:        %s\nmachine:     %s\npython:      %s (%s)\nvenv:        %s\nextras:      %s (versions: %s)\nmpicc:       %s\nhorovod:     %s\nhorovod build: %s\nwheel cache: %s\n' \
    "$(id -un)" "$machine" "$python" "$pyver" "$venv" "$all_extras" "$constraints" "${mpicc:-none}" \
    "$([ $horovod_ready = 1 ] && echo "already in the venv" || echo "$HOROVOD_VERSION, $horovod_flags")" "$gpu_reason" "$whl_dir"
  exit 0
fi

# --- the environment ------------------------------------------------------------------
if [ ! -x "$venv/bin/python" ]; then
  log "creating $venv with $python (Python $pyver)"
  "$python" -m venv "$venv"
fi
py=$venv/bin/python
# pip < 26: pip 26 refuses merlin-dataloader 23.8.0, whose metadata names a git URL (in its own
# "dev" extra, never installed); pip 25.3 installs it.
"$py" -m pip install -q --upgrade 'pip<26' wheel 'setuptools<70'
log "horovod build: $gpu_reason"
if [ "$tf_extra" = gpu ] && "$py" -m pip show -q tensorflow-cpu >/dev/null 2>&1; then
  log "replacing tensorflow-cpu by tensorflow[and-cuda] (they share one tensorflow/ directory)"
  "$py" -m pip uninstall -q -y tensorflow-cpu tensorflow
fi
# setup.cfg's ranges at the tested versions (install/constraints.txt)
log "pip install -c install/constraints.txt -e .[$all_extras]"
"$py" -m pip install -q -c "$constraints" -e "$here[$all_extras]"

# Horovod must be built against the installed TensorFlow with MPI, without build isolation (its
# build imports TensorFlow). cmake comes from PyPI when the machine has none (no root needed).
# Checked again after the install above: a TensorFlow it changed needs Horovod built again.
if ! "$py" -c 'import horovod.tensorflow' 2>/dev/null; then
  [ -n "$mpicc" ] || die "no mpicc on PATH: Horovod is built against your MPI; load it first (e.g. 'module load hpcx' or 'module load openmpi')"
  mkdir -p "$whl_dir"
  if ! ls "$whl_dir"/horovod-$HOROVOD_VERSION-*.whl >/dev/null 2>&1; then
    command -v cmake >/dev/null 2>&1 || { log "no cmake on PATH: pip install cmake into $venv"; "$py" -m pip install -q 'cmake<4'; }
    log "building horovod $HOROVOD_VERSION against TF $TF_VERSION and $mpicc (about 5 minutes on 2 cores): $horovod_flags"
    # shellcheck disable=SC2086  # the KEY=VALUE words, split on purpose (paths without spaces)
    env $horovod_flags MAKEFLAGS=-j2 PATH="$venv/bin:$PATH" \
      "$py" -m pip wheel -q --no-deps --no-build-isolation --no-cache-dir \
      -w "$whl_dir" horovod==$HOROVOD_VERSION
    horovod_flags_json > "$whl_dir/horovod-build.json"
  fi
  "$py" -m pip install -q --no-deps "$whl_dir"/horovod-$HOROVOD_VERSION-*.whl
  [ -f "$whl_dir/horovod-build.json" ] && cp "$whl_dir/horovod-build.json" "$venv/horovod-build.json"
  "$py" -m pip install -q -c "$constraints" cloudpickle psutil pyyaml packaging cffi
fi
"$py" -m pip check
[ -f "$venv/horovod-build.json" ] && log "horovod build flags ($venv/horovod-build.json): $(cat "$venv/horovod-build.json")"
log "environment ready: $venv"
