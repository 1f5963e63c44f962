"""Lab probe (GPU): the one-launch step (``onelaunch/megakernel/step.py``) against the
chain + PDL on the same engine, in one process: the last layer's buffers after one step
from the same state, the oracle check of both (teacher-forced, the agreement rule), two
replays bit-identical, and both steps timed alternately against the floor measured here.

    python lab/step_check.py OUT.json [--ctx 512,4000] [--tokens 32] [--iters 200]
                             [--stages 4] [--model qwen2.5-1.5b] [--clock PREFIX]
                             [--fused]
    python lab/step_clock.py PREFIX_512.pt       # where the time goes, per layer and op
"""
import argparse
import json
import time

import torch

from onelaunch.engine import Engine
from onelaunch.measure.agree import judge, oracle_tokens
from onelaunch.measure.timing import floor_ms, run_bandwidth, run_ctx, time_ms
from onelaunch.megakernel.step import MegaStep
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights


def graph_of(e, plan):
    """A CUDA graph of one step of ``plan`` on engine e's buffers (warmed up first)."""
    e.plan = plan
    saved = e.pos.clone()
    for _ in range(2):
        e.step_launches()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        e.step_launches()
    torch.cuda.synchronize()
    e.pos.copy_(saved)
    return g


def buffers_after_step(e, plan, pos, names):
    e.plan = plan
    e.pos.fill_(pos)
    e.step_launches()
    torch.cuda.synchronize()
    return {n: t.float().clone() for n, t in names().items()}


def one_ctx(spec, w, ctx, tokens, iters, stages, bw, out, clock_to=None, fused=False):
    g = torch.Generator().manual_seed(ctx)
    prompt = torch.randint(0, spec.vocab, (ctx,), generator=g)
    max_ctx = run_ctx(ctx, tokens, iters)
    t0 = time.time()
    ref = oracle_tokens(spec, w, prompt, tokens, max_ctx)
    out["oracle_s"] = time.time() - t0
    e = Engine(spec, w, max_ctx=max_ctx, pdl=True)
    chain = e.plan
    out["chain"] = {k: v for k, v in judge(e, prompt, ref, True).items() if k != "tokens"}
    t0 = time.time()
    mk = MegaStep(e, ctx=ctx, stages=stages, fused=fused)
    mega = [mk.launch()]
    out["mk_build_s"] = time.time() - t0
    out["schedule"] = {"P": mk.P, "instr_per_sm": mk.n_instr, "counters": mk.n_ctr,
                       "splits": mk.spmax}
    # the last layer's buffers after one step from the same state (position ctx)
    t0 = time.time()
    a = buffers_after_step(e, chain, ctx, lambda: {
        "x": e.x, "qkv": e.buffers["qkv"], "attn": e.buffers["attn"]})
    mk.run()                                    # compile
    torch.cuda.synchronize()
    out["mk_compile_s"] = time.time() - t0
    mk.check_stalls()
    b = buffers_after_step(e, mega, ctx, lambda: {"x": e.x, "qkv": mk.qkv, "attn": mk.attn})
    mk.check_stalls()
    out["last_layer_max_abs_diff"] = {n: float((a[n] - b[n]).abs().max()) for n in a}
    out["last_layer_scale"] = {n: float(a[n].abs().max()) for n in a}
    out["argmax_at_ctx"] = [int(e.argmax[ctx + 1])]
    # two replays from the same state: bit-identical
    x1 = buffers_after_step(e, mega, ctx, lambda: {"x": e.x})["x"]
    x2 = buffers_after_step(e, mega, ctx, lambda: {"x": e.x})["x"]
    out["replays_bit_identical"] = bool(torch.equal(x1, x2))
    e.plan, e.graph = mega, None
    out["mega"] = {k: v for k, v in judge(e, prompt, ref, True).items() if k != "tokens"}
    mk.check_stalls()
    # time both alternately, each from position ctx
    graphs = {"chain": graph_of(e, chain), "mega": graph_of(e, mega)}
    fl = floor_ms(spec, bw, ctx)
    out["floor_ms"] = fl
    times = {k: [] for k in graphs}
    for rep in range(3):
        for k, gr in graphs.items():
            e.pos.fill_(ctx)
            t = time_ms(gr.replay, iters=iters, warmup=5)
            times[k].append(t.as_dict())
    mk.check_stalls()
    for k, ts in times.items():
        med = sorted(t["median_ms"] for t in ts)
        out[k]["ms"] = ts
        out[k]["median_ms"] = med[1]
        out[k]["x_floor"] = med[1] / fl
    out["mega_vs_chain"] = out["mega"]["median_ms"] / out["chain"]["median_ms"]
    if clock_to:                              # per-instruction stamps of a few steps
        mkc = MegaStep(e, ctx=ctx, stages=stages, clock=True, fused=fused)
        e.plan = [mkc.launch()]
        stamps = []
        for _ in range(3):
            e.pos.fill_(ctx)
            e.step_launches()
            torch.cuda.synchronize()
            stamps.append(mkc.clk.cpu().clone())
        mkc.check_stalls()
        torch.save({"clk": torch.stack(stamps), "prog": mkc.prog.cpu(),
                    "counters": mkc.sched.counters}, f"{clock_to}_{ctx}.pt")
    del graphs, e, mk
    torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--ctx", default="512")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--fused", action="store_true",
                    help="the attention as ATTN_FUSED (two stages a layer, not four)")
    ap.add_argument("--clock", default=None, help="save the clock stamps to CLOCK_<ctx>.pt")
    a = ap.parse_args()
    spec = get_spec(a.model)
    w = random_weights(a.model, 0, device="cuda")
    bw = run_bandwidth("cuda")
    res = {"model": a.model, "read_tbps": bw, "stages": a.stages, "fused": a.fused,
           "runs": {}}
    for ctx in (int(c) for c in a.ctx.split(",")):
        r = res["runs"][ctx] = {}
        try:
            one_ctx(spec, w, ctx, a.tokens, a.iters, a.stages, bw, r, a.clock, a.fused)
        except Exception as ex:                   # keep what was measured
            r["error"] = f"{type(ex).__name__}: {ex}"
        json.dump(res, open(a.out, "w"), indent=1)
        print(json.dumps(r, indent=1)[:3000], flush=True)


if __name__ == "__main__":
    main()
