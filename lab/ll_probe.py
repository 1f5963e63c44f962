"""Lab probe (GPU, branch ll-flags): one step of the one launch with flagged words on
the edges named by LL's bits (x 1, attn 2, h 4), timed one launch at a time, so a step
that is slow (spins hammering the same L2 lines) reads apart from one that hangs.

    python lab/ll_probe.py LL [LL ...]
"""
import sys
import time

import torch

from onelaunch.engine import Engine
from onelaunch.megakernel.step import MegaStep
from onelaunch.weights import random_weights


def main():
    w = random_weights("qwen2.5-1.5b", 0, device="cuda")
    e = Engine("qwen2.5-1.5b", w, max_ctx=1024, pdl=True)
    for ll in (int(v) for v in sys.argv[1:]):
        mk = MegaStep(e, ctx=512, stages=6, poll=1, ll=ll, timeout_ns=20_000_000)
        e.pos.fill_(512)
        t0 = time.time()
        mk.run()
        torch.cuda.synchronize()
        print(f"[ll_probe] LL {ll}: first launch (compile + run) {time.time() - t0:.1f} s",
              flush=True)
        try:
            mk.check_stalls()
        except Exception as ex:
            print(f"[ll_probe] LL {ll}: {str(ex)[:300]}", flush=True)
        for _ in range(3):
            e.pos.fill_(512)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            mk.run()
            b.record()
            torch.cuda.synchronize()
            print(f"[ll_probe] LL {ll}: one launch {a.elapsed_time(b):.3f} ms", flush=True)
        try:
            mk.check_stalls()
        except Exception as ex:
            print(f"[ll_probe] LL {ll}: {str(ex)[:300]}", flush=True)
        del mk


if __name__ == "__main__":
    main()
