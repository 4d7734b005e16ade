#!/usr/bin/env bash
# Batched decoding on one GPU machine, each part's output under DIR as it finishes:
#   equality  bench/batch_equality.py in float64 and bfloat16 (generate_batch against generate per request)
#   batching  bench/batching.py: tokens/s at each batch size, AR, the n-gram chain, a device block drafter
# Usage (repository root, GPU machine, package installed): bash bench/batching_gpu.sh DIR
set -uo pipefail
dir=${1:?usage: bash bench/batching_gpu.sh DIR}
mkdir -p "$dir"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >"$dir/gpu.txt" 2>&1
for d in float64 bfloat16; do
    timeout "${EQ_TIMEOUT:-150}" python bench/batch_equality.py "$d" 2>&1 | grep -v Warn >"$dir/equality_$d.txt"
done
timeout "${BENCH_TIMEOUT:-240}" python bench/batching.py --out "$dir/batching.json" ${BATCHES:+--batches $BATCHES} \
    >"$dir/batching.log" 2>&1
echo "batching exit $?" >>"$dir/batching.log"
