"""Lab probe (GPU): does a refactor move the engine's tokens or its step time? Tokens and
step time of one engine build, for comparing two versions of the package (run once with
each on PYTHONPATH, in the same GPU call): free-running greedy tokens, teacher-forced
argmax over the same forced ids, and the graph step's median ms.

    PYTHONPATH=OLD python lab/engine_tokens.py MODEL CTX OUT.json [--pdl]
    PYTHONPATH=NEW python lab/engine_tokens.py MODEL CTX OUT.json [--pdl] [--plain]
    bash ci/gpu_run.sh tokens     # both, twice each (carry .old: the older package)

Measured (`results/h200/2026-12-01_megakernel-mlp-stream/engine_tokens_*.json`: the
package at 68230ea against the one with the input checks and path reports): the checks
left 32 free-running and 32 teacher-forced tokens bit-identical for both models and the
step within 0.1% (Qwen 1.184 ms, OLMoE 1.009 ms with PDL at ctx 512).
"""
import json
import sys

import torch

import onelaunch
from onelaunch.engine import Engine
try:
    from onelaunch.measure.timing import time_ms
except ImportError:                     # a package from before measure/ (534f072)
    from onelaunch.timing import time_ms
from onelaunch.weights import random_weights


def main():
    model, ctx, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    pdl = "--pdl" in sys.argv
    attention = "plain" if "--plain" in sys.argv else "splitk"    # the fused + graph rung
    w = random_weights(model, 0, device="cuda")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, w["model.embed_tokens.weight"].shape[0], (ctx,), generator=g)
    e = Engine(model, w, max_ctx=ctx + 32 + 300, attention=attention, pdl=pdl)
    free = e.generate(prompt, 32)
    tf = e.teacher_forced(prompt, free)
    times = [time_ms(lambda: e.step(True), iters=100, warmup=10).median_ms for _ in range(2)]
    r = {"package": onelaunch.__file__, "model": model, "ctx": ctx, "pdl": e.pdl,
         "attention": attention,
         "tokens": free.tolist(), "teacher_forced": tf.tolist(), "ms": times,
         "launches": e.launches_per_step()}
    json.dump(r, open(out, "w"))
    print(json.dumps(r))


if __name__ == "__main__":
    main()
