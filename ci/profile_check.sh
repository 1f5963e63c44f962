#!/usr/bin/env bash
# Where each rung's step time goes, on the GPU: for each model,
# `python -m onelaunch.profile` checks every rung against the oracle, replays its CUDA
# graph under torch.profiler and attributes the kernels to the plan's launches; it
# writes the rows (with commit and device) and the figure under $OUT/profile/.
#   OUT=DIR bash ci/profile_check.sh [MODELS]     MODELS: comma list (default both)
#   env: CTX (512), REPLAYS (20), TRACES=1 keeps each rung's Chrome trace (tar.gz),
#        PYTHON (python3), LIMIT (seconds per try, 420)
# A try that fails other than by a refused rung (exit 1) or for want of a GPU (exit 2;
# 3: kernels not attributed, or a crash) is tried once more with
# --cupti-warmup (PyTorch's workaround for graphs captured before the profiler's first
# use), its files named *_warmup.*. The script's exit status is the last failing try's.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/onelaunch-out}
D=$OUT/profile
mkdir -p "$D"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
CTX=${CTX:-512}
REPLAYS=${REPLAYS:-20}
LIMIT=${LIMIT:-420}
MODELS=${1:-qwen2.5-1.5b,olmoe-1b-7b}
status=0
try() {  # try MODEL SUFFIX [EXTRA ARGS]: one run of the profile, logged; returns its status
  local m=$1 sfx=$2; shift 2
  local base=$D/$m$sfx traces=()
  [ "${TRACES:-0}" = 1 ] && traces=(--trace-dir "$base.traces")
  echo "=== profile $m$sfx ($(date +%T))"
  timeout "$LIMIT" "$PY" -m onelaunch.profile --model "$m" --ctx "$CTX" --replays "$REPLAYS" \
    --json "$base.json" --png "$base.png" "${traces[@]}" "$@" > "$base.log" 2>&1
  local rc=$?
  tail -n 40 "$base.log"
  if [ -d "$base.traces" ]; then
    tar czf "$base.traces.tar.gz" -C "$D" "$(basename "$base.traces")" && rm -rf "$base.traces"
  fi
  echo "=== profile $m$sfx rc=$rc ($(date +%T))"
  return $rc
}
for m in ${MODELS//,/ }; do
  try "$m" ""
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 1 ] && [ $rc -ne 2 ]; then   # 2: no GPU
    try "$m" _warmup --cupti-warmup
    rc=$?
  fi
  [ $rc -ne 0 ] && status=$rc
done
exit $status
