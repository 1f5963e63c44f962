"""Tokens and step time of one engine build, for comparing two versions of the package
(run once with each on PYTHONPATH, in the same GPU session): free-running greedy tokens,
teacher-forced argmax over the same forced ids, and the graph step's median ms.

    python ci/engine_tokens.py MODEL CTX OUT.json [--pdl]
"""
import json
import sys

import torch

import onelaunch
from onelaunch.engine import Engine
from onelaunch.measure.timing import time_ms
from onelaunch.weights import random_weights


def main():
    model, ctx, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    pdl = "--pdl" in sys.argv
    w = random_weights(model, 0, device="cuda")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, w["model.embed_tokens.weight"].shape[0], (ctx,), generator=g)
    e = Engine(model, w, max_ctx=ctx + 32 + 300, attention="splitk", pdl=pdl)
    free = e.generate(prompt, 32)
    tf = e.teacher_forced(prompt, free)
    times = [time_ms(lambda: e.step(True), iters=100, warmup=10).median_ms for _ in range(2)]
    r = {"package": onelaunch.__file__, "model": model, "ctx": ctx, "pdl": e.pdl,
         "tokens": free.tolist(), "teacher_forced": tf.tolist(), "ms": times,
         "launches": e.launches_per_step()}
    json.dump(r, open(out, "w"))
    print(json.dumps(r))


if __name__ == "__main__":
    main()
