#!/usr/bin/env bash
# Spark GPU resource discovery: prints {"name":"gpu","addresses":[...]} for the GPUs
# this executor/worker may use (CUDA_VISIBLE_DEVICES when set, else all nvidia-smi sees).
set -euo pipefail
if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    ids=${CUDA_VISIBLE_DEVICES//,/ }
else
    ids=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr '\n' ' ' || true)
fi
out=""
for id in $ids; do out+="${out:+,}\"$id\""; done
printf '{"name": "gpu", "addresses": [%s]}\n' "$out"
