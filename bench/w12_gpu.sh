#!/usr/bin/env bash
# W12 and the certified head on one GPU machine, each step's result under DIR as it finishes:
#   tests   the kernels' GPU tests (tests/gpu/test_w12_gemm_cuda.py, test_certified_head_cuda.py) and
#           the engine's GPU tests with the weight formats
#   gemm    bench/w12_gemm.py: W12 GEMM and the bf16 streaming GEMM against cuBLAS, in CUDA graphs
#   head    bench/certified_head.py: the certified head against the dense one at 1, 8, 64 rows
#   ar hf force   bench/w12.py's parts (AR at the 8B shape through generate; Transformers; forcing)
# STEPS picks them (default: all, in that order); GEMM_ARGS adds options to w12_gemm.py (--no-sweep, say).
# Usage (repository root, GPU machine, package installed): STEPS="gemm head" bash bench/w12_gpu.sh DIR :
# DIR holds each step's JSON and logs.tar, every log.
DEFAULT_STEPS="tests gemm head ar hf force"
source "$(dirname "$0")/gpu_steps.sh"
case $steps in *" tests "*)
    python -m pytest -q -p no:cacheprovider ${GPU_TESTS:-tests/gpu/test_w12_gemm_cuda.py tests/gpu/test_certified_head_cuda.py} \
        >"$dir/gpu_tests.log" 2>&1
    log "GPU tests exit $?";;
esac
case $steps in *" gemm "*)
    # shellcheck disable=SC2086  # GEMM_ARGS: more options, split on purpose
    python bench/w12_gemm.py --out "$dir/w12_gemm.json" ${GEMM_ARGS:-} >"$dir/w12_gemm.log" 2>&1; log "gemm exit $?";;
esac
case $steps in *" head "*)
    python bench/certified_head.py --out "$dir/certified_head.json" >"$dir/certified_head.log" 2>&1; log "head exit $?";;
esac
parts=""
for p in ar hf force; do case $steps in *" $p "*) parts="$parts $p";; esac; done
if [ -n "$parts" ]; then
    # shellcheck disable=SC2086  # the part names, split on purpose
    python bench/w12.py $parts --out-dir "$dir" >"$dir/w12.log" 2>&1; log "w12.py$parts exit $?"
fi
finish
