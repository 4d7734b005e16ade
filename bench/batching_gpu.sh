#!/usr/bin/env bash
# Batched decoding on one GPU machine, each part's output under DIR as it finishes (STEPS picks them,
# default all, in this order):
#   equality  bench/batch_equality.py in float64 and bfloat16 (generate_batch against generate per request)
#   batching  bench/batching.py: tokens/s at each batch size, AR, the n-gram chain, a device block drafter
#   rows      bench/batching.py with the block drafter verifying trees: equal per-request trees
#             (best-first:8) and a shared budget (shared:8:16) at batch 1 and 16 (capture + compile on CUDA)
#   admit     bench/batching.py with ragged token limits at batch 16, AR and the device block drafter, prompt
#             admission off and at ADMIT verify steps (default 2; prompts of PROMPT_LEN tokens, default 16: the
#             drafter's chain of draft length 8 feeds 9 prompt tokens a step, so they fit 2; AR feeds 1, so none fits)
#   build     the zoo's small dense pair on the GPU (specpilot zoo build --preset small --roles dense → out/small;
#             about 300 s on an H100), skipped when out/small/dense exists
#   zoo       bench/batching.py --zoo out/small: AR and the block + Markov drafter at batch 1 and 16 on HumanEval
#             prompts, once per tree in ZOO_TREES (default: chain best-first:16 shared:16:32), spec over AR per batch
#             (ZOO_MODES=block leaves AR out: its runs repeat across the trees; ZOO_PROFILE=1 adds each run's heaviest
#             operators per step, bench/batching.py --profile)
# Usage (repository root, GPU machine, package installed): bash bench/batching_gpu.sh DIR
set -uo pipefail
dir=${1:?usage: bash bench/batching_gpu.sh DIR}
mkdir -p "$dir"
export PYTHONUNBUFFERED=1
steps=" ${STEPS:-equality batching rows} "  # build and zoo only when asked for
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >"$dir/gpu.txt" 2>&1
case $steps in *" equality "*)
    for d in float64 bfloat16; do
        timeout "${EQ_TIMEOUT:-150}" python bench/batch_equality.py "$d" 2>&1 | grep -v Warn >"$dir/equality_$d.txt"
    done;;
esac
case $steps in *" batching "*)
    timeout "${BENCH_TIMEOUT:-240}" python bench/batching.py --out "$dir/batching.json" ${BATCHES:+--batches $BATCHES} \
        >"$dir/batching.log" 2>&1
    echo "batching exit $?" >>"$dir/batching.log";;
esac
case $steps in *" rows "*)
    for t in best-first:8 shared:8:16; do
        timeout "${ROWS_TIMEOUT:-120}" python bench/batching.py --modes block --tree "$t" --batches 1,16 \
            --out "$dir/rows_${t//:/_}.json" >"$dir/rows_${t//:/_}.log" 2>&1
        echo "rows $t exit $?" >>"$dir/rows_${t//:/_}.log"
    done;;
esac
case $steps in *" admit "*)
    for k in 0 "${ADMIT:-2}"; do
        timeout "${ADMIT_TIMEOUT:-150}" python bench/batching.py --modes ar,block --batches 16 --ragged --prompts 64 \
            --prompt-len "${PROMPT_LEN:-16}" --admit-steps "$k" --out "$dir/admit_$k.json" >"$dir/admit_$k.log" 2>&1
        echo "admit $k exit $?" >>"$dir/admit_$k.log"
    done;;
esac
case $steps in *" build "*)
    [ -d out/small/dense ] || timeout "${BUILD_TIMEOUT:-560}" specpilot zoo build --preset small --roles dense \
        --device cuda --out out/small >"$dir/zoo_build.log" 2>&1
    echo "build exit $?" >>"$dir/zoo_build.log";;
esac
case $steps in *" zoo "*)
    for t in ${ZOO_TREES:-chain best-first:16 shared:16:32}; do
        tree=$([ "$t" = chain ] || echo "--tree $t")
        timeout "${ZOO_TIMEOUT:-200}" python bench/batching.py --zoo out/small --modes "${ZOO_MODES:-ar,block}" $tree --draft-len 16 ${ZOO_PROFILE:+--profile} \
            --batches "${ZOO_BATCHES:-1,16}" --prompts "${PROMPTS:-164}" --out "$dir/zoo_${t//:/_}.json" \
            >"$dir/zoo_${t//:/_}.log" 2>&1
        echo "zoo $t exit $?" >>"$dir/zoo_${t//:/_}.log"
    done;;
esac
