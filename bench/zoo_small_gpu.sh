#!/usr/bin/env bash
# The small set on one GPU machine, end to end, in the order its figures need:
#   0. the Triton delta rule the hybrid target trains with: its GPU tests (on a failure the build
#      trains the hybrid target with the torch rule instead, `--set triton_gdn=false`, and says so)
#      and its timing (bench/gdn_train_step.py);
#      KERNEL_CHECK=0 skips this step; PROFILE=1 adds the targets' training steps, profiled
#      (bench/zoo_target_sweep.py --profile, both roles, about 3 minutes);
#   1. `specpilot zoo build --preset small` alone on the GPU (its time is a bar: nothing else runs);
#   2. realism of the new targets and the shipped micro set (GPU), beside τ of every drafter
#      (bench/zoo_tau.py) and of every tree policy (bench/zoo_trees.py) on 164 HumanEval prompts —
#      continuations on the GPU, drafters replayed on the CPU cores, JOBS processes each;
#   3. the GPU tests, once realism is done (GPU_TESTS: the test path, default tests/gpu; 0 skips them).
# TAU=0 skips the tau bench. SWEEP: arguments for bench/zoo_block_sweep.py on the built set, run beside
# realism, τ and trees (e.g. SWEEP="--role dense --layers 2 --steps 3600 --copy 0,1"; 164 + 164 prompts),
# its result in zoo_block_sweep_small.json.
# Usage (repository root, GPU machine, package installed): bash bench/zoo_small_gpu.sh DIR
# BUILD_ARGS: more arguments for the build, e.g. "--set target_steps=4000"; JOBS (default 7) and
# TREE_JOBS (default JOBS): processes of the tau and the trees benches.
# DIR receives the results (zoo_*.json), the build's manifest and every log; `done` marks the end.
set -uo pipefail
dir=${1:?usage: bash bench/zoo_small_gpu.sh DIR}
jobs=${JOBS:-7}
mkdir -p "$dir"
export PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*" | tee -a "$dir/pipeline.log"; }

if [ "${KERNEL_CHECK:-1}" != 0 ]; then
    log "delta-rule kernels: GPU tests, timing"
    if ! python -m pytest -q -p no:cacheprovider tests/gpu/test_cuda.py -k triton >"$dir/gpu_tests_triton_h200.log" 2>&1; then
        log "the delta-rule kernels failed their GPU tests (see gpu_tests_triton_h200.log): building with the torch rule"
        BUILD_ARGS="${BUILD_ARGS:-} --set triton_gdn=false"
    fi
    python bench/gdn_train_step.py --device cuda --chunks 64 --warps 4,8 --no-compile \
        --out "$dir/gdn_train_step_h200.json" >"$dir/gdn_train_step.log" 2>&1
    log "kernel timing exit $?"
fi
if [ "${PROFILE:-0}" = 1 ]; then
    log "target steps, profiled"
    python bench/zoo_target_sweep.py --preset small --device cuda --role dense --role hybrid --time-only --profile \
        --set corpus=stdlib --out "$dir/zoo_train_step_profile_h200.json" >"$dir/target_steps.log" 2>&1
    log "target steps exit $?"
fi
log "build"
# shellcheck disable=SC2086  # BUILD_ARGS is split into words on purpose
if ! specpilot zoo build --preset small --device cuda --out out/small ${BUILD_ARGS:-} >"$dir/zoo_small_build.log" 2>&1; then
    log "build failed (see zoo_small_build.log)"
    touch "$dir/done"
    exit 1
fi
cp out/small/zoo.json "$dir/zoo_small_build_h200.json"
log "build done; realism, tau and trees"
SPECPILOT_COMPILE=0 python bench/zoo_realism.py --zoo out/small --baseline zoo/checkpoints/micro --device cuda \
    --out "$dir/zoo_realism.json" >"$dir/realism.log" 2>&1 &
realism=$!
if [ "${TAU:-1}" != 0 ]; then
    SPECPILOT_COMPILE=0 python bench/zoo_tau.py --zoo out/small --device cuda --replay-device cpu --prompts 164 \
        --jobs "$jobs" --out "$dir/zoo_tau_small_164.json" >"$dir/tau.log" 2>&1 &
fi
if [ -n "${SWEEP:-}" ]; then
    # shellcheck disable=SC2086  # SWEEP is split into words on purpose
    SPECPILOT_COMPILE=0 python bench/zoo_block_sweep.py --zoo out/small --device cuda ${SWEEP} --set eval_prompts=164 \
        --out "$dir/zoo_block_sweep_small.json" >"$dir/sweep.log" 2>&1 &
fi
SPECPILOT_COMPILE=0 python bench/zoo_trees.py --zoo out/small --device cuda --replay-device cpu --prompts 164 \
    --jobs "${TREE_JOBS:-$jobs}" --roles "${TREE_ROLES:-hybrid,dense}" --out "$dir/zoo_trees_small.json" >"$dir/trees.log" 2>&1 &
wait "$realism"; log "realism exit $?"
if [ "${GPU_TESTS:-tests/gpu}" != 0 ]; then
    # shellcheck disable=SC2086  # a list of test paths
    python -m pytest -q -p no:cacheprovider ${GPU_TESTS:-tests/gpu} >"$dir/gpu_tests_h200.log" 2>&1
    log "GPU tests exit $?"
fi
wait
log "all done"
touch "$dir/done"
