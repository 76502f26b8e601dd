#!/usr/bin/env bash
# The GPU-node checks that need no TensorFlow (not run in CI): on a node with NVIDIA GPUs, does
# recsys.runtime.devices count the GPUs nvidia-smi lists, what Horovod build would the installer choose, and
# does the study sampler read every GPU's nvidia-smi row? Exit 0 when the detection agrees with
# nvidia-smi, 1 when not, 2 when no GPU is listed.
#   bash tests/gpu_node_check.sh            (from the repository root; python3 with PyYAML not needed)
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}

echo "== nvidia-smi -L"
smi=$(nvidia-smi -L 2>&1) || { echo "$smi"; echo "FAIL: nvidia-smi failed: no driver"; exit 2; }
echo "$smi"
listed=$(grep -c '^GPU [0-9]*:' <<<"$smi" || true)
[ "$listed" -gt 0 ] || { echo "FAIL: nvidia-smi lists no GPU"; exit 2; }

status=0
check() {   # label, env assignments...: run the detection, compare with the expected count
  local label=$1 want=$2; shift 2
  local out
  out=$(cd "$here" && env "$@" "$py" -m recsys.runtime.devices --expected 2>&1)
  local got
  got=$(sed -n 's/^expected=\([0-9a-z]*\) .*/\1/p' <<<"$out")
  if [ "$got" = "$want" ]; then echo "ok   $label: $(head -1 <<<"$out")"
  else echo "FAIL $label: expected=$want, got: $out"; status=1; fi
}
echo "== recsys.runtime.devices (no TensorFlow)"
# the bare node: nvidia-smi is the source; Slurm's and CUDA's variables cleared
check "nvidia-smi only" "$listed" -u CUDA_VISIBLE_DEVICES -u SLURM_STEP_GPUS -u SLURM_JOB_GPUS -u SLURM_GPUS_ON_NODE
check "CUDA_VISIBLE_DEVICES=0" 1 CUDA_VISIBLE_DEVICES=0
check "CUDA_VISIBLE_DEVICES='' hides them" 0 CUDA_VISIBLE_DEVICES=
check "Slurm step of all GPUs" "$listed" -u CUDA_VISIBLE_DEVICES SLURM_STEP_GPUS="$(seq -s, 0 $((listed - 1)))"
out=$(cd "$here" && "$py" -m recsys.runtime.devices --expected)
grep -q "^nvidia_smi=$listed\$" <<<"$out" || { echo "FAIL: recsys.runtime.devices counts nvidia-smi as: $out"; status=1; }
# no TensorFlow was imported for any of this
(cd "$here" && "$py" -c 'import sys, recsys.runtime.devices; sys.exit("tensorflow" in sys.modules)') \
  || { echo "FAIL: recsys.runtime.devices imported TensorFlow"; status=1; }

echo "== tests/install.sh --print-horovod-flags (detection only, nothing installed)"
flags=$(bash "$here/tests/install.sh" --print-horovod-flags) || { echo "FAIL: installer dry mode failed"; status=1; }
echo "$flags"
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  grep -q 'nvidia-smi lists no GPU' <<<"$flags" && { echo "FAIL: installer did not see the GPUs"; status=1; }
fi
echo "== install/user-env.sh --plan (what the install without root would do; nothing installed)"
bash "$here/install/user-env.sh" --plan || echo "note: the user-level install refuses this shell (above); load the MPI module first"

echo "== slurm/hwsample.py --once (the study sampler's nvidia-smi query on these GPUs)"
hwdir=$(mktemp -d)
if python3 "$here/slurm/hwsample.py" --out "$hwdir" --once; then
  python3 - "$hwdir" "$listed" <<'PY' || status=1
import glob, json, sys
[path] = glob.glob(sys.argv[1] + "/*.json")
sample = json.load(open(path))["samples"][-1]
gpus = sample.get("gpus") or []
want = int(sys.argv[2])
numbers = ("util_pct", "mem_used_mib", "power_w", "sm_mhz")
bad = [g for g in gpus if any(not isinstance(g.get(k), (int, float)) for k in numbers if k in g)]
print("   ", json.dumps(gpus[:2]), "..." if len(gpus) > 2 else "")
if len(gpus) != want or bad:
    print(f"FAIL: the sampler read {len(gpus)} GPU rows (want {want}); unparsed: {bad}")
    sys.exit(1)
print(f"ok   the sampler reads {want} GPU rows with numbers")
PY
else
  echo "FAIL: slurm/hwsample.py --once failed"; status=1
fi
rm -rf "$hwdir"

[ "$status" = 0 ] && echo "PASS: detection agrees with nvidia-smi ($listed GPU(s))"
exit "$status"
