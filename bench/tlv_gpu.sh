#!/usr/bin/env bash
# Two-level verification on one GPU machine, each step's result under DIR as it finishes (STEPS picks
# them, default all, in this order):
#   tests  the view-only W12 GEMM's GPU tests (tests/gpu/test_w12_gemm_cuda.py -k view_only)
#   qpass  bench/tlv.py qpass: the Q pass against the exact pass at the Llama-3.1-8B shape (eager)
#   gemm   bench/w12_gemm.py: cuBLAS, the bf16 and W12 GEMMs and the view-only W12 GEMM, in CUDA graphs
#   build  the zoo's small dense pair on the GPU (specpilot zoo build --preset small --roles dense → out/small)
#   tau    bench/tlv.py tau on out/small: TLV against best-first:32 on 164 HumanEval prompts, token forcing
# Usage (repository root, GPU machine, package installed): STEPS="qpass gemm" bash bench/tlv_gpu.sh DIR
# Then, here: python bench/tlv.py merge DIR --out bench/results/tlv.json
DEFAULT_STEPS="tests qpass gemm build tau"
source "$(dirname "$0")/gpu_steps.sh"
case $steps in *" tests "*)
    timeout "${TESTS_TIMEOUT:-240}" python -m pytest -q -p no:cacheprovider tests/gpu/test_w12_gemm_cuda.py -k view_only \
        >"$dir/gpu_tests.log" 2>&1
    log "GPU tests exit $?";;
esac
case $steps in *" qpass "*)
    timeout "${QPASS_TIMEOUT:-240}" python bench/tlv.py qpass --out-dir "$dir" >"$dir/qpass.log" 2>&1
    log "qpass exit $?";;
esac
case $steps in *" gemm "*)
    timeout "${GEMM_TIMEOUT:-300}" python bench/w12_gemm.py ${GEMM_ARGS:-} --out "$dir/w12_gemm.json" >"$dir/w12_gemm.log" 2>&1
    log "gemm exit $?";;
esac
case $steps in *" build "*)
    timeout "${BUILD_TIMEOUT:-560}" specpilot zoo build --preset small --roles dense --device cuda --out out/small \
        >"$dir/zoo_build.log" 2>&1
    log "build exit $?"
    cp out/small/zoo.json "$dir/zoo_small_dense.json" 2>/dev/null;;
esac
case $steps in *" tau "*)
    timeout "${TAU_TIMEOUT:-480}" python bench/tlv.py tau --zoo out/small --prompts "${PROMPTS:-164}" --out-dir "$dir" \
        >"$dir/tau.log" 2>&1
    log "tau exit $?";;
esac
finish
