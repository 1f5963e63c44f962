"""The O projection merging the split-K partials itself (``o_proj_residual``'s MERGE)
against the reduce kernel, on the GPU: for each model and each ``few`` (0 = the reduce
kernel, as the table has it), the step at ctx 512 in an engine for 1024 positions (no
reduce launch: ``plan.o_merge`` 1) and one for the model's maximum (the reduce told
``few``: 2), each checked against the oracle and then timed (``bench.maxctx_rows``); the
settings alternate (0, few, 0, few) so drift shows; then the default engine at the
context where the most splits are still merged in the O projection (``few`` x 64).

    python ci/omerge_check.py OUT.json [--models qwen2.5-1.5b,olmoe-1b-7b] [--few 16]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from onelaunch import bench  # noqa: E402
from onelaunch.specs import get_spec  # noqa: E402
from onelaunch.weights import random_weights  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--models", default="qwen2.5-1.5b,olmoe-1b-7b")
    ap.add_argument("--few", type=int, default=16)
    ap.add_argument("--iters", type=int, default=200)
    a = ap.parse_args()
    rows = []
    t0 = time.time()
    for name in a.models.split(","):
        spec = get_spec(name)
        w = random_weights(spec, 0, device="cuda")
        bw = bench.read_bandwidth("cuda")
        runs = [(512, (1024, None), few) for few in (0, a.few, 0, a.few)]
        runs += [(a.few * 64, (None,), few) for few in (0, a.few)]
        for ctx, mcs, few in runs:
            os.environ["ONELAUNCH_O_MERGE"] = str(few)
            for r in bench.maxctx_rows(spec, w, "cuda", ctx=ctx, max_ctxs=mcs, iters=a.iters,
                                       read_tbps=bw):
                r.update(few=few, t_s=round(time.time() - t0, 1))
                print(json.dumps(r), flush=True)
                rows.append(r)
            json.dump(rows, open(a.out, "w"), indent=1)
        del w
        torch.cuda.empty_cache()
    os.environ.pop("ONELAUNCH_O_MERGE", None)


if __name__ == "__main__":
    main()
