# Sourced by the step scripts of one GPU machine (tlv_gpu.sh, w12_gpu.sh) after they set DEFAULT_STEPS:
# DIR from their first argument, `log`, the steps asked for (STEPS, default DEFAULT_STEPS) in `steps`,
# the GPU's clocks in DIR/gpu.txt; `finish` tars the logs (few files come back from a lent machine).
set -uo pipefail
dir=${1:?usage: bash $0 DIR}
mkdir -p "$dir"
export PYTHONUNBUFFERED=1
log() { echo "[$(date +%T)] $*" | tee -a "$dir/pipeline.log"; }
steps=" ${STEPS:-$DEFAULT_STEPS} "
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,clocks.max.sm --format=csv >"$dir/gpu.txt" 2>&1
finish() {
    log "all done"
    (cd "$dir" && tar cf logs.tar ./*.log ./*.txt && rm -f ./*.log ./*.txt)
}
