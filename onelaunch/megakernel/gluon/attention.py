"""The megakernels' attention on the GPU, one (kv head, split) of the keys an
instruction: the split's share of the live length, RoPE, the cache write of the new key
and value, the partial softmax state of the G query heads of a kv head (running max, sum
of exp, unnormalised output: fp32, bf16 probabilities into P @ V as the split-K kernel),
and the merges of the partials (``isa``: ROPE_KV, ATTN_PARTIAL, ATTN_MERGE, ATTN_FUSED).

Keys a split reads that earlier steps wrote are asked for before its counter wait, so
their memory latency runs under it; the keys this step writes are read after it.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .sync import wait_counter


@gluon.jit
def _split_keys(length, sp, splits, unit):
    """[start, end) of split ``sp``'s share of keys [0, length) and the units a split
    takes (``lists.split_range``): ceil(units / splits) units a split, in order."""
    per = ((length + unit - 1) // unit + splits - 1) // splits
    start = sp * per * unit
    return start, gl.maximum(start, gl.minimum(start + per * unit, length)), per


@gluon.jit
def _split_at(pos_ptr, layer, kh, sp, splits, unit, MAXCTX, HKV: gl.constexpr,
              D: gl.constexpr, BT: gl.constexpr, kl: gl.constexpr, sl: gl.constexpr):
    """A split's place in this step: pos, its keys [start, end), the units a split
    takes, a block's key and column indices (for the [BT, D] keys, the [GP, BT]
    scores) and where (layer, kv head) starts in the cache."""
    pos = gl.load(pos_ptr, cache_modifier=".cg")
    start, end, per = _split_keys(pos + 1, sp, splits, unit)
    tk = gl.arange(0, BT, gl.SliceLayout(1, kl))
    dk = gl.arange(0, D, gl.SliceLayout(0, kl))
    ts = gl.arange(0, BT, gl.SliceLayout(0, sl))
    return pos, start, end, per, tk, dk, ts, (layer * HKV + kh) * MAXCTX * D


@gluon.jit
def _rope(ptr, d, D: gl.constexpr, c, s, mask):
    """bf16 RoPE of the head rows at ``ptr`` (HF: bf16(bf16(x cos) + bf16(rot(x) sin)))."""
    x = gl.load(ptr + d, mask=mask, other=0.0, cache_modifier=".cg").to(gl.float32)
    half: gl.constexpr = D // 2
    o = gl.load(ptr + (d + half) % D, mask=mask, other=0.0, cache_modifier=".cg").to(gl.float32)
    rot = gl.where(d % D < half, -o, o)
    a = (x * c).to(gl.bfloat16).to(gl.float32)
    b = (rot * s).to(gl.bfloat16).to(gl.float32)
    return (a + b).to(gl.bfloat16)


@gluon.jit
def op_rope_kv(layer, kh, pos_ptr, qkv_ptr, q_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, HQ,
               KVS, MAXCTX, ctr_ptr, w0, target, timeout_ns, failed, err, instr,
               C: gl.constexpr, num_warps: gl.constexpr):
    """RoPE on kv head kh's G query heads (into q) and its key; the key and value into the
    cache at slot pos. The position's cos/sin are asked for before the counter wait.
    Returns the wait's ``failed``."""
    G: gl.constexpr = C.G
    GP: gl.constexpr = C.GP
    D: gl.constexpr = C.D
    HKV: gl.constexpr = C.HKV
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
    qm = (hh[:, None] < G) & (dd[None, :] < D)
    qoff = (kh * G + hh[:, None]) * D
    q = _rope(qkv_ptr + qoff, dd[None, :], D, c, s, qm)
    gl.store(q_ptr + qoff + dd[None, :], q, mask=qm)
    # the key (row 0 of the tile) and the value
    km = (hh[:, None] == 0) & (dd[None, :] < D)
    k = _rope(qkv_ptr + HQ + kh * D + hh[:, None] * 0, dd[None, :], D, c, s, km)
    slot = ((layer * HKV + kh) * MAXCTX + pos) * D
    gl.store(kc_ptr + slot + hh[:, None] * 0 + dd[None, :], k, mask=km)
    v = gl.load(qkv_ptr + HQ + KVS + kh * D + hh[:, None] * 0 + dd[None, :], mask=km,
                other=0.0, cache_modifier=".cg")
    gl.store(vc_ptr + slot + hh[:, None] * 0 + dd[None, :], v, mask=km)
    return failed


@gluon.jit
def _attn_block(q, k, v, valid, m_i, l_i, o, scale, ql: gl.constexpr):
    """One block of keys into the running (max, sum of exp, output) of G query heads."""
    sc = gl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale          # [GP, BT]
    sc = gl.where(valid[None, :], sc, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(sc, axis=1))
    alpha = gl.exp(m_i - m_new)
    p = gl.exp(sc - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, axis=1)
    pb = p.to(gl.bfloat16).to(gl.float32)
    pv = gl.sum(pb[:, :, None] * v[None, :, :], axis=1)                # [GP, D]
    o = o * gl.convert_layout(alpha, gl.SliceLayout(1, ql))[:, None] + pv
    return m_new, l_i, o


@gluon.jit
def _partial_blocks(q, k_old, v_old, k_pos, v_pos, pos, start, end, tk, dk, ts, base, kh,
                    sp, kc_ptr, vc_ptr, pm_ptr, pl_ptr, po_ptr, SPMAX, scale,
                    C: gl.constexpr, sl: gl.constexpr, ql: gl.constexpr):
    """A split's partial after its wait: the first block from the keys asked for before
    it (``k_old``, ``v_old``) with key pos (this step's, ``k_pos``, ``v_pos``: [D]) where
    the block holds it, the rest block by block from the cache; its G heads' running
    max, sum of exp and output into the partials."""
    G: gl.constexpr = C.G
    GP: gl.constexpr = C.GP
    D: gl.constexpr = C.D
    BT: gl.constexpr = C.BT
    m_i = gl.full([GP], float("-inf"), gl.float32, gl.SliceLayout(1, sl))
    l_i = gl.zeros([GP], gl.float32, gl.SliceLayout(1, sl))
    o = gl.zeros([GP, D], gl.float32, ql)
    if start < end:                                   # the first block: + key pos
        new = ((start + tk) == pos)[:, None] & (dk[None, :] < D)
        k = gl.where(new, k_pos[None, :], k_old).to(gl.float32)
        v = gl.where(new, v_pos[None, :], v_old).to(gl.float32)
        m_i, l_i, o = _attn_block(q, k, v, start + ts < end, m_i, l_i, o, scale, ql)
    for t0 in range(start + BT, end, BT):
        km = ((t0 + tk) < end)[:, None] & (dk[None, :] < D)
        off = base + (t0 + tk)[:, None] * D + dk[None, :]
        k = gl.load(kc_ptr + off, mask=km, other=0.0, cache_modifier=".cg").to(gl.float32)
        v = gl.load(vc_ptr + off, mask=km, other=0.0, cache_modifier=".cg").to(gl.float32)
        m_i, l_i, o = _attn_block(q, k, v, t0 + ts < end, m_i, l_i, o, scale, ql)
    hs = gl.arange(0, GP, gl.SliceLayout(1, sl))
    row = (kh * G + hs) * SPMAX + sp
    gl.store(pm_ptr + row, m_i, mask=hs < G)
    gl.store(pl_ptr + row, l_i, mask=hs < G)
    hq = gl.arange(0, GP, gl.SliceLayout(1, ql))
    dq = gl.arange(0, D, gl.SliceLayout(0, ql))
    gl.store(po_ptr + ((kh * G + hq[:, None]) * SPMAX + sp) * D + dq[None, :], o,
             mask=(hq[:, None] < G) & (dq[None, :] < D))


@gluon.jit
def _old_keys(kc_ptr, vc_ptr, pos, start, end, tk, dk, base, D: gl.constexpr):
    """The first block of a split's keys before pos (earlier steps wrote them): asked for
    before its counter wait, so their memory latency runs under it."""
    kv_off = base + (start + tk)[:, None] * D + dk[None, :]
    old = ((start + tk < end) & (start + tk < pos))[:, None] & (dk[None, :] < D)
    return (gl.load(kc_ptr + kv_off, mask=old, other=0.0),
            gl.load(vc_ptr + kv_off, mask=old, other=0.0))


@gluon.jit
def op_attn_partial(layer, kh, sp, splits, unit, pos_ptr, q_ptr, kc_ptr, vc_ptr, pm_ptr,
                    pl_ptr, po_ptr, SPMAX, MAXCTX, scale, ctr_ptr, w0, target, timeout_ns,
                    failed, err, instr, C: gl.constexpr, num_warps: gl.constexpr):
    """Split ``sp`` of ``splits`` of kv head kh's keys [0, pos]: its G query heads'
    running max, sum of exp and unnormalised output (fp32, online over blocks of BT
    keys; bf16 probabilities into P @ V, as the split-K kernel). The first block's keys
    before pos are asked for before the counter wait; key pos (this step's RoPE) and the
    queries after. Returns the wait's ``failed``."""
    G: gl.constexpr = C.G
    GP: gl.constexpr = C.GP
    D: gl.constexpr = C.D
    HKV: gl.constexpr = C.HKV
    BT: gl.constexpr = C.BT
    POLL: gl.constexpr = C.POLL
    l3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 1, 32], [num_warps, 1, 1], [2, 1, 0])
    sl: gl.constexpr = gl.SliceLayout(2, l3)              # [GP, BT] scores
    kl: gl.constexpr = gl.SliceLayout(0, l3)              # [BT, D] keys / values
    ql: gl.constexpr = gl.SliceLayout(1, l3)              # [GP, D] queries / output
    pos, start, end, per, tk, dk, ts, base = _split_at(pos_ptr, layer, kh, sp, splits,
                                                       unit, MAXCTX, HKV, D, BT, kl, sl)
    k_old, v_old = _old_keys(kc_ptr, vc_ptr, pos, start, end, tk, dk, base, D)
    if w0 >= 0:
        if failed == 0:
            gl.store(err + 1, w0)
        failed = wait_counter(ctr_ptr + w0, target, timeout_ns, failed, err, instr, POLL)
    hq = gl.arange(0, GP, gl.SliceLayout(1, ql))
    dq = gl.arange(0, D, gl.SliceLayout(0, ql))
    qmask = (hq[:, None] < G) & (dq[None, :] < D)
    q = gl.load(q_ptr + (kh * G + hq[:, None]) * D + dq[None, :], mask=qmask, other=0.0,
                cache_modifier=".cg").to(gl.float32)
    # key pos, where the first block holds it (a later block reads it with its keys):
    # the RoPE stage's, from L2
    at_pos = (dk < D) & (start <= pos) & (pos < end) & (pos < start + BT)
    k_pos = gl.load(kc_ptr + base + pos * D + dk, mask=at_pos, other=0.0,
                    cache_modifier=".cg")
    v_pos = gl.load(vc_ptr + base + pos * D + dk, mask=at_pos, other=0.0,
                    cache_modifier=".cg")
    _partial_blocks(q, k_old, v_old, k_pos, v_pos, pos, start, end, tk, dk, ts, base, kh, sp,
                    kc_ptr, vc_ptr, pm_ptr, pl_ptr, po_ptr, SPMAX, scale, C, sl, ql)
    return failed


@gluon.jit
def _merge_group(kh, live, pm_ptr, pl_ptr, po_ptr, attn_ptr, SPMAX, G: gl.constexpr,
                 GP: gl.constexpr, D: gl.constexpr, SBF: gl.constexpr,
                 num_warps: gl.constexpr):
    """kv head kh's G query heads' ``live`` partials merged into attn in one pass of
    chunks of SBF splits (a memory round trip a chunk), a running max a head."""
    l3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 1, 32], [num_warps, 1, 1], [2, 1, 0])
    sm: gl.constexpr = gl.SliceLayout(2, l3)              # [GP, SBF]
    ol: gl.constexpr = gl.SliceLayout(1, l3)              # [GP, D]
    hs = gl.arange(0, GP, gl.SliceLayout(1, sm))
    ss = gl.arange(0, SBF, gl.SliceLayout(0, sm))
    d3 = gl.arange(0, D, gl.SliceLayout(0, ol))
    ho = gl.arange(0, GP, gl.SliceLayout(1, ol))
    m_run = gl.full([GP], float("-inf"), gl.float32, gl.SliceLayout(1, sm))
    den = gl.zeros([GP], gl.float32, gl.SliceLayout(1, sm))
    num = gl.zeros([GP, D], gl.float32, ol)
    for c0 in range(0, live, SBF):
        ok = (hs[:, None] < G) & ((c0 + ss)[None, :] < live)
        at = (kh * G + hs)[:, None] * SPMAX + c0 + ss[None, :]
        mm = gl.load(pm_ptr + at, mask=ok, other=float("-inf"), cache_modifier=".cg")
        ll = gl.load(pl_ptr + at, mask=ok, other=0.0, cache_modifier=".cg")
        oo = gl.load(po_ptr + at[:, :, None] * D + d3[None, None, :],
                     mask=ok[:, :, None] & (d3[None, None, :] < D), other=0.0,
                     cache_modifier=".cg")
        mm = gl.where(hs[:, None] < G, mm, 0.0)           # padding heads: no NaN
        m_new = gl.maximum(m_run, gl.max(mm, axis=1))
        a = gl.exp(m_run - m_new)
        w = gl.where(ok, gl.exp(mm - m_new[:, None]), 0.0)
        num = num * gl.convert_layout(a, gl.SliceLayout(1, ol))[:, None] + gl.sum(
            w[:, :, None] * oo, axis=1)
        den = den * a + gl.sum(w * ll, axis=1)
        m_run = m_new
    out = num / gl.convert_layout(den, gl.SliceLayout(1, ol))[:, None]
    gl.store(attn_ptr + (kh * G + ho)[:, None] * D + d3[None, :], out.to(gl.bfloat16),
             mask=(ho[:, None] < G) & (d3[None, :] < D))


@gluon.jit
def op_attn_fused(layer, kh, sp, splits, unit, bump, bump2, pos_ptr, qkv_ptr, cache, parts,
                  attn_ptr, SPMAX, MAXCTX, HQ, KVS, scale, ctr_ptr, w0, target, timeout_ns,
                  failed, err, instr, C: gl.constexpr, MERGE: gl.constexpr,
                  num_warps: gl.constexpr):
    """ATTN_FUSED (isa.py): before the counter wait, the first block of this split's
    earlier keys and pos's cos/sin are asked for; after it, RoPE on the G queries from
    qkv, the new key RoPEd (every split; zeros where it does not hold pos) and, by the
    split that holds pos, it and its value written into the cache (used from registers
    in the first block, read back from L2 where a later block holds pos), the partial.
    ``MERGE`` (the "two" form): its bump with acquire and release, and, by the split whose
    bump completes the kv head, the merge of its G heads and a bump of ``bump2``; else
    the caller bumps (release) and the merges merge.
    Returns the wait's ``failed``."""
    kc_ptr, vc_ptr, cos_ptr, sin_ptr = cache
    pm_ptr, pl_ptr, po_ptr = parts
    G: gl.constexpr = C.G
    GP: gl.constexpr = C.GP
    D: gl.constexpr = C.D
    HKV: gl.constexpr = C.HKV
    BT: gl.constexpr = C.BT
    SBF: gl.constexpr = C.SBF
    POLL: gl.constexpr = C.POLL
    l3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 1, 32], [num_warps, 1, 1], [2, 1, 0])
    sl: gl.constexpr = gl.SliceLayout(2, l3)              # [GP, BT] scores
    kl: gl.constexpr = gl.SliceLayout(0, l3)              # [BT, D] keys / values
    ql: gl.constexpr = gl.SliceLayout(1, l3)              # [GP, D] queries / output
    pos, start, end, per, tk, dk, ts, base = _split_at(pos_ptr, layer, kh, sp, splits,
                                                       unit, MAXCTX, HKV, D, BT, kl, sl)
    hq = gl.arange(0, GP, gl.SliceLayout(1, ql))
    dq = gl.arange(0, D, gl.SliceLayout(0, ql))
    k_old, v_old = _old_keys(kc_ptr, vc_ptr, pos, start, end, tk, dk, base, D)
    cq = gl.load(cos_ptr + pos * D + dq).to(gl.float32)[None, :]
    sq = gl.load(sin_ptr + pos * D + dq).to(gl.float32)[None, :]
    ck = gl.load(cos_ptr + pos * D + dk).to(gl.float32)
    sk = gl.load(sin_ptr + pos * D + dk).to(gl.float32)
    if w0 >= 0:
        if failed == 0:
            gl.store(err + 1, w0)
        failed = wait_counter(ctr_ptr + w0, target, timeout_ns, failed, err, instr, POLL)
    qmask = (hq[:, None] < G) & (dq[None, :] < D)
    q = _rope(qkv_ptr + (kh * G + hq[:, None]) * D, dq[None, :], D, cq, sq,
              qmask).to(gl.float32)
    holds = (start <= pos) & (pos < end)              # this split holds pos: the cache
    km = (dk < D) & holds
    k_new = _rope(qkv_ptr + HQ + kh * D, dk, D, ck, sk, km)
    v_new = gl.load(qkv_ptr + HQ + KVS + kh * D + dk, mask=km, other=0.0, cache_modifier=".cg")
    if holds:
        gl.store(kc_ptr + base + pos * D + dk, k_new)
        gl.store(vc_ptr + base + pos * D + dk, v_new)
        gl.thread_barrier()                           # a later block reads it back
    _partial_blocks(q, k_old, v_old, k_new, v_new, pos, start, end, tk, dk, ts, base, kh, sp,
                    kc_ptr, vc_ptr, pm_ptr, pl_ptr, po_ptr, SPMAX, scale, C, sl, ql)
    if MERGE:
        gl.thread_barrier()
        done = gl.atomic_add(ctr_ptr + bump, 1, sem="acq_rel", scope="gpu")
        if done == splits - 1:                        # the last of the kv head: merge
            live = gl.minimum(splits, (pos + per * unit) // (per * unit))
            _merge_group(kh, live, pm_ptr, pl_ptr, po_ptr, attn_ptr, SPMAX, G, GP, D, SBF,
                         num_warps)
            gl.thread_barrier()
            gl.atomic_add(ctr_ptr + bump2, 1, sem="release", scope="gpu")
    return failed


@gluon.jit
def op_attn_merge(h, splits, unit, pos, pm_ptr, pl_ptr, po_ptr, attn_ptr, SPMAX,
                  D: gl.constexpr, SB: gl.constexpr, num_warps: gl.constexpr):
    """Query head h's live partials merged in one pass of chunks of SB splits (one
    memory round trip a chunk): attn[h] = sum_s w_s o_s / sum_s w_s l_s, w_s = exp(m_s -
    max m), the running max rescaling the sums chunk to chunk. ``pos``: this step's,
    read once when the CTA starts (no round trip after the wait)."""
    l2: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [num_warps, 1], [1, 0])
    length = pos + 1
    _, _, per = _split_keys(length, 0, splits, unit)
    live = gl.minimum(splits, (length + per * unit - 1) // (per * unit))
    ss = gl.arange(0, SB, gl.SliceLayout(1, l2))
    dd = gl.arange(0, D, gl.SliceLayout(0, l2))
    m_run = float("-inf")
    num = gl.zeros([D], gl.float32, gl.SliceLayout(0, l2))
    den = 0.0
    for c0 in range(0, live, SB):
        ok = c0 + ss < live
        mm = gl.load(pm_ptr + h * SPMAX + c0 + ss, mask=ok, other=float("-inf"),
                     cache_modifier=".cg")
        ll = gl.load(pl_ptr + h * SPMAX + c0 + ss, mask=ok, other=0.0, cache_modifier=".cg")
        oo = gl.load(po_ptr + (h * SPMAX + c0 + ss)[:, None] * D + dd[None, :],
                     mask=ok[:, None] & (dd[None, :] < D), other=0.0, cache_modifier=".cg")
        m_new = gl.maximum(m_run, gl.max(mm, axis=0))
        a = gl.exp(m_run - m_new)
        w = gl.where(ok, gl.exp(mm - m_new), 0.0)
        num = num * a + gl.sum(w[:, None] * oo, axis=0)
        den = den * a + gl.sum(w * ll, axis=0)
        m_run = m_new
    gl.store(attn_ptr + h * D + dd, (num / den).to(gl.bfloat16))
