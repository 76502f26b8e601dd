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

# --- GPU build detection: CUDA (nvcc) and NCCL (nccl.h + a libnccl Horovod's FindNCCL.cmake
# links: libnccl.so or libnccl_static.a) -> Horovod with HOROVOD_GPU_OPERATIONS=NCCL and the
# [gpu] extra (tensorflow[and-cuda]); else the CPU build of today. RECSYS_HOROVOD_GPU=0 forces the
# CPU build. Sets horovod_flags (KEY=VALUE words) and tf_extra.
detect_gpu_build() {
  horovod_flags="HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_GLOO=1"
  tf_extra=train
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
  # tensorflow[and-cuda]==2.15.1 runs on CUDA 12.2 wheels: Horovod's GPU ops should be compiled by a
  # CUDA 12 nvcc too (set CUDA_HOME to one)
  local release
  release=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\)\..*/\1/p' | head -1 || true)
  if [ -n "$release" ] && [ "$release" != 12 ]; then
    gpu_reason="$gpu_reason; warning: nvcc is CUDA $release, TensorFlow $TF_VERSION is built for CUDA 12 (set CUDA_HOME to a CUDA 12 toolkit)"
  fi
  return 0
}

# The flags as JSON (one object: the KEY=VALUE words, the extra, why).
horovod_flags_json() {
  python3 -c 'import json, sys
flags = dict(w.split("=", 1) for w in sys.argv[1].split())
print(json.dumps({"horovod_version": sys.argv[2], "tensorflow_extra": sys.argv[3], "reason": sys.argv[4], "flags": flags}, sort_keys=True))' \
    "$horovod_flags" "$HOROVOD_VERSION" "$tf_extra" "$gpu_reason"
}

detect_gpu_build
if [ "${1:-}" = --print-horovod-flags ]; then   # dry mode: the detection only, nothing installed
  horovod_flags_json
  exit 0
fi

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
log "horovod build: $gpu_reason"
if [ "$tf_extra" = gpu ] && "$py" -m pip show -q tensorflow-cpu >/dev/null 2>&1; then
  log "replacing tensorflow-cpu by tensorflow[and-cuda] (they share one tensorflow/ directory)"
  "$py" -m pip uninstall -q -y tensorflow-cpu tensorflow
fi
log "pip install -e .[$tf_extra,preproc,nvtabular,dev]"
"$py" -m pip install -q -e "$here[$tf_extra,preproc,nvtabular,dev]"

# Horovod must be built against the installed TensorFlow with MPI, without
# build isolation (its build imports TensorFlow). Cache the wheel per TF version.
if ! "$py" -c 'import horovod.tensorflow' 2>/dev/null; then
  whl_dir=$cache/tf$TF_VERSION
  [ "$tf_extra" = gpu ] && whl_dir=$cache/tf$TF_VERSION-nccl   # never reuse the CPU wheel on a GPU node
  mkdir -p "$whl_dir"
  if ! ls "$whl_dir"/horovod-$HOROVOD_VERSION-*.whl >/dev/null 2>&1; then
    log "building horovod $HOROVOD_VERSION against TF $TF_VERSION (about 5 minutes on 2 cores): $horovod_flags"
    # shellcheck disable=SC2086  # the KEY=VALUE words, split on purpose (paths without spaces)
    env $horovod_flags MAKEFLAGS=-j2 \
      "$py" -m pip wheel -q --no-deps --no-build-isolation --no-cache-dir \
      -w "$whl_dir" horovod==$HOROVOD_VERSION
    horovod_flags_json > "$whl_dir/horovod-build.json"
  fi
  "$py" -m pip install -q --no-deps "$whl_dir"/horovod-$HOROVOD_VERSION-*.whl
  [ -f "$whl_dir/horovod-build.json" ] && cp "$whl_dir/horovod-build.json" "$venv/horovod-build.json"
  "$py" -m pip install -q cloudpickle psutil pyyaml packaging cffi
fi
"$py" -m pip check
[ -f "$venv/horovod-build.json" ] && log "horovod build flags ($venv/horovod-build.json): $(cat "$venv/horovod-build.json")"
log "environment ready: $venv"
