"""Lab probe (GPU): the one-launch step (``onelaunch/megakernel/step.py``) against the
chain + PDL on the same engine, in one process: the last layer's buffers after one step
from the same state, the oracle check of both (teacher-forced, the agreement rule), two
replays bit-identical, and both steps timed alternately against the floor measured here.

    python lab/step_check.py OUT.json [--ctx 512,4000] [--tokens 32] [--iters 200]
                             [--stages STAGES] [--model qwen2.5-1.5b] [--clock PREFIX]
                             [--variants ATTENTION:PLAN_CTX[:STAGES[:POLL[:BT]]],...]
                             [--l2-prefetch-mb 0,8,16,24 [--l2-evict-last]]
    python lab/step_clock.py PREFIX_512.pt       # where the time goes, per layer and op

    python lab/step_check.py OUT.json --model olmoe-1b-7b     # the MoE kernel

OLMoE runs the MoE kernel (``megakernel/gluon/moe.py``): attention "four" only (its RoPE
holds the q/k norm; the default variant), the ring's stages ``step.MOE_STAGES`` unless
given (its h and held stage share the shared memory). Besides x, qkv and attn, the last
layer's router logits, routing weights and ids are compared with the chain's
(``last_layer_ids_equal``: the same experts in the same slots; ``..._same_set``: the
same experts).

``--l2-prefetch-mb``: each variant again with each loader asking the L2 for its share of
that many MB a layer of the next gate/up during the attention's window
(``MegaStep(l2_prefetch_mb=...)``, ``megakernel/l2stage.py``; 0: off, the default one
launch), each checked as the others and bit for bit against the same variant with the
prefetch off (``x_equal_l2_off``: a prefetch moves no data); ``--l2-evict-last`` also
times each nonzero size with an evict-last policy on the prefetched lines.
"""
import argparse
import json
import sys
import time

import torch

from onelaunch.engine import Engine
from onelaunch.measure.agree import judge, oracle_tokens
from onelaunch.measure.timing import floor_ms, run_bandwidth, run_ctx, time_ms
from onelaunch.megakernel.step import ATTENTION, MOE_STAGES, POLL, STAGES, MegaStep
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


def one_ctx(spec, w, ctx, tokens, iters, stages, bw, out, clock_to=None,
            variants=(("four", 0, 0, POLL, 0, 0, False),)):
    g = torch.Generator().manual_seed(ctx)
    prompt = torch.randint(0, spec.vocab, (ctx,), generator=g)
    iters = min(iters, spec.max_ctx - run_ctx(ctx, tokens, 0))    # OLMoE's 4096 at 4000
    max_ctx = run_ctx(ctx, tokens, iters)
    t0 = time.time()
    ref = oracle_tokens(spec, w, prompt, tokens, max_ctx)
    out["oracle_s"] = time.time() - t0
    e = Engine(spec, w, max_ctx=max_ctx, pdl=True)
    chain = e.plan
    out["chain"] = {k: v for k, v in judge(e, prompt, ref, True).items() if k != "tokens"}
    fl = out["floor_ms"] = floor_ms(spec, bw, ctx)
    x_off = {}                                    # each variant's x with the L2 prefetch off
    for attention, plan, st, poll, bt, l2mb, l2last in variants:
        st = st or stages or (MOE_STAGES if spec.is_moe else STAGES)
        key = f"{attention}_plan{plan or ctx}_st{st}_poll{poll}" + (f"_bt{bt}" if bt else "")
        name = key + (f"_l2mb{l2mb:g}" + ("last" if l2last else "") if l2mb else "")
        name += "_again" if name in out else ""
        r = out[name] = {}
        try:
            one_variant(e, chain, prompt, ref, ctx, iters, st, fl, r, attention,
                        plan or ctx, clock_to and f"{clock_to}_{name}", poll, bt,
                        (l2mb, l2last), x_off.setdefault(key, {}))
        except Exception as ex:                   # keep what was measured
            r["error"] = f"{type(ex).__name__}: {ex}"
        e.plan, e.graph = chain, None
    del e
    torch.cuda.empty_cache()


def one_variant(e, chain, prompt, ref, ctx, iters, stages, fl, out, attention, plan,
                clock_to, poll=POLL, bt=0, l2=(0, False), x_off=None):
    t0 = time.time()
    l2kw = dict(l2_prefetch_mb=l2[0], l2_evict_last=l2[1])
    mk = MegaStep(e, ctx=plan, stages=stages, attention=attention, poll=poll, bt=bt, **l2kw)
    mega = [mk.launch()]
    out["mk_build_s"] = time.time() - t0
    out["schedule"] = {"P": mk.P, "instr_per_sm": mk.n_instr, "counters": mk.n_ctr,
                       "splits": mk.spmax, "plan_ctx": plan, "stages": mk.stages,
                       "attention": mk.attention, "moe": mk.moe, "bt": mk.bt,
                       "l2_prefetch_mb": l2[0], "l2_evict_last": l2[1],
                       "l2_mb_a_layer": (0 if mk.moe or mk.l2_tab is None else
                                         int(mk.l2_tab[:, :, 1].sum()) / e.spec.layers / 1e6)}
    # the last layer's buffers after one step from the same state (position ctx); MoE:
    # its router logits, routing weights and ids too
    moe = ("router_logits", "expert_weights", "expert_ids")
    chain_bufs = lambda: dict({"x": e.x, "qkv": e.buffers["qkv"], "attn": e.buffers["attn"]},
                              **({k: e.buffers[k] for k in moe} if mk.moe else {}))
    mega_bufs = lambda: dict({"x": e.x, "qkv": mk.qkv, "attn": mk.attn}, **(dict(
        zip(moe, (mk.router_logits, mk.route_w[-1], mk.route_ids[-1]))) if mk.moe else {}))
    t0 = time.time()
    a = buffers_after_step(e, chain, ctx, chain_bufs)
    mk.run()                                    # compile
    torch.cuda.synchronize()
    out["mk_compile_s"] = time.time() - t0
    mk.check_stalls()
    b = buffers_after_step(e, mega, ctx, mega_bufs)
    mk.check_stalls()
    out["last_layer_max_abs_diff"] = {n: float((a[n] - b[n]).abs().max()) for n in a}
    out["last_layer_scale"] = {n: float(a[n].abs().max()) for n in a}
    if mk.moe:
        out["last_layer_ids"] = {"chain": a["expert_ids"].int().tolist(),
                                 "mega": b["expert_ids"].int().tolist()}
        out["last_layer_ids_equal"] = bool(torch.equal(a["expert_ids"], b["expert_ids"]))
        out["last_layer_ids_same_set"] = (sorted(out["last_layer_ids"]["chain"])
                                          == sorted(out["last_layer_ids"]["mega"]))
    # two replays from the same state: bit-identical
    x1 = buffers_after_step(e, mega, ctx, lambda: {"x": e.x})["x"]
    x2 = buffers_after_step(e, mega, ctx, lambda: {"x": e.x})["x"]
    out["replays_bit_identical"] = bool(torch.equal(x1, x2))
    e.plan, e.graph = mega, None
    out["mega"] = {k: v for k, v in judge(e, prompt, ref, True).items() if k != "tokens"}
    mk.check_stalls()
    # the step at ctx after the whole prompt ran through this variant: a prefetch moves no
    # data, so with it the bits are those of the same variant without
    x3 = buffers_after_step(e, mega, ctx, lambda: {"x": e.x})["x"]
    if x_off is not None and not l2[0]:
        x_off["x"] = x3
    elif x_off:
        out["x_equal_l2_off"] = bool(torch.equal(x3, x_off["x"]))
    if not iters:                             # a context at the spec's end: no room to time
        print(f"[step_check] ctx {ctx}: mega agree {out['mega'].get('agree')}, replays "
              f"bit-identical {out['replays_bit_identical']} (not timed)", flush=True)
        return
    # time both alternately, each from position ctx
    graphs = {"chain": graph_of(e, chain), "mega": graph_of(e, mega)}
    times = {k: [] for k in graphs}
    for rep in range(3):
        for k, gr in graphs.items():
            e.pos.fill_(ctx)
            t = time_ms(gr.replay, iters=iters, warmup=5)
            times[k].append(t.as_dict())
    mk.check_stalls()
    for k, ts in times.items():
        med = sorted(t["median_ms"] for t in ts)
        out.setdefault(k, {})
        out[k]["ms"] = ts
        out[k]["median_ms"] = med[1]
        out[k]["x_floor"] = med[1] / fl
    out["mega_vs_chain"] = out["mega"]["median_ms"] / out["chain"]["median_ms"]
    print(f"[step_check] ctx {ctx} attention {attention} plan {plan} stages {stages} "
          f"poll {poll} l2 {l2[0]:g}{'last' if l2[1] else ''} MB: mega "
          f"{out['mega']['median_ms']:.4f} ms ({out['mega']['x_floor']:.3f}x, agree "
          f"{out['mega'].get('agree')}), chain {out['chain']['median_ms']:.4f}", flush=True)
    if clock_to:                              # per-instruction stamps of a few steps
        mkc = MegaStep(e, ctx=plan, stages=stages, clock=True, attention=attention,
                       poll=poll, bt=bt, **l2kw)
        e.plan = [mkc.launch()]
        stamps = []
        for _ in range(3):
            e.pos.fill_(ctx)
            e.step_launches()
            torch.cuda.synchronize()
            stamps.append(mkc.clk.cpu().clone())
        mkc.check_stalls()
        torch.save({"clk": stamps[-1][None], "prog": mkc.prog.cpu()[:, :, :4].clone(),
                    "counters": mkc.sched.counters}, f"{clock_to}_{ctx}.pt")
    del graphs, mk


def l2_settings(sizes: str, evict_last: bool, moe: bool):
    """[(MB, evict-last)] to time from ``--l2-prefetch-mb`` and ``--l2-evict-last``, or
    what is wrong with them (a string)."""
    try:
        mbs = [float(v) for v in sizes.split(",")]
    except ValueError:
        mbs = [-1.0]
    if min(mbs) < 0 or (moe and max(mbs) > 0):
        return (f"--l2-prefetch-mb {sizes}: MB a layer >= 0, comma-separated (0: off), for "
                "a dense model only: the MoE kernel has no L2 prefetch")
    return [(mb, last) for mb in mbs for last in ((False, True) if mb and evict_last
                                                  else (False,))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--ctx", default="512")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--stages", type=int, default=0,
                    help=f"the ring's stages (0: {STAGES}, or for an MoE {MOE_STAGES})")
    ap.add_argument("--variants", default=None,
                    help="ATTENTION:PLAN_CTX[:STAGES[:POLL[:BT]]],... each timed against the "
                    "chain in this process: ATTENTION the attention's form (four, three, "
                    "two: schedule.FORMS; an MoE runs four only); PLAN_CTX the schedule's "
                    "planning context (its split unit; 0: the run's ctx); STAGES the "
                    "ring's (0: --stages); POLL 0 atomic polls, 1 acquire loads; BT the keys "
                    "an attention partial loads at once (0: step.BT)")
    ap.add_argument("--l2-prefetch-mb", default="0",
                    help="MB a layer of the next gate/up each variant's loaders ask the L2 "
                    "for during the attention (comma-separated, each timed; 0: off)")
    ap.add_argument("--l2-evict-last", action="store_true",
                    help="also time each nonzero --l2-prefetch-mb with an evict-last policy")
    ap.add_argument("--clock", default=None, help="save the clock stamps to CLOCK_<ctx>.pt")
    a = ap.parse_args()
    spec = get_spec(a.model)
    l2s = l2_settings(a.l2_prefetch_mb, a.l2_evict_last, spec.is_moe)
    if isinstance(l2s, str):                      # before any weights load
        print(f"error: {l2s}", file=sys.stderr)
        sys.exit(2)
    given = [v.split(":") for v in (a.variants or ("four" if spec.is_moe else ATTENTION)
                                    + ":0").split(",")]
    variants = [(f[0], *(int(x) for x in f[1:5] + ["0", "0", str(POLL), "0"][len(f) - 1:]),
                 *l2) for f in given for l2 in l2s]
    w = random_weights(a.model, 0, device="cuda")
    bw = run_bandwidth("cuda")
    res = {"model": a.model, "read_tbps": bw,
           "stages": a.stages or (MOE_STAGES if spec.is_moe else STAGES), "variants": variants,
           "runs": {}}
    for ctx in (int(c) for c in a.ctx.split(",")):
        r = res["runs"][ctx] = {}
        try:
            one_ctx(spec, w, ctx, a.tokens, a.iters, a.stages, bw, r, a.clock, variants)
        except Exception as ex:                   # keep what was measured
            r["error"] = f"{type(ex).__name__}: {ex}"
        json.dump(res, open(a.out, "w"), indent=1)
        print(json.dumps(r, indent=1)[:3000], flush=True)


if __name__ == "__main__":
    main()
