#!/usr/bin/env bash
# Everything the GPU issues need, checked and timed in one call on the GPU machine.
#   bash ci/gpu_run.sh [STAGES]      STAGES: comma list of
#     env      nvidia-smi and versions
#     check    oracle vs Hugging Face at full shapes (both models)
#     tune     launch-configuration sweep of the GEMV kernels
#     bench    per-kernel check+timing, the ladder rungs at ctx 512, the context sweep,
#              and greedy agreement at ctx 32768
#     peers    the peer rungs (HF eager/static, oracle eager/compiled) in the same run
#     cli      `python -m onelaunch bench`: the peers and every engine rung in one process,
#              so every ratio (to the floor and to the best peer) comes from one run
#     ladder   the same without the peers (the engine's rungs only: about a minute)
#     pytest   the GPU-marked tests
#     tokens   the engine before and after a refactor, same session: tokens and step time
#              (carry .old = `git archive OLD onelaunch | tar -x -C .old`)
#     moe      OLMoE: the plan's per-op times, the ladder, the context sweep, agreement at 4000
#     moepeers OLMoE: the peers and the ladder rungs in one process
#     moetune  OLMoE: launch configurations tried in the whole step, checked, the fastest
#              written to kernels/tuned/<arch>.json keyed by weight shape
#     qwenops  Qwen: the plan's per-op times and the ladder rungs
#     tppeer   2 GPUs: the fused peer kernels against the unfused path, bit for bit, and
#              their cost per call inside a graph (ci/tp_peer_check.py)
#     tp       2 GPUs: `bench --tp 2` for both models (the one-GPU step, every all-reduce
#              rung and the compute-only split, one run each)
#     tpgen    2 GPUs: `generate --tp 2 --check` (fused and nccl), and --tp 2 on one GPU
#     tpfix    2 GPUs: the fused down projection alone (ci/tp_peer_check.py, downs only),
#              then Qwen's fused rung in the whole step (`bench --tp 2 --tp-rungs fused`)
#     splitcap Qwen and OLMoE: the long contexts with the live splits capped or not
#     attn     Qwen: the step at ctx 512 in an engine for 1024 positions and one for the
#              default maximum (each checked, then timed; their ratio), the context sweep,
#              and the one-kernel attention's bit-identity tests compiled on the GPU
#     stream   Qwen: the persistent layer with its GEMV phases streamed through shared memory
#              (stream_gemv), several stages/tiles/grids, each bit-checked then timed
#     clock    both models: the persistent layer's per-phase clock (--persist clock=1,
#              ci/persistent_check.py: span, work, skew and release of every phase), with the
#              table's PDL setting and with PDL forced on (about 4 minutes)
#     fold     Qwen: the persistent layer with RoPE folded into its attention phase
#              (--persist fold_rope=1) against the table's, each with the phases'
#              clock, bit-checked then timed (about 2 minutes)
#     hold     Gluon probe: weight tiles held in shared memory through an idle stretch,
#              against the same tiles requested after it; each checked, then timed
#              (ci/hold_probe.py, under a minute)
#     book     every chapter through papermill with the GPU parameters (ci/gpu_book.sh)
#     profile  both models: each rung's step under torch.profiler, per op: the time its
#              bytes need and the time beyond (ci/profile_check.sh; rows and figures in $OUT/profile)
# Results and logs go to $OUT (one archive, gpu-run.tar.gz, plus the last log).
set -uo pipefail
cd "$(dirname "$0")/.."
STAGES=${1:-env,check,bench,peers}
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
has tune && run tune 330 python3 -m onelaunch.bench --what sweepcfg --write-table --json work/tune.json && cp -r onelaunch/kernels/tuned work/ 2>/dev/null
has bench && run bench 400 python3 -m onelaunch.bench --what kernels,ladder,sweep,long --json work/bench.json
has peers && run peers 400 python3 -c "
import json
from onelaunch.peers import peer_rungs
rows = peer_rungs('qwen2.5-1.5b', ctx=512, device='cuda')
for r in rows: print(json.dumps(r))
json.dump(rows, open('work/peers.json', 'w'), indent=1)
"
has cli && run cli 420 python3 -m onelaunch bench --model qwen2.5-1.5b --ctx 512 --json work/cli_bench.json
has ladder && run ladder 300 python3 -m onelaunch bench --model qwen2.5-1.5b --ctx 512 --no-peers --json work/ladder_bench.json
has tokens && [ -d .old/onelaunch ] && for v in old new old new; do
  if [ $v = old ]; then pp=$PWD/.old; else pp=$PWD; fi
  run tokens_$v 150 env PYTHONPATH=$pp python3 ci/engine_tokens.py qwen2.5-1.5b 512 work/tokens_$v.json --pdl
done
has moe && run moe 300 python3 -m onelaunch.bench --model olmoe-1b-7b --what ops,ladder,sweep,long --json work/olmoe_bench.json
has moetune && run moetune 420 python3 -m onelaunch.bench --model olmoe-1b-7b --what sweepplan --write-table --json work/olmoe_plan_sweep.json && cp -r onelaunch/kernels/tuned work/
has qwenops && run qwenops 240 python3 -m onelaunch.bench --model qwen2.5-1.5b --what ops,ladder --json work/qwen_ops.json
has moepeers && run moepeers 500 python3 -m onelaunch.bench --model olmoe-1b-7b --what peers,ladder --json work/olmoe_peers.json
has pytest && run pytest 500 python3 -m pytest -q -m gpu tests
has tppeer && run tppeer 240 python3 ci/tp_peer_check.py
has tp && run tp_qwen 420 python3 -m onelaunch bench --model qwen2.5-1.5b --tp 2 --ctx 512 --json work/tp_qwen.json
has tp && run tp_olmoe 420 python3 -m onelaunch bench --model olmoe-1b-7b --tp 2 --ctx 512 --json work/tp_olmoe.json
has tpgen && run tpgen_fused 240 python3 -m onelaunch generate --model qwen2.5-1.5b --tp 2 --prompt-len 512 --tokens 32 --check
has tpgen && run tpgen_nccl 240 python3 -m onelaunch generate --model olmoe-1b-7b --tp 2 --tp-rung nccl --prompt-len 256 --tokens 16 --check
has tpgen && run tp_one_gpu 60 env CUDA_VISIBLE_DEVICES=0 python3 -m onelaunch bench --model qwen2.5-1.5b --tp 2
has tpfix && run tpfix_down 120 env TP_CHECK_ONLY=down TP_CHECK_WATCHDOG_S=100 python3 ci/tp_peer_check.py
has tpfix && run tpfix_qwen 200 python3 -m onelaunch bench --model qwen2.5-1.5b --tp 2 --tp-rungs fused --ctx 512 --timeout 180 --json work/tp_qwen_fused.json
has splitcap && run splitcap_qwen 240 python3 -m onelaunch.bench --model qwen2.5-1.5b --what splitcap --json work/splitcap_qwen.json
has splitcap && run splitcap_olmoe 150 python3 -m onelaunch.bench --model olmoe-1b-7b --what splitcap --json work/splitcap_olmoe.json
has profile && run profile 900 bash ci/profile_check.sh
has attn && run attn_maxctx 300 python3 -m onelaunch.bench --model qwen2.5-1.5b --what maxctx --json work/attn_maxctx.json
has attn && run attn_sweep 400 python3 -m onelaunch.bench --model qwen2.5-1.5b --what sweep --json work/attn_sweep.json
has attn && run attn_tests 300 python3 -m pytest -q tests/test_attention_onekernel.py
has stream && run stream 560 python3 ci/persistent_check.py work/persistent_stream.json --timeout 110 --variants "${STREAM_VARIANTS:-4:4:8x512:2,4:6:8x512:2,8:8:8x512:1,4:3:16x512:2,8:4:16x512:1}"
for m in qwen2.5-1.5b olmoe-1b-7b; do   # the phases' clock, with the table's PDL and with PDL on
  has clock && run clock_${m%%-*} 120 python3 ci/persistent_check.py work/clock_$m.json --model $m --timeout 100 --variants 4:4::2 --persist clock=1
  has clock && run clock_${m%%-*}_pdl 120 python3 ci/persistent_check.py work/clock_${m}_pdl.json --model $m --timeout 100 --variants 4:4::2 --persist clock=1,pdl=1
done
for f in 0 1; do   # RoPE in its own phase (the table) and folded into attention
  has fold && run fold_qwen_$f 150 python3 ci/persistent_check.py work/fold_qwen_$f.json --timeout 110 --variants 4:4::2 --persist fold_rope=$f,clock=1
done
has hold && run hold 240 python3 ci/hold_probe.py work/hold.json
has book && run book 560 bash ci/gpu_book.sh "$OUT/book-gpu.tar.gz"
cp "$LOG" "$OUT/" 2>/dev/null
tar czf "$OUT/gpu-run.tar.gz" work results 2>/dev/null
echo "packed: $(ls -la $OUT)"
