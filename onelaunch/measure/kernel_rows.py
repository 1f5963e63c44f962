"""Kernel rows: each fused kernel checked against its reference on layer 0, then timed
over every layer (:func:`kernel_rows`); and each op of the engine's own plan timed in the
step's buffers (:func:`plan_op_rows`).

Per-kernel times are taken over all layers' weights back to back, captured in one CUDA
graph: the H200's 60 MB L2 would otherwise serve a re-read layer from cache. Nothing is
timed before it is checked; a kernel that fails gets ``us`` None and the reason.
"""
from __future__ import annotations

import torch

from .. import kernels as K
from ..kernels import config
from ..oracle import apply_rope, rope_cos_sin
from ..prompt import random_prompt
from ..weights import pack_weights
from . import agree
from .references import (ATTN_TOL, GEMV_TOL, ref_attention, ref_lm_head,
                         ref_matvec_residual, ref_rms_gate_up_swiglu, ref_rms_qkv, rel_err,
                         splits_written)
from .rungs import make_engine
from .timing import graph_time, run_ctx


def kernel_rows(spec, w, device="cuda", ctx: int = 512, iters: int = 50, read_tbps=None,
                tol: float = GEMV_TOL, attn_tol: float = ATTN_TOL,
                cfgs: dict | None = None) -> list[dict]:
    """Check each fused kernel against its reference on layer 0, then (only if it passed)
    time it over every layer.

    Tolerance: relative L2 error against a torch reference that rounds where the kernel
    rounds (``ref_*`` above): ``tol`` for the GEMV kernels and the RoPE/KV write (which
    the tests hold to bit-exactness), ``attn_tol`` for attention. The LM head's token is
    judged by the agreement rule against the reference logits. A kernel that fails gets ``us`` None and a ``check``
    that says why."""
    s, dev, bf = spec, torch.device(device), torch.bfloat16
    P = pack_weights(spec, w)
    Ls = P["layers"]
    cfgs = cfgs or {}
    cfg = lambda op, shape=None: cfgs.get(op) or config.get(op, dev, shape)
    g = torch.Generator(device="cpu").manual_seed(1)
    rnd = lambda *shape: torch.randn(*shape, generator=g).to(dev, bf)
    eps = s.rms_eps
    rows = []
    nL = s.layers
    info = {}            # each timing's spread (graph_time fills it): us_min, us_max

    def row(kernel, time_fn, nbytes, err, limit, note="", extra_fail=None):
        ok = err <= limit and not extra_fail
        info.clear()
        us = time_fn() if ok else None                  # nothing is timed unchecked
        r = {"kernel": kernel, "us": us, "us_min": info.get("us_min"),
             "us_max": info.get("us_max"), "timed": info.get("timed"), "bytes": nbytes,
             "gbps": (nbytes / (us * 1e-6) / 1e9) if ok else None,
             "read_gbps": read_tbps * 1e3 if read_tbps else None, "rel_err": err, "tol": limit,
             "check": "pass" if ok else (f"FAIL ({extra_fail})" if extra_fail else
                                         f"FAIL (rel err {err:.2e} > {limit:.0e})")}
        if ok and read_tbps:
            r["pct_of_read"] = 100 * r["gbps"] / (read_tbps * 1e3)
        if note:
            r["note"] = note
        rows.append(r)

    x = rnd(s.hidden)
    L0 = Ls[0]
    # ---- rms + qkv ----------------------------------------------------------------------
    out = torch.full((s.qkv_size,), float("nan"), dtype=bf, device=dev)
    c_qkv = cfg("rms_qkv", L0["w_qkv"].shape)
    K.rms_qkv.rms_qkv(x, L0["input_norm"], L0["w_qkv"], L0["b_qkv"], out, eps, cfg=c_qkv)
    err = rel_err(out, ref_rms_qkv(x, L0["input_norm"], L0["w_qkv"], L0["b_qkv"], eps))
    row("rms_qkv", lambda: graph_time(
        lambda: [K.rms_qkv.rms_qkv(x, L["input_norm"], L["w_qkv"], L["b_qkv"], out, eps, cfg=c_qkv) for L in Ls],
        nL, dev, iters, info), L0["w_qkv"].numel() * 2 + s.qkv_size * 2 * 2, err, tol)
    # ---- rope + kv write ------------------------------------------------------------------
    C = run_ctx(ctx, 0, 0)
    kc = torch.zeros(nL, s.kv_heads, C, s.head_dim, dtype=bf, device=dev)
    vc = torch.zeros_like(kc)
    cos, sin = rope_cos_sin(torch.arange(C, device=dev), s.head_dim, s.rope_theta, bf)
    pos = torch.tensor([ctx - 1], dtype=torch.int32, device=dev)
    qkv = rnd(s.qkv_size)
    q = torch.empty(s.q_size, dtype=bf, device=dev)
    K.rope_kv_write.rope_kv_write(qkv, q, kc[0], vc[0], cos, sin, pos, s.heads, s.kv_heads, s.head_dim)
    c1, s1 = cos[ctx - 1: ctx], sin[ctx - 1: ctx]
    q_ref = apply_rope(qkv[: s.q_size].view(1, s.heads, s.head_dim), c1, s1).flatten()
    k_ref = apply_rope(qkv[s.q_size: s.q_size + s.kv_size].view(1, s.kv_heads, s.head_dim), c1, s1)[0]
    err = max(rel_err(q, q_ref), rel_err(kc[0, :, ctx - 1], k_ref),
              rel_err(vc[0, :, ctx - 1], qkv[s.q_size + s.kv_size:].view(s.kv_heads, s.head_dim)))
    row("rope_kv_write", lambda: graph_time(
        lambda: [K.rope_kv_write.rope_kv_write(qkv, q, kc[i], vc[i], cos, sin, pos, s.heads, s.kv_heads,
                                 s.head_dim) for i in range(nL)], nL, dev, iters, info),
        (s.qkv_size + s.q_size + 2 * s.kv_size) * 2, err, tol,
        note="rounds where HF's bf16 RoPE rounds: bit-exact in the tests")
    # ---- attention at ctx: plain and split-K ------------------------------------------
    kc.copy_(torch.randn(kc.shape, generator=g).to(dev, bf))
    vc.copy_(torch.randn(vc.shape, generator=g).to(dev, bf))
    q = rnd(s.q_size)
    attn = torch.full((s.q_size,), float("nan"), dtype=bf, device=dev)
    ref = ref_attention(q, kc[0], vc[0], ctx, s.heads, s.kv_heads, s.head_dim)
    kv_bytes = 2 * ctx * s.kv_heads * s.head_dim * 2
    K.attention.attention(q, kc[0], vc[0], attn, pos, s.heads, s.kv_heads, s.head_dim, cfg("attention"))
    err = rel_err(attn, ref)
    row("attention (plain)", lambda: graph_time(
        lambda: [K.attention.attention(q, kc[i], vc[i], attn, pos, s.heads, s.kv_heads, s.head_dim,
                             cfg("attention")) for i in range(nL)], nL, dev, iters, info),
        kv_bytes, err, attn_tol, note=f"ctx {ctx}, one program per query head")
    chunk = K.attention_splitk.chunk_for(C)
    ns = K.attention_splitk.n_splits_for(C, chunk)
    po = torch.empty(s.heads, ns, s.head_dim, dtype=torch.float32, device=dev)
    pm = torch.empty(s.heads, ns, dtype=torch.float32, device=dev)
    pl = torch.empty_like(pm)
    attn.fill_(float("nan"))
    K.attention_splitk.attention_splitk(q, kc[0], vc[0], attn, pos, po, pm, pl, s.heads, s.kv_heads, s.head_dim, chunk,
                       cfg("attention_splitk"))
    err = rel_err(attn, ref)
    row("attention (split-K, 2 launches)", lambda: graph_time(
        lambda: [K.attention_splitk.attention_splitk(q, kc[i], vc[i], attn, pos, po, pm, pl, s.heads, s.kv_heads,
                                    s.head_dim, chunk, cfg("attention_splitk")) for i in range(nL)],
        nL, dev, iters, info), kv_bytes, err, attn_tol, note=f"ctx {ctx}, chunk {chunk}")
    # ---- o_proj + residual -----------------------------------------------------------
    a = rnd(s.q_size)
    xo = x.clone()
    c_o = cfg("o_proj_residual", L0["w_o"].shape)
    K.o_proj_residual.o_proj_residual(a, L0["w_o"], xo, cfg=c_o)
    err = rel_err(xo, ref_matvec_residual(a, L0["w_o"], x))
    xs = x.clone()
    row("o_proj_residual", lambda: graph_time(
        lambda: [K.o_proj_residual.o_proj_residual(a, L["w_o"], xs, cfg=c_o) for L in Ls],
        nL, dev, iters, info),
        L0["w_o"].numel() * 2 + s.hidden * 4, err, tol)
    if "w_gate_up" in L0:    # the dense MLP (a mixture of experts has its own kernels)
        # ---- rms + gate/up + swiglu ----------------------------------------------------
        h = torch.full((s.intermediate,), float("nan"), dtype=bf, device=dev)
        c_gu = cfg("rms_gate_up_swiglu", L0["w_gate_up"].shape)
        K.rms_gate_up_swiglu.rms_gate_up_swiglu(x, L0["post_norm"], L0["w_gate_up"], h, eps, cfg=c_gu)
        err = rel_err(h, ref_rms_gate_up_swiglu(x, L0["post_norm"], L0["w_gate_up"], eps))
        row("rms_gate_up_swiglu", lambda: graph_time(
            lambda: [K.rms_gate_up_swiglu.rms_gate_up_swiglu(x, L["post_norm"], L["w_gate_up"], h, eps, cfg=c_gu)
                     for L in Ls], nL, dev, iters, info),
            L0["w_gate_up"].numel() * 2 + s.intermediate * 2, err, tol)
        # ---- down + residual -----------------------------------------------------------
        hh = rnd(s.intermediate)
        scratch = torch.full((16 * s.hidden,), float("nan"), dtype=torch.float32, device=dev)
        counter = torch.zeros(s.hidden, dtype=torch.int32, device=dev)
        xd = x.clone()
        c_d = cfg("down_residual", L0["w_down"].shape)
        K.down_residual.down_residual(hh, L0["w_down"], xd, scratch, counter, cfg=c_d)
        err = rel_err(xd, ref_matvec_residual(hh, L0["w_down"], x))
        n_split = splits_written(scratch, s.hidden)
        left = int(counter.abs().max())
        xs = x.clone()
        row("down_residual", lambda: graph_time(
            lambda: [K.down_residual.down_residual(hh, L["w_down"], xs, scratch, counter, cfg=c_d) for L in Ls],
            nL, dev, iters, info), L0["w_down"].numel() * 2 + s.hidden * 4, err, tol,
            note=f"split-K {max(1, n_split)} (asked {c_d.get('SPLIT_K', 1)}), last-arrival epilogue",
            extra_fail=f"counters left at {left}, not 0" if left else None)
    # ---- final norm + lm_head + argmax ---------------------------------------------------
    c_lm = cfg("lm_head_argmax", P["lm_head"].shape)
    n_prog = -(-s.vocab // c_lm["BLOCK_N"])
    logits = torch.full((s.vocab,), float("nan"), dtype=torch.float32, device=dev)
    pv = torch.empty(n_prog, dtype=torch.float32, device=dev)
    pi = torch.empty(n_prog, dtype=torch.int32, device=dev)
    cnt = torch.zeros(1, dtype=torch.int32, device=dev)
    seq = torch.zeros(C + 1, dtype=torch.int32, device=dev)
    p0 = torch.tensor([ctx - 1], dtype=torch.int32, device=dev)
    plen = torch.zeros(1, dtype=torch.int32, device=dev)
    K.lm_head_argmax.lm_head_argmax(x, P["norm"], P["lm_head"], logits, pv, pi, cnt, seq, p0, plen, eps, cfg=c_lm)
    ref, _ = ref_lm_head(x, P["norm"], P["lm_head"], eps)
    err = rel_err(logits, ref)
    tok = agree.judge_step(0, ref, int(seq[ctx]))
    bad = None
    if tok["verdict"] == "flip":
        bad = f"token {tok['got_token']}, reference {tok['ref_token']}, gap {tok['gap']:.3g}"
    elif int(p0) != ctx or int(cnt) != 0:
        bad = f"bookkeeping: pos {int(p0)} (want {ctx}), counter {int(cnt)} (want 0)"
    n_rep = 4

    def time_lm():
        plen.fill_(2 ** 30)      # timing: positions advance, but no token is written
        return graph_time(lambda: [K.lm_head_argmax.lm_head_argmax(x, P["norm"], P["lm_head"], logits, pv, pi, cnt,
                                                     seq, p0, plen, eps, cfg=c_lm) for _ in range(n_rep)],
                           n_rep, dev, iters, info)
    row("lm_head_argmax", time_lm, P["lm_head"].numel() * 2 + s.vocab * 4, err, tol,
        note=f"{n_prog} programs; argmax reduced by the last to arrive", extra_fail=bad)
    return rows


def plan_op_rows(spec, w, device="cuda", ctx: int = 512, iters: int = 50, read_tbps=None,
                 pdl: bool = False, tokens: int = 8, seed: int = 0) -> list[dict]:
    """Microseconds per launch of each op of the plan, in the step's own buffers and
    configurations: an engine is checked against the oracle (teacher-forced, the ladder's
    rule) and run to position ``ctx``; then, for each op, all its launches of one step
    (every layer) are captured in one CUDA graph and replayed. Bytes are the plan's, so
    ``excess_us`` is the time beyond what the bytes need at the measured bandwidth.
    Returns one refusal row if the engine fails the oracle check."""
    dev = torch.device(device)
    prompt = random_prompt(spec, ctx, 11 + seed)
    max_ctx = run_ctx(ctx, tokens, 0)
    e = make_engine(spec, w, max_ctx=max_ctx, attention="splitk", pdl=pdl)
    ref = agree.oracle_tokens(spec, w, prompt, tokens, max_ctx)
    j = agree.judge(e, prompt, ref, graph=True)
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
        spread = {}
        us = graph_time(run, len(launches), dev, iters, spread)
        e.pos.copy_(saved)
        nbytes = launches[0].bytes_at(ctx)
        bound = nbytes / (read_tbps * 1e12) * 1e6 if read_tbps else None
        rows.append({"model": spec.name, "op": op, "launches": len(launches), "us": us,
                     **spread,
                     "bytes": nbytes, "bytes_us": bound,
                     "excess_us": us - bound if bound is not None else None,
                     "pct_of_read": 100 * bound / us if bound else None, "ctx": ctx,
                     "pdl": e.pdl})
    return rows
