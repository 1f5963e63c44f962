"""The context sweep and the long-context checks: the engine against the oracle from one
cache, at each context, before each context is timed.

:func:`sweep_rows` times the graph-captured step at many contexts from one prefilled
cache, :func:`maxctx_rows` the same step in engines built for different maximum
contexts, and :func:`long_context_agreement` checks a long prefill's continuation.
"""
from __future__ import annotations

import torch

from .. import kernels as K
from ..oracle import Oracle
from ..prefill import prefill
from ..prompt import random_prompt
from . import agree
from .rungs import make_engine
from .timing import floor_ms, time_engine_step


@torch.no_grad()
def forced_from_cache(e, o: Oracle, start: int, tokens: torch.Tensor, graph: bool) -> dict:
    """Teacher-forced check of an engine whose cache holds positions [0, start): copy that
    cache into the oracle, feed both ``tokens`` [n] at positions start .. start + n - 1,
    and judge the engine's argmax at each step against the oracle's logits. Both caches
    then also hold the n new positions."""
    dev = e.device
    n = tokens.numel()
    C = min(e.max_ctx, o.max_ctx)
    o.k_cache[:, :, :C].copy_(e.k_cache[:, :, :C])
    o.v_cache[:, :, :C].copy_(e.v_cache[:, :, :C])
    e.seq[start: start + n] = tokens.to(dev, torch.int32)
    e.prompt_len.fill_(start + n)               # all forced: seq is never overwritten
    e.pos.fill_(start)
    e.argmax.zero_()
    for _ in range(n):
        e.step(graph)
    got = e.argmax[start + 1: start + n + 1].cpu().long()
    logits = []
    for i in range(n):
        logits.append(o(tokens[i: i + 1].to(dev), torch.tensor([start + i], device=dev))[-1].float().cpu())
    # the oracle's logits at step i choose the token at start + i + 1
    return agree.judge_tokens(torch.stack(logits), got)


def timed_if_agreed(e, r: dict, j: dict, ctx: int, floor, iters: int, dev) -> dict:
    """Fill row ``r`` for engine ``e`` at context ``ctx``: its time (graph replay, the
    cache as it is) and its spread (``ms_min``, ``ms_max``) if the check ``j`` passed,
    else the refusal and no time."""
    if j["ok"]:
        e.pos.fill_(ctx)
        e.prompt_len.fill_(0)
        spread = {}
        ms = time_engine_step(e, True, iters, dev, info=spread)
        r.update(ms_per_token=ms, x_floor=ms / floor if floor else None, **spread)
    else:
        r.update(ms_per_token=None, x_floor=None, refused=agree.refusal(r["flips"]))
    return r


def sweep_rows(spec, w, device="cuda", ctxs=(128, 512, 2048, 8192, 16384, 32768), iters=50,
               read_tbps=None, pdl=True, attention="splitk", check_tokens: int = 2,
               live_caps=(0,), seed: int = 0) -> list[dict]:
    """ms/token of the graph-captured step at each context (one engine sized for the largest).

    The cache holds the keys and values of a real prompt: random token ids run through the
    model by the batched prefill (``prefill.prefill``, the oracle's math). A cache of
    random numbers would time the same, but its attention is far from any a model produces
    and the bf16 roundings of the two implementations then drift apart by more than the
    near-tie threshold (measured: a refused flip of exactly 8 ulps at ctx 2048).

    Before a context is timed, the captured step is checked there: the oracle takes a copy
    of the engine's cache and both decode ``check_tokens`` forced tokens from that context;
    the engine's choices are judged by the agreement rule. A context that fails is
    reported refused, with no time.

    ``live_caps``: the cap on live splits a kv head (``Engine(live_cap=)``: 0 the default,
    None none), one pass over ``ctxs`` each, the same engine and cache recaptured.
    ``seed``: the run's seed (the prompt's stream is seed 2 + ``seed``)."""
    dev = torch.device(device)
    max_ctx = max(ctxs) + iters + check_tokens + 16
    e = make_engine(spec, w, max_ctx=max_ctx, attention=attention, pdl=pdl)
    g = torch.Generator(device="cpu").manual_seed(2 + seed)
    prefill(e, random_prompt(spec, max(ctxs) + 1, generator=g), progress=False)
    o = Oracle(spec, w, max_ctx=max_ctx)
    rows = []
    for cap in live_caps:
        e.replan(live_cap=cap)                 # the launches hold the cap: a new plan
        e.capture()
        for c in ctxs:
            forced = random_prompt(spec, check_tokens, generator=g)
            j = forced_from_cache(e, o, c, forced, graph=True)
            floor = floor_ms(spec, read_tbps, c)
            r = {"model": spec.name, "rung": f"{attention}{' + PDL' if e.pdl else ''}", "ctx": c,
                 "agree": j["agree"], "flips": agree.disagreements(j), "floor_ms": floor,
                 "kv_bytes": c * spec.kv_bytes_per_token_of_context(), "live_cap": e.live_cap}
            rows.append(timed_if_agreed(e, r, j, c, floor, iters, dev))
    del o
    return rows


def maxctx_rows(spec, w, device="cuda", ctx=512, max_ctxs=(1024, None), iters=100,
                read_tbps=None, pdl=True, check_tokens=2, seed: int = 0) -> list[dict]:
    """The step at one context in engines that differ only in the maximum context they
    were built for (None: the model's own), graph + split-K (+ PDL): the work past the live
    length should cost nothing, so the times should match. One row per engine, then a
    summary row with the ratio of the last to the first.

    Each engine gets the same cache (the same random prompt through the batched prefill,
    as in :func:`sweep_rows`), is checked at ``ctx`` against the oracle on a copy of that
    cache (``check_tokens`` forced tokens, the agreement rule) and timed only if it
    passes. ``same_as_first``: its teacher-forced choices and the logits of its last
    checked step are bit-identical to the first engine's (expected while each live split
    holds one unit in both, as at ctx 512)."""
    dev = torch.device(device)
    floor = floor_ms(spec, read_tbps, ctx)
    g = torch.Generator(device="cpu").manual_seed(2 + seed)
    prompt = random_prompt(spec, ctx + 1, generator=g)
    forced = random_prompt(spec, check_tokens, generator=g)
    rows, first = [], None
    for mc in max_ctxs:
        mc = mc or spec.max_ctx
        if mc < ctx + iters + check_tokens + 16:
            raise ValueError(f"max_ctx {mc} cannot hold ctx {ctx} and {iters} timed steps")
        e = make_engine(spec, w, max_ctx=mc, attention="splitk", pdl=pdl)
        prefill(e, prompt, progress=False)
        o = Oracle(spec, w, max_ctx=mc)
        e.capture()
        j = forced_from_cache(e, o, ctx, forced, graph=True)
        del o
        mine = (e.argmax[ctx + 1: ctx + check_tokens + 1].cpu(), e.buffers["logits"].cpu())
        n_splits = e.partials()[0].shape[1]
        r = {"model": spec.name, "rung": f"splitk{' + PDL' if e.pdl else ''}", "ctx": ctx,
             "max_ctx": mc, "chunk": e.chunk, "n_splits": n_splits,
             "live_splits": K.attention_splitk.live_splits_host(ctx + 1, e.chunk, K.attention_splitk.live_share(n_splits, e.live_cap)),
             "agree": j["agree"], "flips": agree.disagreements(j), "floor_ms": floor}
        if first is None:
            first = mine
        else:
            r["same_as_first"] = bool(torch.equal(mine[0], first[0]) and torch.equal(mine[1], first[1]))
        rows.append(timed_if_agreed(e, r, j, ctx, floor, iters, dev))
        del e
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    times = [r["ms_per_token"] for r in rows]
    rows.append({"model": spec.name, "ctx": ctx, "summary": "step time, last engine / first",
                 "max_ctx": [r["max_ctx"] for r in rows], "ms_per_token": times,
                 "ratio": times[-1] / times[0] if None not in times else None})
    return rows


def long_context_agreement(spec, w, device="cuda", ctx=32768, tokens=12, pdl=True, chunk=1024,
                           seed: int = 0):
    """Oracle prefill of ``ctx`` random tokens (batched, in chunks) and its greedy
    continuation; the graph engine adopts the prefilled cache and is teacher-forced along
    that continuation; its choices are judged by the agreement rule."""
    dev = torch.device(device)
    max_ctx = ctx + tokens + 8
    prompt = random_prompt(spec, ctx, 5 + seed, dev)
    o = Oracle(spec, w, max_ctx=max_ctx)
    with torch.no_grad():
        for lo in range(0, ctx - 1, chunk):
            hi = min(ctx - 1, lo + chunk)
            o.forward(prompt[lo:hi], torch.arange(lo, hi, device=dev))
        k0 = o.k_cache[:, :, :ctx - 1].clone()
        v0 = o.v_cache[:, :, :ctx - 1].clone()
        # the oracle's greedy continuation from the prefilled cache
        ids, logits = [], []
        lg = o.forward(prompt[ctx - 1: ctx], torch.tensor([ctx - 1], device=dev))[-1]
        for i in range(tokens):
            logits.append(lg.float().cpu())
            ids.append(int(lg.argmax()))
            if i + 1 < tokens:
                lg = o.forward(torch.tensor([ids[-1]], device=dev), torch.tensor([ctx + i], device=dev))[-1]
    del o
    ref_logits = torch.stack(logits)
    margins = ref_logits.topk(2, dim=-1).values
    e = make_engine(spec, w, max_ctx=max_ctx, attention="splitk", pdl=pdl)
    seq = torch.cat([prompt.cpu(), torch.tensor(ids)])
    e.capture()
    e.k_cache.zero_()
    e.v_cache.zero_()
    e.k_cache[:, :, :ctx - 1].copy_(k0)
    e.v_cache[:, :, :ctx - 1].copy_(v0)
    del k0, v0
    e.seq.zero_()
    e.seq[: seq.numel()] = seq.to(dev, torch.int32)
    e.prompt_len.fill_(seq.numel())                 # all forced: the oracle's tokens
    e.pos.fill_(ctx - 1)
    e.argmax.zero_()
    with torch.no_grad():
        for _ in range(tokens):
            e.step(True)
    got = e.argmax[ctx: ctx + tokens].cpu().long()
    j = agree.judge_tokens(ref_logits, got)
    return {"model": spec.name, "ctx": ctx, "agree": j["agree"], "ok": j["ok"],
            "flips": agree.disagreements(j),
            "min_margin": float((margins[:, 0] - margins[:, 1]).min()),
            "engine": got.tolist(), "oracle": ids}
