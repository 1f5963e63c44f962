"""The MoE step's own compute pieces (``moe.py``): ROPE_KV with OLMoE's q/k norm over the
whole projection, and the router's top-k.

OLMoE normalises q and k over all heads (``q_norm``, ``k_norm`` of [heads x head_dim]):
each QKV instruction stores its rows' sums of squares of q and of k (row IDX of
``qk_ss``), and each RoPE sums those SPLITS partials in block order (chunks of QSB), so
every kv head computes the same statistic whatever the interleaving.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .sync import wait_counter


@gluon.jit
def _rope_normed(ptr, gptr, d, D: gl.constexpr, c, s, mask, rstd):
    """``gluon.attention._rope`` of the head rows at ``ptr`` RMS-normalised first (OLMoE's q/k
    norm as HF rounds it: bf16(g * bf16(x * rstd)), ``gptr`` the gains)."""
    half: gl.constexpr = D // 2
    x = gl.load(ptr + d, mask=mask, other=0.0, cache_modifier=".cg").to(gl.float32)
    gx = gl.load(gptr + d, mask=mask, other=0.0).to(gl.float32)
    o = gl.load(ptr + (d + half) % D, mask=mask, other=0.0, cache_modifier=".cg").to(gl.float32)
    go = gl.load(gptr + (d + half) % D, mask=mask, other=0.0).to(gl.float32)
    xn = (gx * (x * rstd).to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16).to(gl.float32)
    on = (go * (o * rstd).to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16).to(gl.float32)
    rot = gl.where(d % D < half, -on, on)
    a = (xn * c).to(gl.bfloat16).to(gl.float32)
    b = (rot * s).to(gl.bfloat16).to(gl.float32)
    return (a + b).to(gl.bfloat16)


@gluon.jit
def op_rope_kv_qkn(layer, kh, n_blocks, pos_ptr, qkv_ptr, q_ptr, kc_ptr, vc_ptr, cos_ptr,
                   sin_ptr, qn_ptr, kn_ptr, ss_ptr, HQ, KVS, MAXCTX, eps, ctr_ptr, w0,
                   target, timeout_ns, failed, err, instr, C: gl.constexpr,
                   num_warps: gl.constexpr):
    """ROPE_KV with OLMoE's q/k norm: the statistic of the whole q (k) from the
    ``n_blocks`` QKV blocks' partial squares (chunks of QSB, each summed in a fixed
    order), kv head kh's G query heads and its key normalised (their gains), RoPE'd
    (into q; the key into the cache at slot pos), its value into the cache. cos/sin
    and the gains are asked for before the counter wait. Returns the wait's ``failed``."""
    G: gl.constexpr = C.G
    GP: gl.constexpr = C.GP
    D: gl.constexpr = C.D
    HKV: gl.constexpr = C.HKV
    QSB: gl.constexpr = C.QSB
    POLL: gl.constexpr = C.POLL
    l2: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [num_warps, 1], [1, 0])
    pos = gl.load(pos_ptr, cache_modifier=".cg")
    hh = gl.arange(0, GP, gl.SliceLayout(1, l2))
    dd = gl.arange(0, D, gl.SliceLayout(0, l2))
    d2 = hh[:, None] * 0 + dd[None, :]
    c = gl.load(cos_ptr + pos * D + d2).to(gl.float32)
    s = gl.load(sin_ptr + pos * D + d2).to(gl.float32)
    if w0 >= 0:
        if failed == 0:
            gl.store(err + 1, w0)
        failed = wait_counter(ctr_ptr + w0, target, timeout_ns, failed, err, instr, POLL)
    # the statistic: [QSB, 2] chunks of the blocks' (q, k) squares
    jb = gl.arange(0, QSB, gl.SliceLayout(1, l2))
    cb = gl.arange(0, 2, gl.SliceLayout(0, l2))
    tot = gl.zeros([2], gl.float32, gl.SliceLayout(0, l2))
    for c0 in range(0, n_blocks, QSB):
        m = ((c0 + jb) < n_blocks)[:, None] & (cb[None, :] < 2)
        part = gl.load(ss_ptr + (c0 + jb)[:, None] * 2 + cb[None, :], mask=m, other=0.0,
                       cache_modifier=".cg")
        tot += gl.sum(part, axis=0)
    ssq = gl.sum(gl.where(cb == 0, tot, 0.0), axis=0)
    ssk = gl.sum(gl.where(cb == 1, tot, 0.0), axis=0)
    rq = 1.0 / gl.sqrt(ssq / HQ + eps)
    rk = 1.0 / gl.sqrt(ssk / KVS + eps)
    qm = (hh[:, None] < G) & (dd[None, :] < D)
    qoff = (kh * G + hh[:, None]) * D
    q = _rope_normed(qkv_ptr + qoff, qn_ptr + layer * HQ + qoff, dd[None, :], D, c, s, qm, rq)
    gl.store(q_ptr + qoff + dd[None, :], q, mask=qm)
    km = (hh[:, None] == 0) & (dd[None, :] < D)
    koff = kh * D + hh[:, None] * 0
    k = _rope_normed(qkv_ptr + HQ + koff, kn_ptr + layer * KVS + koff, dd[None, :], D, c, s,
                     km, rk)
    slot = ((layer * HKV + kh) * MAXCTX + pos) * D
    gl.store(kc_ptr + slot + hh[:, None] * 0 + dd[None, :], k, mask=km)
    v = gl.load(qkv_ptr + HQ + KVS + koff + dd[None, :], mask=km, other=0.0,
                cache_modifier=".cg")
    gl.store(vc_ptr + slot + hh[:, None] * 0 + dd[None, :], v, mask=km)
    return failed


@gluon.jit
def op_topk(layer, pos, rl_ptr, ids_ptr, rw_ptr, log_ptr, L, E, EP: gl.constexpr,
            TOPK: gl.constexpr, num_warps: gl.constexpr):
    """Softmax over the E router logits (fp32), then TOPK rounds of "largest
    probability, lowest expert index among equals": slot j's id and its probability
    rounded to bf16 (not renormalised) into the layer's row (``moe_router.route``); the
    ids also into the engine's log, row pos (``Engine.distinct_experts``)."""
    l1: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    e = gl.arange(0, EP, l1)
    em = e < E
    lg = gl.load(rl_ptr + e, mask=em, other=float("-inf"), cache_modifier=".cg")
    p = gl.exp(lg - gl.max(lg, axis=0))
    p = p / gl.sum(p, axis=0)
    p = gl.where(em, p, -1.0)                         # padding is never chosen
    for j in gl.static_range(TOPK):
        best = gl.max(p, axis=0)
        i = gl.min(gl.where(p == best, e, EP), axis=0)
        gl.store(ids_ptr + layer * TOPK + j, i)
        gl.store(rw_ptr + layer * TOPK + j, best.to(gl.bfloat16).to(gl.float32))
        gl.store(log_ptr + (pos * L + layer) * TOPK + j, i)
        p = gl.where(e == i, -1.0, p)
