#!/usr/bin/env bash
# The GPU run: the package's checks and measurements in one call on a machine with GPUs,
# each stage time-limited and logged, never fatal; results and logs in one archive.
#   bash ci/gpu_run.sh [STAGES]      STAGES: comma list (default env,check,bench,cli) of
#     env       nvidia-smi and versions
#     check     oracle vs Hugging Face at full shapes (both models)
#     tune      launch-configuration sweeps written to kernels/tuned/<arch>.json (Qwen's
#               GEMVs, then OLMoE's whole step keyed by weight shape)
#     bench     Qwen: per-kernel check+timing, the ladder at ctx 512, the context sweep,
#               greedy agreement at ctx 32768
#     moe       OLMoE: the plan's per-op times, the ladder, the context sweep, agreement
#     cli       `python -m onelaunch bench` for Qwen: the peers and every engine rung in
#               one process, so every ratio comes from one run
#     moepeers  OLMoE: the peers and the ladder rungs in one process
#     llama     llama.cpp: build llama-bench (ci/llama_build.sh; carry .llama/src.tar.gz),
#               then the llama.cpp peer for both models (GGUFs of the run's weights);
#               runs before cli and moepeers, which then include it among the peers
#     pytest    the GPU-marked tests
#     tokens    the engine before and after a refactor, same run: tokens and step
#               time (lab/engine_tokens.py; carry .old = `git archive OLD onelaunch |
#               tar -x -C .old`)
#     tp        2 GPUs: `bench --tp 2` for both models
#     tpgen     2 GPUs: `generate --tp 2 --check` (fused and nccl), and --tp 2 on one GPU
#     profile   both models: each rung's step under torch.profiler, per op
#               (ci/profile_check.sh; rows and figures in $OUT/profile)
#     book      every chapter through papermill with the GPU parameters (ci/gpu_book.sh)
#     lab       one lab probe, LAB='python3 lab/PROBE.py work/OUT.json ...' (LAB_S
#               seconds, default 560): each probe's header says its command
# Results and logs go to $OUT (one archive, gpu-run.tar.gz, plus the last log).
set -uo pipefail
cd "$(dirname "$0")/.."
STAGES=${1:-env,check,bench,cli}
OUT=${OUT:-/tmp/onelaunch-out}
mkdir -p "$OUT" work
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LOG=work/gpu_run.log
: > "$LOG"
run() {  # run NAME TIMEOUT CMD...: time-limited, logged, never fatal
  local name=$1 t=$2; shift 2
  echo "=== $name ($(date +%T))" | tee -a "$LOG"
  timeout "$t" "$@" 2>&1 | tee work/$name.log >> "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "=== $name rc=$rc ($(date +%T))" | tee -a "$LOG"
  tail -n 25 work/$name.log
  tar czf "$OUT/gpu-run.tar.gz" work results 2>/dev/null   # what is done so far comes back
}
has() { [[ ",$STAGES," == *",$1,"* ]]; }
has env && run env 60 bash -c 'nvidia-smi; python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.get_device_name())"'
has check && run check_qwen 240 python3 -m onelaunch check --model qwen2.5-1.5b --device cuda --prompt-len 128 --tokens 12
has check && run check_olmoe 240 python3 -m onelaunch check --model olmoe-1b-7b --device cuda --prompt-len 128 --tokens 12
has tune && run tune 330 python3 -m onelaunch bench --model qwen2.5-1.5b --what sweepcfg --write-table --json work/tune.json && cp -r onelaunch/kernels/tuned work/ 2>/dev/null
has tune && run moetune 420 python3 -m onelaunch bench --model olmoe-1b-7b --what sweepplan --write-table --json work/olmoe_plan_sweep.json && cp -r onelaunch/kernels/tuned work/
has bench && run bench 400 python3 -m onelaunch bench --model qwen2.5-1.5b --what kernels,ladder,sweep,long --json work/bench.json
has moe && run moe 300 python3 -m onelaunch bench --model olmoe-1b-7b --what ops,ladder,sweep,long --json work/olmoe_bench.json
if has llama; then
  run llama_build 600 bash ci/llama_build.sh build 90-real
  python3 -c "import gguf" 2>/dev/null || export PYTHONPATH=$PYTHONPATH:$PWD/.llama/src/gguf-py
  run llama_qwen 400 python3 -m onelaunch bench --model qwen2.5-1.5b --what peers --peers llama.cpp --json work/llama_qwen.json
  run llama_olmoe 500 python3 -m onelaunch bench --model olmoe-1b-7b --what peers --peers llama.cpp --json work/llama_olmoe.json
fi
has cli && run cli 420 python3 -m onelaunch bench --model qwen2.5-1.5b --ctx 512 --json work/cli_bench.json
has moepeers && run moepeers 500 python3 -m onelaunch bench --model olmoe-1b-7b --what peers,ladder --json work/olmoe_peers.json
has tokens && [ -d .old/onelaunch ] && for v in old new old new; do
  if [ $v = old ]; then pp=$PWD/.old; else pp=$PWD; fi
  run tokens_$v 150 env PYTHONPATH=$pp python3 lab/engine_tokens.py qwen2.5-1.5b 512 work/tokens_$v.json --pdl
done
has pytest && run pytest 500 python3 -m pytest -q -m gpu tests
has tp && run tp_qwen 420 python3 -m onelaunch bench --model qwen2.5-1.5b --tp 2 --ctx 512 --json work/tp_qwen.json
has tp && run tp_olmoe 420 python3 -m onelaunch bench --model olmoe-1b-7b --tp 2 --ctx 512 --json work/tp_olmoe.json
has tpgen && run tpgen_fused 240 python3 -m onelaunch generate --model qwen2.5-1.5b --tp 2 --prompt-len 512 --tokens 32 --check
has tpgen && run tpgen_nccl 240 python3 -m onelaunch generate --model olmoe-1b-7b --tp 2 --tp-rung nccl --prompt-len 256 --tokens 16 --check
has tpgen && run tp_one_gpu 60 env CUDA_VISIBLE_DEVICES=0 python3 -m onelaunch bench --model qwen2.5-1.5b --tp 2
has profile && run profile 900 bash ci/profile_check.sh
has lab && [ -n "${LAB:-}" ] && run lab "${LAB_S:-560}" bash -c "$LAB"
has book && run book 560 bash ci/gpu_book.sh "$OUT/book-gpu.tar.gz"
cp "$LOG" "$OUT/" 2>/dev/null
tar czf "$OUT/gpu-run.tar.gz" work results 2>/dev/null
echo "packed: $(ls -la $OUT)"
