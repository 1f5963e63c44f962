"""Benchmarks: every kernel and every rung, checked against the oracle before it is timed.

Nothing here reports a time for a result the oracle has not confirmed, and nothing is
timed before it is checked: a kernel whose output differs from its torch reference beyond
its tolerance, a rung whose teacher-forced tokens flip against the oracle's (the rule of
:mod:`onelaunch.agree`), a context of the sweep or a launch configuration whose output is
wrong, gets ``None`` and the reason, and the command exits 1 (after printing every row).
Every ratio uses the streaming-read bandwidth measured in the same process
(``timing.read_bandwidth``).

    python -m onelaunch.bench --model qwen2.5-1.5b --ctx 512 --what kernels,ladder,sweep

Per-kernel times are taken over all layers' weights back to back, captured in one CUDA
graph: the H200's 60 MB L2 would otherwise serve a re-read layer from cache.
"""
from __future__ import annotations

import argparse
import json
import sys
import traceback

import torch
import torch.nn.functional as F

from . import agree, plan
from . import kernels as K
from .engine import Engine, persistent_refusal
from .kernels import config, tuned
from .oracle import Oracle
from .specs import get_spec
from .timing import read_bandwidth, time_ms
from .weights import random_weights

try:                                   # the packer is moving from the engine to weights
    from .weights import pack_weights
except ImportError:                    # pragma: no cover - until that move lands
    from .engine import pack_weights

RUNGS = ("fused eager", "fused + graph", "+ split-K", "+ PDL")
# "+ RoPE in attention" (ladder_rows(rungs=...) runs it) measured slower than + PDL on the
# H200 and is not a rung of the ladder: NOTES.md, entry 8
# how each rung builds and runs its engine (rung_engine; ladder_rows, profile.profile_rows)
RUNG_SETTINGS = {
    "fused eager": dict(attention="plain", graph=False, pdl=False),
    "fused + graph": dict(attention="plain", graph=True, pdl=False),
    "+ split-K": dict(attention="splitk", graph=True, pdl=False),
    "+ PDL": dict(attention="splitk", graph=True, pdl=True),
    "+ RoPE in attention": dict(attention="splitk", graph=True, pdl=True, fuse_rope=True),
    # one launch a dense layer (kernels/layer_persistent.py), chapter 8: each GEMV phase
    # with a register ring (STAGES 0), without and with the next phase's weight tiles
    # requested before each grid barrier; then streamed through shared memory (the table)
    "persistent, nothing ahead": dict(attention="splitk", graph=True, pdl=True, persistent=True,
                                      cfgs={"layer_persistent": {"NEXT": 0, "STAGES": 0}}),
    "persistent, tiles ahead": dict(attention="splitk", graph=True, pdl=True, persistent=True,
                                    cfgs={"layer_persistent": {"NEXT": 1, "STAGES": 0}}),
    "+ persistent layer": dict(attention="splitk", graph=True, pdl=True, persistent=True),
}


def rung_supported(spec, rung: str) -> bool:
    """Whether ``rung`` applies to ``spec``'s model (the engine's own rule for its
    settings: the persistent layer, dense models only)."""
    st = RUNG_SETTINGS[rung]
    stages = st.get("cfgs", {}).get("layer_persistent", {}).get("STAGES")
    return not (st.get("persistent") and persistent_refusal(
        spec, st["attention"], fuse_rope=st.get("fuse_rope", False), stages=stages))


def rung_engine(spec, w, rung: str, max_ctx: int, persist=None) -> Engine:
    """The engine of ladder rung ``rung`` (:data:`RUNG_SETTINGS`): one place that turns a
    rung's settings into an engine, for the ladder and the profile."""
    st = RUNG_SETTINGS[rung]
    return Engine(spec, w, max_ctx=max_ctx, attention=st["attention"], pdl=st["pdl"],
                  fuse_rope=st.get("fuse_rope", False), persistent=st.get("persistent", False),
                  cfgs=st.get("cfgs"), persist=persist)


def f32(t):
    return t.float() if t is not None else None


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


gate_failures = agree.failures      # the rows whose check failed (refused, FAIL, error)


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
# references: the oracle's ops in fp32, rounded to bf16 exactly where the kernel rounds
# --------------------------------------------------------------------------------------
# A kernel accumulates in fp32 and rounds its intermediates to bf16 where HF's bf16 model
# rounds them. Against a plain fp32 reference that rounding alone costs a few bf16 ulps
# (2^-8 relative each, ~4e-3), which would hide a bug of the same size: one dropped column
# of a 1536-wide GEMV changes the output by ~3e-3 to 2e-2. These references round at the
# same points, so a correct kernel differs from them only where its fp32 sums (summed in
# another order) straddle a bf16 rounding boundary: a fraction of a percent of the
# elements, by one ulp. Measured: bit-identical in the interpreter at every test shape and
# at 512 x 1536; at Qwen2.5-1.5B's shapes an fp32 sum and an exact one round to the same
# bf16 outputs but for 13 of the 151936 logits (3.8e-5 relative L2). GEMV_TOL, a quarter of an ulp on average,
# leaves room for another GPU's summation order and sits far below a one-column bug at
# those shapes: a dropped column is 1.4e-2 (down) to 5.9e-2 (gate/up), a column counted
# twice at a split-K boundary 4.6e-3, a dropped QKV bias 5.8e-2.
GEMV_TOL = 1e-3
# Attention: the split-K kernel on a GPU multiplies bf16 probabilities by bf16 values in
# tl.dot (the plain kernel and the interpreter keep them fp32), so against the fp32
# softmax reference its error includes a bf16 rounding of each p: measured 2.1e-3 on the
# H200 at ctx 512 (plain: 1.6e-3, against an unrounded reference), hence 5e-3.
ATTN_TOL = 5e-3


def bf16r(t: torch.Tensor) -> torch.Tensor:
    """Round to the nearest bf16 (ties to even), kept in fp32: the kernels' ``bf16_round``."""
    return t.float().to(torch.bfloat16).float()


def ref_rms(x, g, eps):
    """rmsnorm(x) * g as the kernels (and HF in bf16) compute it: the statistic in fp32,
    (x * rstd) rounded to bf16, times the gain, rounded again. x, g: [K] -> fp32 [K]."""
    x = x.float()
    rstd = 1.0 / torch.sqrt((x * x).mean() + eps)
    return bf16r(bf16r(x * rstd) * g.float())


def _gemv(w, v):
    return F.linear(v.float()[None], w.float())[0]


def ref_rms_qkv(x, g, w, b, eps):
    """bf16(bf16(W @ xn) + b): the projection rounded, then the bias added and rounded."""
    y = bf16r(_gemv(w, ref_rms(x, g, eps)))
    return y if b is None else bf16r(y + b.float())


def ref_matvec_residual(a, w, x):
    """x + W @ a as o_proj_residual and down_residual round it: bf16(x + bf16(W @ a))."""
    return bf16r(x.float() + bf16r(_gemv(w, a)))


def ref_swiglu(gate, up):
    """silu(gate) * up as the kernels round it: gate, up, silu(gate), then the product."""
    gate, up = bf16r(gate), bf16r(up)
    return bf16r(bf16r(gate / (1.0 + torch.exp(-gate))) * up)


def ref_rms_gate_up_swiglu(x, g, w_gate_up, eps):
    I = w_gate_up.shape[0] // 2
    gu = _gemv(w_gate_up, ref_rms(x, g, eps))
    return ref_swiglu(gu[:I], gu[I:])


def ref_lm_head(x, g, w, eps):
    """bf16-rounded logits (fp32 [V]) and their argmax (the first index among equals)."""
    logits = bf16r(_gemv(w, ref_rms(x, g, eps)))
    return logits, int(logits.argmax())


def ref_attention(q, kc, vc, length, heads, kv_heads, head_dim):
    """Decode attention in fp32 over the first ``length`` positions, output rounded."""
    grp = heads // kv_heads
    Kr = kc[:, :length].float().repeat_interleave(grp, 0)
    Vr = vc[:, :length].float().repeat_interleave(grp, 0)
    sc = torch.einsum("hd,hcd->hc", q.view(heads, head_dim).float(), Kr) * head_dim ** -0.5
    return bf16r(torch.einsum("hc,hcd->hd", sc.softmax(-1), Vr).flatten())


def splits_written(scratch: torch.Tensor, n: int) -> int:
    """How many [n]-rows of a NaN-filled split-K scratch buffer a launch wrote: the split
    count the kernel really ran (0 when it did not split)."""
    rows = scratch[: (scratch.numel() // n) * n].view(-1, n)
    return int((~torch.isnan(rows)).all(1).sum())


# --------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------
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
    spec = get_spec(spec)
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

    def row(kernel, time_fn, nbytes, err, limit, note="", extra_fail=None):
        ok = err <= limit and not extra_fail
        us = time_fn() if ok else None                  # nothing is timed unchecked
        r = {"kernel": kernel, "us": us, "bytes": nbytes,
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
    K.rms_qkv(x, L0["input_norm"], L0["w_qkv"], L0["b_qkv"], out, eps, cfg=c_qkv)
    err = rel_err(out, ref_rms_qkv(x, L0["input_norm"], L0["w_qkv"], L0["b_qkv"], eps))
    row("rms_qkv", lambda: _graph_time(
        lambda: [K.rms_qkv(x, L["input_norm"], L["w_qkv"], L["b_qkv"], out, eps, cfg=c_qkv) for L in Ls],
        nL, dev, iters), L0["w_qkv"].numel() * 2 + s.qkv_size * 2 * 2, err, tol)
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
    row("rope_kv_write", lambda: _graph_time(
        lambda: [K.rope_kv_write(qkv, q, kc[i], vc[i], cos, sin, pos, s.heads, s.kv_heads,
                                 s.head_dim) for i in range(nL)], nL, dev, iters),
        (s.qkv_size + s.q_size + 2 * s.kv_size) * 2, err, tol,
        note="rounds where HF's bf16 RoPE rounds: bit-exact in the tests")
    # ---- attention at ctx: plain and split-K ------------------------------------------
    kc.copy_(torch.randn(kc.shape, generator=g).to(dev, bf))
    vc.copy_(torch.randn(vc.shape, generator=g).to(dev, bf))
    q = rnd(s.q_size)
    attn = torch.full((s.q_size,), float("nan"), dtype=bf, device=dev)
    ref = ref_attention(q, kc[0], vc[0], ctx, s.heads, s.kv_heads, s.head_dim)
    kv_bytes = 2 * ctx * s.kv_heads * s.head_dim * 2
    K.attention(q, kc[0], vc[0], attn, pos, s.heads, s.kv_heads, s.head_dim, cfg("attention"))
    err = rel_err(attn, ref)
    row("attention (plain)", lambda: _graph_time(
        lambda: [K.attention(q, kc[i], vc[i], attn, pos, s.heads, s.kv_heads, s.head_dim,
                             cfg("attention")) for i in range(nL)], nL, dev, iters),
        kv_bytes, err, attn_tol, note=f"ctx {ctx}, one program per query head")
    chunk = K.chunk_for(C)
    ns = K.n_splits_for(C, chunk)
    po = torch.empty(s.heads, ns, s.head_dim, dtype=torch.float32, device=dev)
    pm = torch.empty(s.heads, ns, dtype=torch.float32, device=dev)
    pl = torch.empty_like(pm)
    attn.fill_(float("nan"))
    K.attention_splitk(q, kc[0], vc[0], attn, pos, po, pm, pl, s.heads, s.kv_heads, s.head_dim, chunk,
                       cfg("attn_split"))
    err = rel_err(attn, ref)
    row("attention (split-K, 2 launches)", lambda: _graph_time(
        lambda: [K.attention_splitk(q, kc[i], vc[i], attn, pos, po, pm, pl, s.heads, s.kv_heads,
                                    s.head_dim, chunk, cfg("attn_split")) for i in range(nL)],
        nL, dev, iters), kv_bytes, err, attn_tol, note=f"ctx {ctx}, chunk {chunk}")
    # ---- o_proj + residual -----------------------------------------------------------
    a = rnd(s.q_size)
    xo = x.clone()
    c_o = cfg("o_proj", L0["w_o"].shape)
    K.o_proj_residual(a, L0["w_o"], xo, cfg=c_o)
    err = rel_err(xo, ref_matvec_residual(a, L0["w_o"], x))
    xs = x.clone()
    row("o_proj_residual", lambda: _graph_time(
        lambda: [K.o_proj_residual(a, L["w_o"], xs, cfg=c_o) for L in Ls], nL, dev, iters),
        L0["w_o"].numel() * 2 + s.hidden * 4, err, tol)
    if "w_gate_up" in L0:    # the dense MLP (a mixture of experts has its own kernels)
        # ---- rms + gate/up + swiglu ----------------------------------------------------
        h = torch.full((s.intermediate,), float("nan"), dtype=bf, device=dev)
        c_gu = cfg("gate_up", L0["w_gate_up"].shape)
        K.rms_gate_up_swiglu(x, L0["post_norm"], L0["w_gate_up"], h, eps, cfg=c_gu)
        err = rel_err(h, ref_rms_gate_up_swiglu(x, L0["post_norm"], L0["w_gate_up"], eps))
        row("rms_gate_up_swiglu", lambda: _graph_time(
            lambda: [K.rms_gate_up_swiglu(x, L["post_norm"], L["w_gate_up"], h, eps, cfg=c_gu)
                     for L in Ls], nL, dev, iters),
            L0["w_gate_up"].numel() * 2 + s.intermediate * 2, err, tol)
        # ---- down + residual -----------------------------------------------------------
        hh = rnd(s.intermediate)
        scratch = torch.full((16 * s.hidden,), float("nan"), dtype=torch.float32, device=dev)
        counter = torch.zeros(s.hidden, dtype=torch.int32, device=dev)
        xd = x.clone()
        c_d = cfg("down", L0["w_down"].shape)
        K.down_residual(hh, L0["w_down"], xd, scratch, counter, cfg=c_d)
        err = rel_err(xd, ref_matvec_residual(hh, L0["w_down"], x))
        n_split = splits_written(scratch, s.hidden)
        left = int(counter.abs().max())
        xs = x.clone()
        row("down_residual", lambda: _graph_time(
            lambda: [K.down_residual(hh, L["w_down"], xs, scratch, counter, cfg=c_d) for L in Ls],
            nL, dev, iters), L0["w_down"].numel() * 2 + s.hidden * 4, err, tol,
            note=f"split-K {max(1, n_split)} (asked {c_d.get('SPLIT_K', 1)}), last-arrival epilogue",
            extra_fail=f"counters left at {left}, not 0" if left else None)
    # ---- final norm + lm_head + argmax ---------------------------------------------------
    c_lm = cfg("lm_head", P["lm_head"].shape)
    n_prog = -(-s.vocab // c_lm["BLOCK_N"])
    logits = torch.full((s.vocab,), float("nan"), dtype=torch.float32, device=dev)
    pv = torch.empty(n_prog, dtype=torch.float32, device=dev)
    pi = torch.empty(n_prog, dtype=torch.int32, device=dev)
    cnt = torch.zeros(1, dtype=torch.int32, device=dev)
    seq = torch.zeros(C + 1, dtype=torch.int32, device=dev)
    p0 = torch.tensor([ctx - 1], dtype=torch.int32, device=dev)
    plen = torch.zeros(1, dtype=torch.int32, device=dev)
    K.lm_head_argmax(x, P["norm"], P["lm_head"], logits, pv, pi, cnt, seq, p0, plen, eps, cfg=c_lm)
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
        return _graph_time(lambda: [K.lm_head_argmax(x, P["norm"], P["lm_head"], logits, pv, pi, cnt,
                                                     seq, p0, plen, eps, cfg=c_lm) for _ in range(n_rep)],
                           n_rep, dev, iters)
    row("lm_head_argmax", time_lm, P["lm_head"].numel() * 2 + s.vocab * 4, err, tol,
        note=f"{n_prog} programs; argmax reduced by the last to arrive", extra_fail=bad)
    return rows


# --------------------------------------------------------------------------------------
# the ladder: our rungs, each checked against the oracle's greedy tokens
# --------------------------------------------------------------------------------------
def oracle_tokens(spec, w, prompt, tokens, max_ctx):
    """The oracle's greedy ids [tokens] and the logits that chose them [tokens, V] (fp32,
    on the CPU): the reference every rung is judged against (:func:`agree.judge_tokens`)."""
    o = Oracle(spec, w, max_ctx=max_ctx)
    ids, logits = o.generate(prompt, tokens, return_logits=True)
    del o
    return ids.cpu(), logits.float().cpu()


def agreement(got: torch.Tensor, ref: torch.Tensor) -> int:
    """Tokens matching before the first divergence (after it, prefixes differ)."""
    n = 0
    for a, b in zip(got.tolist(), ref.tolist()):
        if a != b:
            break
        n += 1
    return n


def judge(engine: Engine, prompt, ref, graph: bool) -> dict:
    """The oracle check of one engine mode, by the agreement rule (:mod:`onelaunch.agree`).

    The engine runs teacher-forced: fed the oracle's own tokens, it records its argmax at
    every step, so each step is judged from the oracle's prefix and one early near tie
    cannot hide the later steps. A step passes when the engine's token is the oracle's,
    or when the oracle's logit for the engine's token is strictly within the near-tie
    threshold of the oracle's top logit. Every step that differs is listed (``flips``,
    with both logits, the gap and the verdict); ``ok`` is False on any real flip. The
    free-running tokens (the path the GPU feeds back to itself) are reported too."""
    ref_ids, ref_logits = ref
    n = ref_ids.numel()
    free = engine.generate(prompt, n, graph=graph)
    tf = engine.teacher_forced(prompt, ref_ids, graph=graph)
    j = agree.judge_tokens(ref_logits, tf)
    return {"agree": j["agree"], "agree_free": f"{agreement(free, ref_ids)}/{n}",
            "flips": agree.disagreements(j), "ok": j["ok"], "tokens": free.tolist(),
            "teacher_forced": tf.tolist()}


def refusal(flips: list[dict]) -> str:
    """The reason a row is refused: its real flips, as the agreement rule judged them."""
    real = [{k: f[k] for k in ("step", "ref_token", "got_token", "ref_top", "ref_got", "gap",
                               "threshold", "verdict")} for f in flips if f["verdict"] == "flip"]
    return ("teacher-forced choices differ from the oracle beyond a near tie "
            f"(gap >= {agree.NEAR_TIE_ULPS} bf16 ulps of the top logit): " + json.dumps(real))


def time_engine_step(e: Engine, graph: bool, iters: int, device) -> float:
    t = time_ms(lambda: e.step(graph), iters=iters, warmup=min(5, iters), device=device)
    return t.median_ms


def ladder_prompt(spec, ctx: int, tokens: int, iters: int, seed: int = 0, max_ctx=None):
    """The ladder's prompt (``ctx`` seeded random ids) and engine size: ``(prompt, tokens,
    max_ctx)``, the arguments of :func:`oracle_tokens` after the spec and weights."""
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, get_spec(spec).vocab, (ctx,), generator=g)
    return prompt, tokens, max_ctx or (ctx + tokens + iters + 64)


def ladder_rows(spec, w, device="cuda", ctx=512, tokens=12, iters=100, read_tbps=None,
                max_ctx=None, seed=0, rungs=RUNGS, ref=None) -> list[dict]:
    """One row per rung: checked (:func:`judge`), then timed only if the check passed.
    A refused row has ``ms_per_token`` None and ``refused`` (the flips, as JSON)."""
    spec = get_spec(spec)
    dev = torch.device(device)
    prompt, _, max_ctx = ladder_prompt(spec, ctx, tokens, iters, seed, max_ctx)
    ref = ref if ref is not None else oracle_tokens(spec, w, prompt, tokens, max_ctx)
    floor = spec.bytes_per_token(ctx) / (read_tbps * 1e12) * 1e3 if read_tbps else None
    rows, eager_tokens, prev_tokens = [], None, None
    for rung in rungs:
        st = RUNG_SETTINGS[rung]
        if rung == "+ PDL" and not config.pdl_supported(dev):
            continue                     # later rungs keep their other steps, without PDL
        e = rung_engine(spec, w, rung, max_ctx)
        j = judge(e, prompt, ref, st["graph"])
        r = {"model": spec.name, "rung": rung, "ctx": ctx, "agree": j["agree"],
             "agree_free": j["agree_free"], "flips": j["flips"], "floor_ms": floor,
             "read_tbps": read_tbps, "launches": e.launches_per_step(),
             "order": 10 + (RUNGS.index(rung) if rung in RUNGS else len(RUNGS)),
             "kind": "ours", "rule": f"gap < {agree.NEAR_TIE_ULPS} bf16 ulps of the top logit"}
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
            # eager steps are slow: a quarter of the replays, at least 10 (or all of a few)
            ms = time_engine_step(e, st["graph"], iters if st["graph"] else max(min(iters, 10), iters // 4),
                                  dev)
            r["ms_per_token"] = ms
            r["x_floor"] = ms / floor if floor else None
            if spec.is_moe:      # the timed steps read many experts, not one set from L2
                r["distinct_experts"] = e.distinct_experts(p0, int(e.pos))
                r["timed_steps"] = int(e.pos) - p0
        else:
            r["ms_per_token"] = None
            r["refused"] = refusal(j["flips"])
        rows.append(r)
        del e
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------------------
# the context sweep and the long-context check: the engine against the oracle from one cache
# --------------------------------------------------------------------------------------
@torch.no_grad()
def forced_from_cache(e: Engine, o: Oracle, start: int, tokens: torch.Tensor, graph: bool) -> dict:
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


def timed_if_agreed(e: Engine, r: dict, j: dict, ctx: int, floor, iters: int, dev) -> dict:
    """Fill row ``r`` for engine ``e`` at context ``ctx``: its time (graph replay, the
    cache as it is) if the check ``j`` passed, else the refusal and no time."""
    if j["ok"]:
        e.pos.fill_(ctx)
        e.prompt_len.fill_(0)
        ms = time_engine_step(e, True, iters, dev)
        r.update(ms_per_token=ms, x_floor=ms / floor if floor else None)
    else:
        r.update(ms_per_token=None, x_floor=None, refused=refusal(r["flips"]))
    return r


def sweep_rows(spec, w, device="cuda", ctxs=(128, 512, 2048, 8192, 16384, 32768), iters=50,
               read_tbps=None, pdl=True, attention="splitk", check_tokens: int = 2,
               live_caps=(0,)) -> list[dict]:
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
    None none), one pass over ``ctxs`` each, the same engine and cache recaptured."""
    from .prefill import prefill
    spec = get_spec(spec)
    dev = torch.device(device)
    max_ctx = max(ctxs) + iters + check_tokens + 16
    e = Engine(spec, w, max_ctx=max_ctx, attention=attention, pdl=pdl)
    g = torch.Generator(device="cpu").manual_seed(2)
    prefill(e, torch.randint(0, spec.vocab, (max(ctxs) + 1,), generator=g), progress=False)
    o = Oracle(spec, w, max_ctx=max_ctx)
    rows = []
    for cap in live_caps:
        e.live_cap = K.default_live_cap(spec.kv_heads) if cap == 0 else cap
        e.capture()
        for c in ctxs:
            forced = torch.randint(0, spec.vocab, (check_tokens,), generator=g)
            j = forced_from_cache(e, o, c, forced, graph=True)
            floor = spec.bytes_per_token(c) / (read_tbps * 1e12) * 1e3 if read_tbps else None
            r = {"model": spec.name, "rung": f"{attention}{' + PDL' if e.pdl else ''}", "ctx": c,
                 "agree": j["agree"], "flips": agree.disagreements(j), "floor_ms": floor,
                 "kv_bytes": c * spec.kv_bytes_per_token_of_context(), "live_cap": e.live_cap}
            rows.append(timed_if_agreed(e, r, j, c, floor, iters, dev))
    del o
    return rows


def maxctx_rows(spec, w, device="cuda", ctx=512, max_ctxs=(1024, None), iters=100,
                read_tbps=None, pdl=True, check_tokens=2) -> list[dict]:
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
    from .prefill import prefill
    spec = get_spec(spec)
    dev = torch.device(device)
    floor = spec.bytes_per_token(ctx) / (read_tbps * 1e12) * 1e3 if read_tbps else None
    g = torch.Generator(device="cpu").manual_seed(2)
    prompt = torch.randint(0, spec.vocab, (ctx + 1,), generator=g)
    forced = torch.randint(0, spec.vocab, (check_tokens,), generator=g)
    rows, first = [], None
    for mc in max_ctxs:
        mc = mc or spec.max_ctx
        if mc < ctx + iters + check_tokens + 16:
            raise ValueError(f"max_ctx {mc} cannot hold ctx {ctx} and {iters} timed steps")
        e = Engine(spec, w, max_ctx=mc, attention="splitk", pdl=pdl)
        prefill(e, prompt, progress=False)
        o = Oracle(spec, w, max_ctx=mc)
        e.capture()
        j = forced_from_cache(e, o, ctx, forced, graph=True)
        del o
        mine = (e.argmax[ctx + 1: ctx + check_tokens + 1].cpu(), e.buffers["logits"].cpu())
        n_splits = e.partials()[0].shape[1]
        r = {"model": spec.name, "rung": f"splitk{' + PDL' if e.pdl else ''}", "ctx": ctx,
             "max_ctx": mc, "chunk": e.chunk, "n_splits": n_splits,
             "live_splits": K.live_splits_host(ctx + 1, e.chunk, K.live_share(n_splits, e.live_cap)),
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


def long_context_agreement(spec, w, device="cuda", ctx=32768, tokens=12, pdl=True, chunk=1024):
    """Oracle prefill of ``ctx`` random tokens (batched, in chunks) and its greedy
    continuation; the graph engine adopts the prefilled cache and is teacher-forced along
    that continuation; its choices are judged by the agreement rule."""
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
    e = Engine(spec, w, max_ctx=max_ctx, attention="splitk", pdl=pdl)
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
    Returns one refusal row if the engine fails the oracle check."""
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
# launch configurations
# --------------------------------------------------------------------------------------
def config_sweep(spec, w, device="cuda", iters=30, read_tbps=None, pdl=None,
                 grid: dict | None = None, echo: bool = True) -> list[dict]:
    """Check, then time, launch configurations of each GEMV kernel; one row per config.

    Each config first runs once on layer 0 and is compared with its reference (``ref_*``,
    tolerance ``GEMV_TOL``; for the LM head also the token, by the agreement rule); only a
    config that passes is timed. A config that fails its check, or raises, is a row with
    ``check`` (or ``error``) saying why and no time: reported, never skipped.
    Timing: each config runs once per layer, back to back in one CUDA graph, with
    programmatic dependent launch where the GPU has it (as in the engine's fastest rung),
    so the numbers include what a kernel's boundary costs inside the step. PREFETCH is how
    many weight tiles a program keeps in flight (requested before its ``gdc_wait``, then
    one more per tile consumed); BLOCK_K 2048 covers all of K = 1536 in one (masked) tile.
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
    bad = gate_failures(out)
    if echo and bad:
        print(f"config sweep: {len(bad)} of {len(out)} configurations failed their check "
              "or raised (rows above); they were not timed", flush=True)
    return out


# the plan's ops whose launch configuration a step sweep tries, and the weight each reads
PLAN_SWEEP_WEIGHT = {"rms_qkv": "w_qkv", "o_proj": "w_o", "gate_up": "w_gate_up", "down": "w_down",
                     "router": "w_router", "moe_gate_up": "w_experts_gate_up",
                     "moe_down": "w_experts_down"}


def plan_config_sweep(spec, w, device="cuda", grid: dict | None = None, ctx: int = 512,
                      iters: int = 100, tokens: int = 4, read_tbps=None, echo: bool = True) -> list[dict]:
    """Launch configurations tried in the whole step, one op at a time (greedy: each op
    keeps the best found so far for the ops before it). Every trial engine is checked
    against the oracle (teacher-forced, the agreement rule) before its graph step is timed
    at context ``ctx`` with PDL; a trial that fails is reported, never timed. Rows carry the
    op, the weight shape the entry is keyed by, the config, and ms per token."""
    spec = get_spec(spec)
    dev = torch.device(device)
    pdl = config.pdl_supported(dev)
    c = lambda *r, keys=("BLOCK_N", "BLOCK_K", "PREFETCH", "num_warps"): dict(zip(keys, r))
    grid = grid or ({
        "router": [c(4, 512, 1, 4), c(1, 2048, 1, 4), c(2, 2048, 1, 4), c(2, 512, 4, 4), c(8, 512, 2, 4)],
        "moe_gate_up": [c(8, 512, 1, 4), c(8, 512, 2, 4), c(4, 512, 2, 4), c(16, 512, 2, 4),
                        c(4, 1024, 2, 4), c(8, 256, 4, 4)],
        "moe_down": [c(8, 512, 1, 4), c(8, 512, 2, 4), c(4, 512, 2, 4), c(16, 512, 2, 4),
                     c(4, 1024, 1, 4), c(2, 1024, 1, 4), c(16, 1024, 1, 8)],
        "rms_qkv": [c(8, 2048, 1, 4), c(8, 512, 2, 4), c(16, 512, 2, 4), c(4, 512, 3, 4)],
        "o_proj": [c(8, 2048, 1, 8), c(4, 512, 2, 4), c(8, 512, 2, 4), c(16, 512, 2, 8)],
    } if spec.is_moe else {})
    g = torch.Generator().manual_seed(9)
    prompt = torch.randint(0, spec.vocab, (ctx,), generator=g)
    max_ctx = ctx + tokens + iters + 64
    ref = oracle_tokens(spec, w, prompt, tokens, max_ctx)
    best: dict[str, dict] = {}
    rows = []
    for op, cands in grid.items():
        timed = []
        for cfg in cands:
            e = Engine(spec, w, max_ctx=max_ctx, pdl=pdl, cfgs={**best, op: cfg})
            weight = e.W["layers"][0][PLAN_SWEEP_WEIGHT[op]]
            r = {"op": op, "shape": list(weight.shape[-2:]), "cfg": cfg, "pdl": e.pdl}
            try:
                j = judge(e, prompt, ref, graph=True)
                r["agree"] = j["agree"]
                if j["ok"]:
                    r["ms_per_token"] = time_engine_step(e, True, iters, dev)
                    r["x_floor"] = (r["ms_per_token"] / spec.floor_ms(read_tbps, ctx)
                                    if read_tbps else None)
                    timed.append(r)
                else:
                    r["refused"] = refusal(agree.disagreements(j))
            except Exception as ex:                      # reported, never skipped silently
                r["error"] = f"{type(ex).__name__}: {str(ex)[:200]}"
            if echo:
                print(json.dumps(r), flush=True)
            rows.append(r)
            del e
        if timed:
            best[op] = min(timed, key=lambda r: r["ms_per_token"])["cfg"]
    return rows


def write_plan_table(rows: list[dict], model: str) -> str:
    """Merge the fastest config of each (op, shape) of a step sweep into
    ``kernels/tuned/<arch>.json`` (``tuned.write_table``), keyed by the weight shape."""
    import datetime
    best = {}
    for r in rows:
        if r.get("ms_per_token") is None:
            continue
        k = (r["op"], tuned.shape_key(r["shape"]))
        if k not in best or r["ms_per_token"] < best[k]["ms_per_token"]:
            best[k] = r
    entries, notes = {}, {}
    for (op, key), r in best.items():
        entries.setdefault(op, {})[key] = r["cfg"]
        notes[f"{op} {key}"] = {"model": model, "ms_per_token": r["ms_per_token"],
                                "date": datetime.date.today().isoformat()}
    return tuned.write_table(config.arch(0), entries, notes={"step_sweeps": notes})


def write_table(sweep: list[dict], read_tbps: float, model: str) -> str:
    """Merge the fastest configuration of each op (ties: the first in grid order), among
    the configurations that passed their check, into ``kernels/tuned/<arch>.json``
    (``tuned.write_table``: keyed by ``model``'s weight shape; other entries stay)."""
    import datetime
    best = {}
    for r in sweep:
        if r.get("check") == "pass" and r.get("us") is not None and \
                (r["op"] not in best or r["us"] < best[r["op"]]["us"]):
            best[r["op"]] = r
    spec = get_spec(model)
    key = {op: tuned.shape_key(plan.weight_shape(spec, op)) for op in best}
    meta = {"gpu": torch.cuda.get_device_name(), "model": model, "read_tbps": read_tbps,
            "date": datetime.date.today().isoformat()}
    measured = {f"{op} {key[op]}": {"us": r["us"], "pct_of_read": r["pct_of_read"]}
                for op, r in best.items()}
    return tuned.write_table(config.arch(0), {op: {key[op]: r["cfg"]} for op, r in best.items()},
                             meta=meta, notes={"measured": measured})


def _check_one(op, c, x, L0, P, s, eps, pdl, dev):
    """Run ``op`` with config ``c`` once on layer 0 and compare it with its reference.
    Returns ``(rel_err, failure or None)``."""
    bf = torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(3)
    if op == "rms_qkv":
        out = torch.full((s.qkv_size,), float("nan"), dtype=bf, device=dev)
        K.rms_qkv(x, L0["input_norm"], L0["w_qkv"], L0["b_qkv"], out, eps, use_pdl=pdl, cfg=c)
        return rel_err(out, ref_rms_qkv(x, L0["input_norm"], L0["w_qkv"], L0["b_qkv"], eps)), None
    if op == "o_proj":
        a = torch.randn(s.q_size, generator=g).to(dev, bf)
        xo = x.clone()
        K.o_proj_residual(a, L0["w_o"], xo, use_pdl=pdl, cfg=c)
        return rel_err(xo, ref_matvec_residual(a, L0["w_o"], x)), None
    if op == "gate_up":
        h = torch.full((s.intermediate,), float("nan"), dtype=bf, device=dev)
        K.rms_gate_up_swiglu(x, L0["post_norm"], L0["w_gate_up"], h, eps, use_pdl=pdl, cfg=c)
        return rel_err(h, ref_rms_gate_up_swiglu(x, L0["post_norm"], L0["w_gate_up"], eps)), None
    if op == "down":
        hh = torch.randn(s.intermediate, generator=g).to(dev, bf)
        sc = torch.zeros(16 * s.hidden, dtype=torch.float32, device=dev)
        cnt = torch.zeros(s.hidden, dtype=torch.int32, device=dev)
        xd = x.clone()
        K.down_residual(hh, L0["w_down"], xd, sc, cnt, use_pdl=pdl, cfg=c)
        left = int(cnt.abs().max())
        return (rel_err(xd, ref_matvec_residual(hh, L0["w_down"], x)),
                f"counters left at {left}, not 0" if left else None)
    n_prog = -(-s.vocab // c["BLOCK_N"])
    lg = torch.full((s.vocab,), float("nan"), dtype=torch.float32, device=dev)
    seq = torch.zeros(8, dtype=torch.int32, device=dev)
    p0 = torch.zeros(1, dtype=torch.int32, device=dev)
    K.lm_head_argmax(x, P["norm"], P["lm_head"], lg, torch.empty(n_prog, device=dev),
                     torch.empty(n_prog, dtype=torch.int32, device=dev),
                     torch.zeros(1, dtype=torch.int32, device=dev), seq, p0,
                     torch.zeros(1, dtype=torch.int32, device=dev), eps, use_pdl=pdl, cfg=c)
    ref, _ = ref_lm_head(x, P["norm"], P["lm_head"], eps)
    t = agree.judge_step(0, ref, int(seq[1]))
    return rel_err(lg, ref), (f"token {t['got_token']} is a flip against {t['ref_token']}"
                              if t["verdict"] == "flip" else None)


def _time_one(spec, w, device, op, c, iters, read_tbps, packed=None, pdl=False):
    """Check one launch configuration, then time it if it passed. An exception is
    recorded in the row (``error``, with the last lines of its traceback), not hidden."""
    spec = get_spec(spec)
    s, dev, bf = spec, torch.device(device), torch.bfloat16
    P = packed or pack_weights(spec, w)
    Ls, eps = P["layers"], s.rms_eps
    x = torch.randn(s.hidden, generator=torch.Generator().manual_seed(4)).to(dev, bf)
    row = {"op": op, "cfg": c, "pdl": bool(pdl)}
    try:
        err, fail = _check_one(op, c, x, Ls[0], P, s, eps, pdl, dev)
    except Exception as ex:
        row["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
        row["traceback"] = traceback.format_exc(limit=-3)
        return row
    row["rel_err"] = err
    if err > GEMV_TOL or fail:
        row["check"] = f"FAIL ({fail})" if fail else f"FAIL (rel err {err:.2e} > {GEMV_TOL:.0e})"
        return row
    row["check"] = "pass"
    if op == "rms_qkv":
        out = torch.empty(s.qkv_size, dtype=bf, device=dev)
        fn = lambda: [K.rms_qkv(x, L["input_norm"], L["w_qkv"], L["b_qkv"], out, eps, use_pdl=pdl, cfg=c) for L in Ls]
        nbytes, n = Ls[0]["w_qkv"].numel() * 2, len(Ls)
    elif op == "o_proj":
        a = torch.randn(s.q_size, device=dev).to(bf)
        xo = x.clone()
        fn = lambda: [K.o_proj_residual(a, L["w_o"], xo, use_pdl=pdl, cfg=c) for L in Ls]
        nbytes, n = Ls[0]["w_o"].numel() * 2, len(Ls)
    elif op == "gate_up":
        h = torch.empty(s.intermediate, dtype=bf, device=dev)
        fn = lambda: [K.rms_gate_up_swiglu(x, L["post_norm"], L["w_gate_up"], h, eps, use_pdl=pdl, cfg=c) for L in Ls]
        nbytes, n = Ls[0]["w_gate_up"].numel() * 2, len(Ls)
    elif op == "down":
        hh = torch.randn(s.intermediate, device=dev).to(bf)
        sc = torch.zeros(16 * s.hidden, dtype=torch.float32, device=dev)
        cnt = torch.zeros(s.hidden, dtype=torch.int32, device=dev)
        xd = x.clone()
        fn = lambda: [K.down_residual(hh, L["w_down"], xd, sc, cnt, use_pdl=pdl, cfg=c) for L in Ls]
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
    try:
        us = _graph_time(fn, n, dev, iters)
    except Exception as ex:
        row["error"] = f"while timing: {type(ex).__name__}: {str(ex)[:300]}"
        row["traceback"] = traceback.format_exc(limit=-3)
        return row
    gbps = nbytes / (us * 1e-6) / 1e9
    row.update(us=us, gbps=gbps, pct_of_read=100 * gbps / (read_tbps * 1e3) if read_tbps else None)
    return row


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
    failed = []
    if "sweepplan" in what:
        out["plan_sweep"] = plan_config_sweep(spec, w, dev, ctx=a.ctx, read_tbps=bw)
        if a.write_table:
            print("wrote", write_plan_table(out["plan_sweep"], spec.name))
    if "sweepcfg" in what:
        out["config_sweep"] = config_sweep(spec, w, dev, read_tbps=bw)
        failed += gate_failures(out["config_sweep"])
        if a.write_table:
            print("wrote", write_table(out["config_sweep"], bw, spec.name))
    longest = spec.max_ctx - 96                      # room for the timed steps
    ctxs = tuple(c for c in (128, 512, 1024, 2048, 4000, 8192, 16384, 32768) if c <= longest)
    if "peers" in what:      # the peers in this process: every ratio from one run
        from .peers import peer_rungs
        out["peers"] = peer_rungs(spec.name, ctx=a.ctx, device=dev, iters=50, new_tokens=32,
                                  weights=w)
        for r in out["peers"]:
            r["floor_ms"] = spec.floor_ms(bw, a.ctx)
            print(json.dumps(r))
        failed += gate_failures(out["peers"])
    for key, fn in (("kernels", lambda: [] if spec.is_moe else kernel_rows(spec, w, dev, ctx=a.ctx, read_tbps=bw)),
                    ("ops", lambda: plan_op_rows(spec, w, dev, ctx=a.ctx, read_tbps=bw)),
                    ("ladder", lambda: ladder_rows(spec, w, dev, ctx=a.ctx, iters=a.iters, read_tbps=bw)),
                    ("sweep", lambda: sweep_rows(spec, w, dev, ctxs=ctxs, read_tbps=bw)),
                    # the same step in an engine for 1024 positions and the default
                    ("maxctx", lambda: maxctx_rows(spec, w, dev, ctx=a.ctx, max_ctxs=(1024, None),
                                                   iters=a.iters, read_tbps=bw)),
                    # the long contexts with the live splits capped at 256..32 programs, or not
                    ("splitcap", lambda: sweep_rows(
                        spec, w, dev, ctxs=tuple(c for c in ctxs if c >= 2048), read_tbps=bw,
                        live_caps=(None,) + tuple(-(-p // spec.kv_heads) for p in (256, 128, 64, 32))))):
        if key in what:
            out[key] = fn()
            for r in out[key]:
                print(json.dumps(r))
            failed += gate_failures(out[key])
    if "long" in what:
        out["long"] = long_context_agreement(spec, w, dev, ctx=min(32768, 4000 if spec.is_moe else longest))
        print(json.dumps(out["long"]))
        if not out["long"]["ok"]:
            failed.append(out["long"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if failed:
        print(f"FAILED: {len(failed)} row(s) failed their check (printed above, never timed)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
