#!/usr/bin/env bash
# Spark GPU resource discovery (spark.worker/executor.resource.gpu.discoveryScript): prints
# {"name": "gpu", "addresses": [...]} for the GPUs this worker/executor may use.
# The addresses are CUDA device ordinals, which the RAPIDS plugin hands to cudaSetDevice: with
# CUDA_VISIBLE_DEVICES set (Slurm sets it to the job's GPUs, as indices or UUIDs) they are
# 0..n-1 of the visible list, not its entries (GPUs 4-7 of a node are devices 0-3 to the
# process); without it, every GPU nvidia-smi lists.
set -euo pipefail
ids=""
if [[ -n "${CUDA_VISIBLE_DEVICES+set}" ]]; then
    n=0
    IFS=',' read -r -a visible <<< "${CUDA_VISIBLE_DEVICES}"
    for dev in "${visible[@]}"; do
        dev=${dev// /}
        # "-1" or "NoDevFiles" hide every device, and nothing after a hidden one is visible
        [[ -n "$dev" && "$dev" != "-1" && "$dev" != NoDevFiles ]] || break
        ids+="$n "
        n=$((n + 1))
    done
else
    ids=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr '\n' ' ' || true)
fi
out=""
for id in $ids; do out+="${out:+,}\"$id\""; done
printf '{"name": "gpu", "addresses": [%s]}\n' "$out"
