"""The gate/up weights requested into the L2 during attention (``kernels/l2_prefetch.py``,
ONELAUNCH_L2_AHEAD_MB) against none, on the GPU: Qwen's ``+ PDL`` rung at each setting,
checked against the oracle (the ladder's rule) and then timed, the settings interleaved
with 0 so that drift shows; then the same at a longer context.

    python ci/l2_check.py OUT.json [--mbs 0,16,0,32,0,8,24] [--long 4096]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from onelaunch import bench  # noqa: E402
from onelaunch.specs import get_spec  # noqa: E402
from onelaunch.timing import read_bandwidth  # noqa: E402
from onelaunch.weights import random_weights  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--mbs", default="0,16,0,32,0,8,24,0")
    ap.add_argument("--long", type=int, default=4096)
    ap.add_argument("--long-mbs", default="0,24,0,24")
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    spec = get_spec(a.model)
    w = random_weights(spec, 0, device="cuda")
    bw = read_bandwidth("cuda")
    rows, t0 = [], time.time()
    for ctx, mbs in ((512, a.mbs), (a.long, a.long_mbs)):
        prompt, _, max_ctx = bench.ladder_prompt(spec, ctx, 12, a.iters)
        ref = bench.oracle_tokens(spec, w, prompt, 12, max_ctx)
        for mb in mbs.split(","):
            os.environ["ONELAUNCH_L2_AHEAD_MB"] = mb
            for r in bench.ladder_rows(spec, w, "cuda", ctx=ctx, iters=a.iters, read_tbps=bw,
                                       rungs=("+ PDL",), ref=ref):
                r.update(l2_ahead_mb=float(mb), t_s=round(time.time() - t0, 1))
                r.pop("flips", None)
                print(json.dumps({k: r.get(k) for k in ("ctx", "l2_ahead_mb", "agree", "launches",
                                                         "ms_per_token", "x_floor", "t_s")}),
                      flush=True)
                rows.append(r)
            json.dump(rows, open(a.out, "w"), indent=1)
    os.environ.pop("ONELAUNCH_L2_AHEAD_MB", None)


if __name__ == "__main__":
    main()
