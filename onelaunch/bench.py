"""Benchmarks: every kernel and every rung, checked against the oracle before it is timed.

Nothing here reports a time for a result the oracle has not confirmed: a kernel whose
output differs from the torch reference beyond its tolerance, or a rung whose greedy
tokens differ from the oracle's, gets ``None`` and the reason. Every ratio uses the
streaming-read bandwidth measured in the same process (``timing.read_bandwidth``).

    python -m onelaunch.bench --model qwen2.5-1.5b --ctx 512 --what kernels,ladder,sweep

Per-kernel times are taken over all layers' weights back to back, captured in one CUDA
graph: the H200's 60 MB L2 would otherwise serve a re-read layer from cache.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from . import kernels as K
from .engine import Engine, pack_weights
from .kernels import config
from .oracle import Oracle, rms_norm
from .specs import get_spec
from .timing import read_bandwidth, time_ms
from .weights import random_weights

RUNGS = ("fused eager", "fused + graph", "+ split-K", "+ PDL")
# "+ RoPE in attention" (ladder_rows(rungs=...) runs it) measured slower than + PDL on the
# H200 and is not a rung of the ladder: NOTES.md, entry 8


def f32(t):
    return t.float() if t is not None else None


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _graph_time(launch, n_launch: int, device, iters: int) -> float:
    """Median microseconds per launch, ``launch()`` recording ``n_launch`` launches."""
    if torch.device(device).type != "cuda":
        t = time_ms(launch, iters=max(2, iters // 10), warmup=1, device=device)
        return t.median_ms * 1e3 / n_launch
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        launch()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        launch()
    t = time_ms(g.replay, iters=iters, warmup=5, device=device)
    return t.median_ms * 1e3 / n_launch


# --------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------
def kernel_rows(spec, w, device="cuda", ctx: int = 512, iters: int = 50, read_tbps=None,
                tol: float = 2e-2, cfgs: dict | None = None) -> list[dict]:
    """Check each fused kernel against torch on layer 0, then time it over every layer.

    Tolerance: ``tol`` relative L2 error against an fp32 reference on the same (bf16)
    inputs. The kernels accumulate in fp32 but round where HF's bf16 model rounds (the
    normalised activation, each projection, the output), so they sit a few bf16 ulps
    (2^-8 = 4e-3 each) from fp32: measured 3e-3 to 1e-2. 2e-2 separates that from an
    indexing bug, which gives errors of order 1."""
    spec = get_spec(spec)
    s, dev, bf = spec, torch.device(device), torch.bfloat16
    P = pack_weights(spec, w)
    Ls = P["layers"]
    cfgs = cfgs or {}
    cfg = lambda op: cfgs.get(op) or config.get(op, dev)
    g = torch.Generator(device="cpu").manual_seed(1)
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(dev, bf)
    eps = s.rms_eps
    rows = []
    nL = s.layers

    def row(kernel, us, nbytes, err, note=""):
        ok = err <= tol
        r = {"kernel": kernel, "us": us if ok else None, "bytes": nbytes,
             "gbps": (nbytes / (us * 1e-6) / 1e9) if ok else None,
             "read_gbps": read_tbps * 1e3 if read_tbps else None, "rel_err": err,
             "check": "pass" if ok else f"FAIL (rel err {err:.2e} > {tol})"}
        if ok and read_tbps:
            r["pct_of_read"] = 100 * r["gbps"] / (read_tbps * 1e3)
        if note:
            r["note"] = note
        rows.append(r)

    x = rnd(s.hidden)
    # ---- rms + qkv ----------------------------------------------------------------------
    out = torch.empty(s.qkv_size, dtype=bf, device=dev)
    L0 = Ls[0]
    K.rms_qkv(x, L0["input_norm"], L0["w_qkv"], L0["b_qkv"], out, eps, cfg=cfg("rms_qkv"))
    ref = F.linear(rms_norm(f32(x)[None], f32(L0["input_norm"]), eps), f32(L0["w_qkv"]), f32(L0["b_qkv"]))[0]
    err = rel_err(out, ref)
    us = _graph_time(lambda: [K.rms_qkv(x, L["input_norm"], L["w_qkv"], L["b_qkv"], out, eps, cfg=cfg("rms_qkv"))
                              for L in Ls], nL, dev, iters)
    row("rms_qkv", us, L0["w_qkv"].numel() * 2 + s.qkv_size * 2 * 2, err)
    # ---- rope + kv write ------------------------------------------------------------------
    from .oracle import apply_rope, rope_cos_sin
    C = ctx + 64
    kc = torch.zeros(nL, s.kv_heads, C, s.head_dim, dtype=bf, device=dev)
    vc = torch.zeros_like(kc)
    cos, sin = rope_cos_sin(torch.arange(C, device=dev), s.head_dim, s.rope_theta, bf)
    pos = torch.tensor([ctx - 1], dtype=torch.int32, device=dev)
    qkv = rnd(s.qkv_size)
    q = torch.empty(s.q_size, dtype=bf, device=dev)
    K.rope_kv_write(qkv, q, kc[0], vc[0], cos, sin, pos, s.heads, s.kv_heads, s.head_dim)
    c1, s1 = cos[ctx - 1: ctx], sin[ctx - 1: ctx]
    q_ref = apply_rope(qkv[: s.q_size].view(1, s.heads, s.head_dim), c1, s1).flatten()
    k_ref = apply_rope(qkv[s.q_size: s.q_size + s.kv_size].view(1, s.kv_heads, s.head_dim), c1, s1)[0]
    err = max(rel_err(q, q_ref), rel_err(kc[0, :, ctx - 1], k_ref),
              rel_err(vc[0, :, ctx - 1], qkv[s.q_size + s.kv_size:].view(s.kv_heads, s.head_dim)))
    us = _graph_time(lambda: [K.rope_kv_write(qkv, q, kc[i], vc[i], cos, sin, pos, s.heads, s.kv_heads,
                                              s.head_dim) for i in range(nL)], nL, dev, iters)
    row("rope_kv_write", us, (s.qkv_size + s.q_size + 2 * s.kv_size) * 2, err)
    # ---- attention at ctx: plain and split-K ------------------------------------------
    kc.copy_(torch.randn(kc.shape, generator=g).to(dev, bf))
    vc.copy_(torch.randn(vc.shape, generator=g).to(dev, bf))
    q = rnd(s.q_size)
    attn = torch.empty(s.q_size, dtype=bf, device=dev)
    grp = s.heads // s.kv_heads
    Kr = kc[0, :, :ctx].float().repeat_interleave(grp, 0)
    Vr = vc[0, :, :ctx].float().repeat_interleave(grp, 0)
    sc = torch.einsum("hd,hcd->hc", q.view(s.heads, s.head_dim).float(), Kr) * s.head_dim ** -0.5
    ref = torch.einsum("hc,hcd->hd", sc.softmax(-1), Vr).flatten()
    kv_bytes = 2 * ctx * s.kv_heads * s.head_dim * 2
    K.attention(q, kc[0], vc[0], attn, pos, s.heads, s.kv_heads, s.head_dim, cfg("attention"))
    err = rel_err(attn, ref)
    us = _graph_time(lambda: [K.attention(q, kc[i], vc[i], attn, pos, s.heads, s.kv_heads, s.head_dim,
                                          cfg("attention")) for i in range(nL)], nL, dev, iters)
    row("attention (plain)", us, kv_bytes, err, note=f"ctx {ctx}, one program per query head")
    chunk = K.chunk_for(C)
    ns = K.n_splits_for(C, chunk)
    po = torch.empty(s.heads, ns, s.head_dim, dtype=torch.float32, device=dev)
    pm = torch.empty(s.heads, ns, dtype=torch.float32, device=dev)
    pl = torch.empty_like(pm)
    K.attention_splitk(q, kc[0], vc[0], attn, pos, po, pm, pl, s.heads, s.kv_heads, s.head_dim, chunk,
                       cfg("attn_split"))
    err = rel_err(attn, ref)
    us = _graph_time(lambda: [K.attention_splitk(q, kc[i], vc[i], attn, pos, po, pm, pl, s.heads,
                                                 s.kv_heads, s.head_dim, chunk, cfg("attn_split"))
                              for i in range(nL)], nL, dev, iters)
    row("attention (split-K, 2 launches)", us, kv_bytes, err, note=f"ctx {ctx}, chunk {chunk}")
    # ---- o_proj + residual -----------------------------------------------------------
    a = rnd(s.q_size)
    xo = x.clone()
    K.o_proj_residual(a, L0["w_o"], xo, cfg=cfg("o_proj"))
    ref = f32(x) + F.linear(f32(a)[None], f32(L0["w_o"]))[0]
    err = rel_err(xo, ref)
    xs = x.clone()
    us = _graph_time(lambda: [K.o_proj_residual(a, L["w_o"], xs, cfg=cfg("o_proj")) for L in Ls], nL, dev, iters)
    row("o_proj_residual", us, L0["w_o"].numel() * 2 + s.hidden * 4, err)
    # ---- rms + gate/up + swiglu --------------------------------------------------------
    h = torch.empty(s.intermediate, dtype=bf, device=dev)
    K.rms_gate_up_swiglu(x, L0["post_norm"], L0["w_gate_up"], h, eps, cfg=cfg("gate_up"))
    xn = rms_norm(f32(x)[None], f32(L0["post_norm"]), eps)
    gu = F.linear(xn, f32(L0["w_gate_up"]))[0]
    ref = F.silu(gu[: s.intermediate]) * gu[s.intermediate:]
    err = rel_err(h, ref)
    us = _graph_time(lambda: [K.rms_gate_up_swiglu(x, L["post_norm"], L["w_gate_up"], h, eps, cfg=cfg("gate_up"))
                              for L in Ls], nL, dev, iters)
    row("rms_gate_up_swiglu", us, L0["w_gate_up"].numel() * 2 + s.intermediate * 2, err)
    # ---- down + residual ---------------------------------------------------------------
    hh = rnd(s.intermediate)
    scratch = torch.zeros(16 * s.hidden, dtype=torch.float32, device=dev)
    counter = torch.zeros(s.hidden, dtype=torch.int32, device=dev)
    xd = x.clone()
    K.down_residual(hh, L0["w_down"], xd, scratch, counter, cfg=cfg("down"))
    ref = f32(x) + F.linear(f32(hh)[None], f32(L0["w_down"]))[0]
    err = max(rel_err(xd, ref), float(counter.abs().max()))
    xs = x.clone()
    us = _graph_time(lambda: [K.down_residual(hh, L["w_down"], xs, scratch, counter, cfg=cfg("down")) for L in Ls],
                     nL, dev, iters)
    row("down_residual", us, L0["w_down"].numel() * 2 + s.hidden * 4, err,
        note=f"split-K {cfg('down')['SPLIT_K']}, last-arrival epilogue")
    # ---- final norm + lm_head + argmax ---------------------------------------------------
    n_prog = -(-s.vocab // cfg("lm_head")["BLOCK_N"])
    logits = torch.empty(s.vocab, dtype=torch.float32, device=dev)
    pv = torch.empty(n_prog, dtype=torch.float32, device=dev)
    pi = torch.empty(n_prog, dtype=torch.int32, device=dev)
    cnt = torch.zeros(1, dtype=torch.int32, device=dev)
    seq = torch.zeros(C + 1, dtype=torch.int32, device=dev)
    p0 = torch.tensor([ctx - 1], dtype=torch.int32, device=dev)
    plen = torch.zeros(1, dtype=torch.int32, device=dev)
    K.lm_head_argmax(x, P["norm"], P["lm_head"], logits, pv, pi, cnt, seq, p0, plen, eps, cfg=cfg("lm_head"))
    ref = F.linear(rms_norm(f32(x)[None], f32(P["norm"]), eps), f32(P["lm_head"]))[0]
    err = rel_err(logits, ref)
    tok_ok = int(seq[ctx]) == int(ref.argmax()) and int(p0) == ctx and int(cnt) == 0
    if not tok_ok:
        err = max(err, 1.0)
    n_rep = 4
    plen.fill_(2 ** 30)      # timing: positions advance, but no token is written
    us = _graph_time(lambda: [K.lm_head_argmax(x, P["norm"], P["lm_head"], logits, pv, pi, cnt, seq, p0,
                                               plen, eps, cfg=cfg("lm_head")) for _ in range(n_rep)], n_rep, dev, iters)
    row("lm_head_argmax", us, P["lm_head"].numel() * 2 + s.vocab * 4, err,
        note=f"{n_prog} programs; argmax reduced by the last to arrive")
    return rows


# --------------------------------------------------------------------------------------
# the ladder: our rungs, each checked against the oracle's greedy tokens
# --------------------------------------------------------------------------------------
def oracle_tokens(spec, w, prompt, tokens, max_ctx):
    """The oracle's greedy ids, the top-1/top-2 margin of its logits at each step, and the
    near-tie threshold there: two bf16 ulps at the top logit's magnitude."""
    o = Oracle(spec, w, max_ctx=max_ctx)
    ids, logits = o.generate(prompt, tokens, return_logits=True)
    top2 = logits.topk(2, dim=-1).values
    ulp = torch.exp2(torch.floor(torch.log2(top2[:, 0].abs().clamp_min(1e-30))) - 7)
    del o
    return ids.cpu(), (top2[:, 0] - top2[:, 1]).cpu(), (2 * ulp).cpu()


def agreement(got: torch.Tensor, ref: torch.Tensor) -> int:
    """Tokens matching before the first divergence (after it, prefixes differ)."""
    n = 0
    for a, b in zip(got.tolist(), ref.tolist()):
        if a != b:
            break
        n += 1
    return n


def judge(engine: Engine, prompt, ref, graph: bool) -> dict:
    """The oracle check of one engine mode. Free-running greedy tokens (the path the GPU
    feeds back to itself) and teacher-forced choices (the engine's argmax given the
    oracle's own prefix, step by step). A rung passes when every teacher-forced choice
    matches the oracle, or differs only where the oracle's own top two logits are within
    two bf16 ulps (a near tie: bf16 rounding, not a bug, decides it). Every such step is
    listed with its margin; nothing is hidden."""
    ref_ids, margins, near = ref
    n = ref_ids.numel()
    free = engine.generate(prompt, n, graph=graph)
    tf = engine.teacher_forced(prompt, ref_ids, graph=graph)
    miss = [i for i in range(n) if int(tf[i]) != int(ref_ids[i])]
    ties = [{"step": i, "margin": float(margins[i]), "near_tie_below": float(near[i])} for i in miss]
    ok = all(t["margin"] <= t["near_tie_below"] for t in ties)
    return {"agree": f"{n - len(miss)}/{n}", "agree_free": f"{agreement(free, ref_ids)}/{n}",
            "flips": ties, "ok": ok, "tokens": free.tolist()}


def time_engine_step(e: Engine, graph: bool, iters: int, device) -> float:
    t = time_ms(lambda: e.step(graph), iters=iters, warmup=5, device=device)
    return t.median_ms


def ladder_rows(spec, w, device="cuda", ctx=512, tokens=12, iters=100, read_tbps=None,
                max_ctx=None, seed=0, rungs=RUNGS, ref=None) -> list[dict]:
    spec = get_spec(spec)
    dev = torch.device(device)
    max_ctx = max_ctx or (ctx + tokens + iters + 64)
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, spec.vocab, (ctx,), generator=g)
    ref = ref if ref is not None else oracle_tokens(spec, w, prompt, tokens, max_ctx)
    floor = spec.bytes_per_token(ctx) / (read_tbps * 1e12) * 1e3 if read_tbps else None
    settings = {
        "fused eager": dict(attention="plain", graph=False, pdl=False),
        "fused + graph": dict(attention="plain", graph=True, pdl=False),
        "+ split-K": dict(attention="splitk", graph=True, pdl=False),
        "+ PDL": dict(attention="splitk", graph=True, pdl=True),
        "+ RoPE in attention": dict(attention="splitk", graph=True, pdl=True, fuse_rope=True),
    }
    rows, eager_tokens, prev_tokens = [], None, None
    for rung in rungs:
        st = settings[rung]
        if rung == "+ PDL" and not config.pdl_supported(dev):
            continue                     # later rungs keep their other steps, without PDL
        e = Engine(spec, w, max_ctx=max_ctx, attention=st["attention"], pdl=st["pdl"],
                   fuse_rope=st.get("fuse_rope", False))
        j = judge(e, prompt, ref, st["graph"])
        r = {"model": spec.name, "rung": rung, "ctx": ctx, "agree": j["agree"],
             "agree_free": j["agree_free"], "flips": j["flips"], "floor_ms": floor,
             "read_tbps": read_tbps, "launches": e.launches_per_step(), "order": 10 + (RUNGS.index(rung) if rung in RUNGS else len(RUNGS)),
             "kind": "ours"}
        if st["graph"] and e.graph == "emulated":
            r["note"] = "CPU smoke run: the graph is emulated by eager launches"
        if rung == "fused eager":
            eager_tokens = j["tokens"]
        elif eager_tokens is not None:
            r["same_tokens_as_fused_eager"] = j["tokens"] == eager_tokens
        if prev_tokens is not None:
            r["same_tokens_as_previous_rung"] = j["tokens"] == prev_tokens
        prev_tokens = j["tokens"]
        if j["ok"]:
            p0 = int(e.pos)
            ms = time_engine_step(e, st["graph"], iters if st["graph"] else max(10, iters // 4), dev)
            r["ms_per_token"] = ms
            r["x_floor"] = ms / floor if floor else None
            if spec.is_moe:      # the timed steps read many experts, not one set from L2
                r["distinct_experts"] = e.distinct_experts(p0, int(e.pos))
                r["timed_steps"] = int(e.pos) - p0
        else:
            r["ms_per_token"] = None
            r["refused"] = "teacher-forced choices differ from the oracle beyond a near tie: " + \
                json.dumps([t for t in j["flips"] if t["margin"] > t["near_tie_below"]])
        rows.append(r)
        del e
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def sweep_rows(spec, w, device="cuda", ctxs=(128, 512, 2048, 8192, 16384, 32768), iters=50,
               read_tbps=None, pdl=True, attention="splitk") -> list[dict]:
    """ms/token of the graph-captured step at each context (one engine sized for the largest;
    the cache holds random keys/values: timing does not depend on their values)."""
    spec = get_spec(spec)
    dev = torch.device(device)
    max_ctx = max(ctxs) + iters + 16
    e = Engine(spec, w, max_ctx=max_ctx, attention=attention, pdl=pdl)
    g = torch.Generator(device="cpu").manual_seed(2)
    for li in range(spec.layers):  # random cache, layer by layer (keeps peak memory low)
        e.k_cache[li].copy_(torch.randn(e.k_cache[li].shape, generator=g).to(dev, torch.bfloat16))
        e.v_cache[li].copy_(torch.randn(e.v_cache[li].shape, generator=g).to(dev, torch.bfloat16))
    e.capture()
    rows = []
    for c in ctxs:
        e.pos.fill_(c)
        e.prompt_len.fill_(0)
        ms = time_engine_step(e, True, iters, dev)
        floor = spec.bytes_per_token(c) / (read_tbps * 1e12) * 1e3 if read_tbps else None
        rows.append({"model": spec.name, "rung": f"{attention}{' + PDL' if e.pdl else ''}", "ctx": c,
                     "ms_per_token": ms, "floor_ms": floor, "x_floor": ms / floor if floor else None,
                     "kv_bytes": c * spec.kv_bytes_per_token_of_context()})
    return rows


def long_context_agreement(spec, w, device="cuda", ctx=32768, tokens=12, pdl=True, chunk=1024):
    """Oracle prefill of ``ctx`` random tokens (batched, in chunks), then the graph engine
    and the oracle each decode ``tokens`` greedy tokens from the same cache."""
    spec = get_spec(spec)
    dev = torch.device(device)
    max_ctx = ctx + tokens + 8
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, spec.vocab, (ctx,), generator=g).to(dev)
    o = Oracle(spec, w, max_ctx=max_ctx)
    with torch.no_grad():
        for lo in range(0, ctx - 1, chunk):
            hi = min(ctx - 1, lo + chunk)
            o.forward(prompt[lo:hi], torch.arange(lo, hi, device=dev))
    e = Engine(spec, w, max_ctx=max_ctx, attention="splitk", pdl=pdl)
    e.adopt_cache(o.k_cache, o.v_cache, ctx - 1, prompt)
    e.capture()
    e.adopt_cache(o.k_cache, o.v_cache, ctx - 1, prompt)
    for _ in range(tokens):
        e.step(True)
    got = e.seq[ctx: ctx + tokens].cpu().long()
    # the oracle continues from the same state
    ids, margins = [], []
    with torch.no_grad():
        logits = o.forward(prompt[ctx - 1: ctx], torch.tensor([ctx - 1], device=dev))
        for i in range(tokens):
            lg = logits[-1]
            t2 = lg.topk(2).values
            margins.append(float(t2[0] - t2[1]))
            tok = lg.argmax()
            ids.append(int(tok))
            if i + 1 < tokens:
                logits = o.forward(tok.view(1), torch.tensor([ctx + i], device=dev))
    ref = torch.tensor(ids)
    n = agreement(got, ref)
    return {"model": spec.name, "ctx": ctx, "agree": f"{n}/{tokens}", "min_margin": min(margins),
            "engine": got.tolist(), "oracle": ref.tolist()}


# --------------------------------------------------------------------------------------
# per op, from the engine's own plan
# --------------------------------------------------------------------------------------
def plan_op_rows(spec, w, device="cuda", ctx: int = 512, iters: int = 50, read_tbps=None,
                 pdl: bool = False, tokens: int = 8) -> list[dict]:
    """Microseconds per launch of each op of the plan, in the step's own buffers and
    configurations: an engine is checked against the oracle (teacher-forced, the ladder's
    rule) and run to position ``ctx``; then, for each op, all its launches of one step
    (every layer) are captured in one CUDA graph and replayed. Bytes are the plan's, so
    ``excess_us`` is the time beyond what the bytes need at the measured bandwidth.
    Returns [] and a refusal row if the engine fails the oracle check."""
    from . import plan as plan_mod
    spec = get_spec(spec)
    dev = torch.device(device)
    g = torch.Generator().manual_seed(11)
    prompt = torch.randint(0, spec.vocab, (ctx,), generator=g)
    e = Engine(spec, w, max_ctx=ctx + tokens + 64, attention="splitk", pdl=pdl)
    ref = oracle_tokens(spec, w, prompt, tokens, ctx + tokens + 64)
    j = judge(e, prompt, ref, graph=True)
    if not j["ok"]:
        return [{"model": spec.name, "op": "all", "refused": "engine fails the oracle check",
                 "flips": j["flips"]}]
    e.pos.fill_(ctx)
    e.prompt_len.fill_(1 << 30)              # timing: positions advance, no token written
    rows = []
    for op in dict.fromkeys(L.op for L in e.plan):
        launches = [L for L in e.plan if L.op == op]
        saved = e.pos.clone()

        def run(ls=launches):            # (the LM head advances pos by one a replay)
            for L in ls:
                L.run()
        us = _graph_time(run, len(launches), dev, iters)
        e.pos.copy_(saved)
        nbytes = launches[0].bytes_at(ctx)
        bound = nbytes / (read_tbps * 1e12) * 1e6 if read_tbps else None
        rows.append({"model": spec.name, "op": op, "launches": len(launches), "us": us,
                     "bytes": nbytes, "bytes_us": bound,
                     "excess_us": us - bound if bound is not None else None,
                     "pct_of_read": 100 * bound / us if bound else None, "ctx": ctx,
                     "pdl": e.pdl})
    return rows


# --------------------------------------------------------------------------------------
def config_sweep(spec, w, device="cuda", iters=30, read_tbps=None, pdl=None,
                 grid: dict | None = None, echo: bool = True) -> list[dict]:
    """Time launch configurations of each GEMV kernel; returns one row per config.

    Each config runs once per layer, back to back in one CUDA graph, with programmatic
    dependent launch where the GPU has it (as in the engine's fastest rung), so the
    numbers include what a kernel's boundary costs inside the step. PREFETCH is how many
    weight tiles a program keeps in flight (requested before its ``gdc_wait``, then one
    more per tile consumed); BLOCK_K 2048 covers all of K = 1536 in one (masked) tile.
    The first entry of each op is the previous sweep's winner, so the table can only
    improve. ``grid`` ({op: [config, ...]}) replaces the built-in list."""
    pdl = config.pdl_supported(device) if pdl is None else pdl

    def cfgs(*rows, keys=("BLOCK_N", "BLOCK_K", "PREFETCH", "num_warps")):
        return [dict(zip(keys, r)) for r in rows]
    down_keys = ("BLOCK_N", "BLOCK_K", "PREFETCH", "num_warps", "SPLIT_K")
    grid = grid or {
        "rms_qkv": cfgs((8, 2048, 1, 4), (8, 512, 2, 4), (8, 512, 3, 4), (4, 512, 2, 4), (16, 512, 2, 4)),
        "o_proj": cfgs((8, 2048, 1, 8), (8, 512, 2, 4), (8, 512, 3, 8), (16, 512, 2, 8), (4, 512, 2, 4)),
        "gate_up": cfgs((4, 512, 2, 4), (4, 512, 3, 4), (2, 512, 2, 4), (8, 512, 2, 4), (4, 256, 4, 4),
                        (4, 256, 3, 4), (4, 512, 2, 8)),
        "down": cfgs((2, 1024, 4, 4, 1), (2, 1024, 2, 4, 1), (2, 1024, 3, 4, 1), (2, 512, 4, 4, 1),
                     (4, 512, 4, 4, 1), (4, 1024, 2, 4, 1), (2, 1024, 2, 8, 1), (8, 512, 2, 4, 5),
                     (4, 512, 3, 4, 5), keys=down_keys),
        "lm_head": cfgs((64, 256, 1, 4), (64, 256, 2, 4), (32, 256, 2, 4), (32, 256, 3, 4)),
    }
    P = pack_weights(get_spec(spec), w)          # once: packing copies the weights
    out = []
    for op, cands in grid.items():
        for c in cands:
            r = _time_one(spec, w, device, op, c, iters, read_tbps, packed=P, pdl=pdl)
            if echo:
                print(json.dumps(r), flush=True)     # a sweep cut short still reports
            out.append(r)
    return out


def write_table(sweep: list[dict], read_tbps: float, model: str) -> str:
    """Keep the fastest configuration of each op (ties: the first in grid order)."""
    import os
    import datetime
    best = {}
    for r in sweep:
        if "us" in r and (r["op"] not in best or r["us"] < best[r["op"]]["us"]):
            best[r["op"]] = r
    arch = config.arch(0)
    os.makedirs(config.TUNED_DIR, exist_ok=True)
    p = os.path.join(config.TUNED_DIR, f"{arch}.json")
    with open(p, "w") as f:
        json.dump({"arch": arch, "gpu": torch.cuda.get_device_name(), "model": model,
                   "read_tbps": read_tbps, "date": datetime.date.today().isoformat(),
                   "ops": {op: r["cfg"] for op, r in best.items()},
                   "measured": {op: {"us": r["us"], "pct_of_read": r["pct_of_read"]} for op, r in best.items()}},
                  f, indent=1)
    config.tuned.cache_clear()
    return p


def _time_one(spec, w, device, op, c, iters, read_tbps, packed=None, pdl=False):
    spec = get_spec(spec)
    s, dev, bf = spec, torch.device(device), torch.bfloat16
    P = packed or pack_weights(spec, w)
    Ls, eps = P["layers"], s.rms_eps
    x = torch.randn(s.hidden, device=dev).to(bf)
    try:
        if op == "rms_qkv":
            out = torch.empty(s.qkv_size, dtype=bf, device=dev)
            fn = lambda: [K.rms_qkv(x, L["input_norm"], L["w_qkv"], L["b_qkv"], out, eps, use_pdl=pdl, cfg=c) for L in Ls]
            nbytes, n = Ls[0]["w_qkv"].numel() * 2, len(Ls)
        elif op == "o_proj":
            a = torch.randn(s.q_size, device=dev).to(bf)
            fn = lambda: [K.o_proj_residual(a, L["w_o"], x, use_pdl=pdl, cfg=c) for L in Ls]
            nbytes, n = Ls[0]["w_o"].numel() * 2, len(Ls)
        elif op == "gate_up":
            h = torch.empty(s.intermediate, dtype=bf, device=dev)
            fn = lambda: [K.rms_gate_up_swiglu(x, L["post_norm"], L["w_gate_up"], h, eps, use_pdl=pdl, cfg=c) for L in Ls]
            nbytes, n = Ls[0]["w_gate_up"].numel() * 2, len(Ls)
        elif op == "down":
            hh = torch.randn(s.intermediate, device=dev).to(bf)
            sc = torch.zeros(16 * s.hidden, dtype=torch.float32, device=dev)
            cnt = torch.zeros(s.hidden, dtype=torch.int32, device=dev)
            fn = lambda: [K.down_residual(hh, L["w_down"], x, sc, cnt, use_pdl=pdl, cfg=c) for L in Ls]
            nbytes, n = Ls[0]["w_down"].numel() * 2, len(Ls)
        else:
            n_prog = -(-s.vocab // c["BLOCK_N"])
            lg = torch.empty(s.vocab, dtype=torch.float32, device=dev)
            pv = torch.empty(n_prog, dtype=torch.float32, device=dev)
            pi = torch.empty(n_prog, dtype=torch.int32, device=dev)
            cnt = torch.zeros(1, dtype=torch.int32, device=dev)
            seq = torch.zeros(64, dtype=torch.int32, device=dev)
            p0 = torch.zeros(1, dtype=torch.int32, device=dev)
            pl = torch.full((1,), 10 ** 6, dtype=torch.int32, device=dev)
            fn = lambda: [K.lm_head_argmax(x, P["norm"], P["lm_head"], lg, pv, pi, cnt, seq, p0, pl, eps, use_pdl=pdl, cfg=c)
                          for _ in range(4)]
            nbytes, n = P["lm_head"].numel() * 2, 4
        us = _graph_time(fn, n, dev, iters)
        gbps = nbytes / (us * 1e-6) / 1e9
        return {"op": op, "cfg": c, "pdl": bool(pdl), "us": us, "gbps": gbps,
                "pct_of_read": 100 * gbps / (read_tbps * 1e3) if read_tbps else None}
    except Exception as ex:
        return {"op": op, "cfg": c, "error": f"{type(ex).__name__}: {str(ex)[:200]}"}


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m onelaunch.bench")
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--what", default="kernels,ladder")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--json", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write-table", action="store_true",
                    help="with sweepcfg: write the fastest config of each op to kernels/tuned/<arch>.json")
    a = ap.parse_args(argv)
    dev = "cuda"
    spec = get_spec(a.model)
    w = random_weights(spec, a.seed, device=dev)
    bw = read_bandwidth(dev)
    print(f"read bandwidth {bw:.3f} TB/s; floor {spec.floor_ms(bw, a.ctx):.3f} ms/token at ctx {a.ctx}")
    out = {"read_tbps": bw}
    what = a.what.split(",")
    if "sweepcfg" in what:
        out["config_sweep"] = config_sweep(spec, w, dev, read_tbps=bw)
        if a.write_table:
            print("wrote", write_table(out["config_sweep"], bw, spec.name))
    if "kernels" in what and not spec.is_moe:
        out["kernels"] = kernel_rows(spec, w, dev, ctx=a.ctx, read_tbps=bw)
        for r in out["kernels"]:
            print(json.dumps(r))
    if "ops" in what:
        out["ops"] = plan_op_rows(spec, w, dev, ctx=a.ctx, read_tbps=bw)
        for r in out["ops"]:
            print(json.dumps(r))
    if "peers" in what:      # the peers in this process: every ratio from one run
        from .peers import peer_rungs
        out["peers"] = peer_rungs(spec.name, ctx=a.ctx, device=dev, iters=50, new_tokens=32)
        for r in out["peers"]:
            r["floor_ms"] = spec.floor_ms(bw, a.ctx)
            print(json.dumps(r))
    if "ladder" in what:
        out["ladder"] = ladder_rows(spec, w, dev, ctx=a.ctx, iters=a.iters, read_tbps=bw)
        for r in out["ladder"]:
            print(json.dumps(r))
    longest = spec.max_ctx - 96                      # room for the timed steps
    if "sweep" in what:
        ctxs = [c for c in (128, 512, 1024, 2048, 4000, 8192, 16384, 32768) if c <= longest]
        out["sweep"] = sweep_rows(spec, w, dev, ctxs=tuple(ctxs), read_tbps=bw)
        for r in out["sweep"]:
            print(json.dumps(r))
    if "long" in what:
        out["long"] = long_context_agreement(spec, w, dev, ctx=min(32768, 4000 if spec.is_moe else longest))
        print(json.dumps(out["long"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
