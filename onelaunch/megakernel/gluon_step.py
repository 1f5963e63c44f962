"""Step (d) of the megakernel (issue 25): a dense model's whole decode step, embedding to
argmax, in one persistent Gluon launch that runs ``schedule.build``'s instruction lists
(the lists the CPU VM checks, ``vm.py``).

One CTA an SM walks its own list (``isa`` format). Two partitions share a ring of
``STAGES`` shared-memory stages, each two slots of [TN, KB, TK] weights:

- the **loader** (one warp) walks the same list and asks the TMA engine for every weight
  row block in order (QKV, O, gate/up, down, LM head), waiting only for a free stage,
  never for data: while the compute partition waits on the rest of the grid, the ring
  fills with what comes next;
- the **compute** partition (``num_warps`` warps) waits on each instruction's counters
  (acquire), computes (RMS + GEMV from the ring; RoPE, attention partials and merges from
  the activations and the KV cache), stores, and bumps its counter (release).

A GEMV over all of K (QKV, O, gate/up, the LM head) takes one stage a pair of row blocks
(gate/up: a row block's gate rows and up rows), each row whole in one TMA copy; the
down projection one box of KD K tiles a stage. A pair whose second block is past the
instruction's rows asks for rows past the tensor, which the TMA fills with zeros (its
bytes still count on the stage's barrier, no memory is read).

Activations other SMs write in this launch are read with ``.cg`` (from L2, never a stale
L1 line). No wait is unbounded: a counter wait that outlasts ``timeout_ns`` records
(instruction, counter, value seen, target) in ``err[pid]`` and the CTA runs on without
waiting, still consuming every tile so its loader finishes; the host raises with the
stalled SM named. The last CTA out sets every counter back to zero, so CUDA-graph
replays need no host work.

The host side (weights stacked per kind, the TMA descriptors, buffers, the compile for
sm_90 without a GPU) is ``step.py``.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .gluon_mlp import (_dot_box_k, _dot_slice, _down_views, _fill, _fill_one,
                        _h_and_barriers, _now, _reset_on_exit, _stage_free, _stage_ready,
                        _wait_counter)

# the kernel's branches name opcodes and header fields by value (isa.py: OP_RMS_QKV 1,
# OP_ROPE_KV 2, OP_ATTN_PARTIAL 3, OP_ATTN_MERGE 4, OP_O_PROJ 5, OP_GATE_UP 6, OP_DOWN 7,
# OP_LM_HEAD 8, OP_ARGMAX 9, OP_EMBED 10, OP_ATTN_FUSED 15; fields OP 0 .. UNIT 14,
# BUMP2 18); tests/test_gluon_step.py holds them to isa's


@gluon.jit
def _field(hdr, f16, f: gl.constexpr):
    """Field f of an instruction header held whole in each thread (no shuffles)."""
    return gl.sum(gl.where(f16 == f, hdr, 0), axis=0)


# ---- the loader -------------------------------------------------------------------------
@gluon.jit
def _fill_pair(desc, ring, ready, empty, t, r, n_rows, r_end, STAGES: gl.constexpr):
    """Stage t % STAGES <- row blocks r and r + TN of ``desc`` (whole rows); a second block
    at or past ``r_end`` (the instruction's last row) is asked for past the tensor's
    ``n_rows``: zeros, no memory read, the same bytes on the barrier."""
    TN_: gl.constexpr = desc.block_type.shape[0]
    s = t % STAGES
    mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(s), 2 * desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [r, 0, 0], ready.index(s), ring.index(2 * s))
    r2 = gl.where(r + TN_ < r_end, r + TN_, n_rows)
    tma.async_copy_global_to_shared(desc, [r2, 0, 0], ready.index(s), ring.index(2 * s + 1))
    return t + 1


@gluon.jit
def _loader(prog_ptr, n_instr, d_qkv, d_o, d_gu, d_dn, d_dt, d_lm, ring, ring_dn,
            ring_dt, ready, empty, clk_ptr, L, H, I, QKV, V, NF: gl.constexpr,
            TAIL: gl.constexpr, STAGES: gl.constexpr, WIDTH: gl.constexpr,
            CLOCK: gl.constexpr):
    """Every weight row block of this SM's list, in the order the compute eats them;
    the only wait is for a free stage. CLOCK: when it asked for an instruction's last
    tile."""
    TN_: gl.constexpr = d_gu.block_type.shape[0]
    KD: gl.constexpr = d_dn.block_type.shape[1]
    base = prog_ptr + gl.program_id(0) * n_instr * WIDTH
    hl: gl.constexpr = gl.BlockedLayout([16], [32], [1], [0])
    f16 = gl.arange(0, 16, hl)
    nxt = gl.load(base + f16)
    t = 0
    for i in range(n_instr):
        hdr = nxt
        nxt = gl.load(base + (i + 1) * WIDTH + f16, mask=(i + 1 < n_instr) & (f16 < 16),
                      other=0)
        op = _field(hdr, f16, 0)
        layer = _field(hdr, f16, 1)
        row0 = _field(hdr, f16, 2)
        rows = _field(hdr, f16, 3)
        if op == 1:                                   # RMS_QKV
            r = layer * QKV + row0
            for rb in range(0, rows, 2 * TN_):
                t = _fill_pair(d_qkv, ring, ready, empty, t, r + rb, L * QKV, r + rows,
                               STAGES)
        elif op == 5:                                 # O_PROJ
            r = layer * H + row0
            for rb in range(0, rows, 2 * TN_):
                t = _fill_pair(d_o, ring, ready, empty, t, r + rb, L * H, r + rows,
                               STAGES)
        elif op == 6:                                 # GATE_UP: gate rows, up rows
            for rb in range(0, rows, TN_):
                t = _fill(d_gu, ring, ready, empty, t, layer * 2 * I + row0 + rb, 0, 2,
                          I, STAGES)
        elif op == 7:                                 # DOWN: all of K a row block
            for rb in range(0, rows, TN_):
                r = layer * H + row0 + rb
                for j in range(NF):
                    t = _fill_one(d_dn, ring_dn, ready, empty, t, r, j * KD, STAGES, 1)
                if TAIL > 0:
                    t = _fill_one(d_dt, ring_dt, ready, empty, t, r, NF * KD, STAGES,
                                  KD // TAIL)
        elif op == 8:                                 # LM_HEAD
            for rb in range(0, rows, 2 * TN_):
                t = _fill_pair(d_lm, ring, ready, empty, t, row0 + rb, V, row0 + rows,
                               STAGES)
        if CLOCK & ((op == 1) | (op == 5) | (op == 6) | (op == 7) | (op == 8)):
            gl.store(clk_ptr + (gl.program_id(0) * n_instr + i) * 4 + 3, _now())


# ---- the compute partition's pieces --------------------------------------------------------
@gluon.jit
def _rms_vec(x_ptr, g_ptr, H, eps, offs, offs_t, GT: gl.constexpr):
    """rmsnorm(x) * g as HF rounds it (bf16(g * bf16(x * rstd))), fp32, as the [KG, TK]
    and [GT, TK] pieces a GEMV's row boxes multiply."""
    m = offs < H
    xv = gl.load(x_ptr + offs, mask=m, other=0.0, cache_modifier=".cg").to(gl.float32)
    ss = gl.sum(gl.sum(xv * xv, axis=1), axis=0)
    mt = offs_t < H
    xt = gl.load(x_ptr + offs_t, mask=mt, other=0.0, cache_modifier=".cg").to(gl.float32)
    if GT > 0:
        ss += gl.sum(gl.sum(xt * xt, axis=1), axis=0)
    rstd = 1.0 / gl.sqrt(ss / H + eps)
    gv = gl.load(g_ptr + offs, mask=m, other=0.0).to(gl.float32)
    gt = gl.load(g_ptr + offs_t, mask=mt, other=0.0).to(gl.float32)
    xn = (gv * (xv * rstd).to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16).to(gl.float32)
    xnt = (gt * (xt * rstd).to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16).to(gl.float32)
    return xn, xnt


@gluon.jit
def _row_dot(ring, slot, xn, xnt, KG: gl.constexpr, GT: gl.constexpr, TN_: gl.constexpr,
             TK_: gl.constexpr, l3: gl.constexpr, al: gl.constexpr):
    """fp32 [TN]: the rows of ring slot ``slot`` (whole rows of KG + GT K tiles) times the
    vector pieces xn, xnt."""
    acc = _dot_slice(ring, slot, 0, KG, xn, gl.zeros([TN_, TK_], gl.float32, al), True, l3)
    if GT > 0:
        acc = _dot_slice(ring, slot, KG, GT, xnt, acc, True, l3)
    return gl.sum(acc, axis=1)


@gluon.jit
def _split_keys(length, sp, splits, unit):
    """[start, end) of split ``sp``'s share of keys [0, length) and the units a split
    takes (``schedule.split_range``): ceil(units / splits) units a split, in order."""
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
def _op_rope_kv(layer, kh, pos_ptr, qkv_ptr, q_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, HQ, KVS,
                MAXCTX, ctr_ptr, w0, target, timeout_ns, failed, err, instr,
                G: gl.constexpr, GP: gl.constexpr, D: gl.constexpr, HKV: gl.constexpr,
                POLL: gl.constexpr, num_warps: gl.constexpr):
    """RoPE on kv head kh's G query heads (into q) and its key; the key and value into the
    cache at slot pos. The position's cos/sin are asked for before the counter wait.
    Returns the wait's ``failed``."""
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
        failed = _wait_counter(ctr_ptr + w0, target, timeout_ns, failed, err, instr, POLL)
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
def _partial_blocks(q, k_old, v_old, k_pos, v_pos, pos, start, end, tk, dk, ts, base, kh, sp,
                    kc_ptr, vc_ptr, pm_ptr, pl_ptr, po_ptr, SPMAX, scale, G: gl.constexpr,
                    GP: gl.constexpr, D: gl.constexpr, BT: gl.constexpr, sl: gl.constexpr,
                    ql: gl.constexpr):
    """A split's partial after its wait: the first block from the keys asked for before
    it (``k_old``, ``v_old``) with key pos (this step's, ``k_pos``, ``v_pos``: [D]) where
    the block holds it, the rest block by block from the cache; its G heads' running
    max, sum of exp and output into the partials."""
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
def _op_attn_partial(layer, kh, sp, splits, unit, pos_ptr, q_ptr, kc_ptr, vc_ptr, pm_ptr,
                     pl_ptr, po_ptr, SPMAX, MAXCTX, scale, ctr_ptr, w0, target, timeout_ns,
                     failed, err, instr, G: gl.constexpr, GP: gl.constexpr,
                     D: gl.constexpr, HKV: gl.constexpr, BT: gl.constexpr,
                     POLL: gl.constexpr, num_warps: gl.constexpr):
    """Split ``sp`` of ``splits`` of kv head kh's keys [0, pos]: its G query heads'
    running max, sum of exp and unnormalised output (fp32, online over blocks of BT
    keys; bf16 probabilities into P @ V, as the split-K kernel). The first block's keys
    before pos are asked for before the counter wait; key pos (this step's RoPE) and the
    queries after. Returns the wait's ``failed``."""
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
        failed = _wait_counter(ctr_ptr + w0, target, timeout_ns, failed, err, instr, POLL)
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
                    kc_ptr, vc_ptr, pm_ptr, pl_ptr, po_ptr, SPMAX, scale, G, GP, D, BT, sl,
                    ql)
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
def _op_attn_fused(layer, kh, sp, splits, unit, bump, bump2, pos_ptr, qkv_ptr, kc_ptr,
                   vc_ptr, cos_ptr, sin_ptr, pm_ptr, pl_ptr, po_ptr, attn_ptr, SPMAX, MAXCTX,
                   HQ, KVS, scale, ctr_ptr, w0, target, timeout_ns, failed, err, instr,
                   G: gl.constexpr, GP: gl.constexpr, D: gl.constexpr, HKV: gl.constexpr,
                   BT: gl.constexpr, SBF: gl.constexpr, MERGE: gl.constexpr,
                   POLL: gl.constexpr, num_warps: gl.constexpr):
    """ATTN_FUSED (isa.py): before the counter wait, the first block of this split's
    earlier keys and pos's cos/sin are asked for; after it, RoPE on the G queries from
    qkv, the new key RoPEd (every split; zeros where it does not hold pos) and, by the
    split that holds pos, it and its value written into the cache (used from registers
    in the first block, read back from L2 where a later block holds pos), the partial.
    ``MERGE`` (the "two" form): its bump with acquire and release, and, by the split whose
    bump completes the kv head, the merge of its G heads and a bump of ``bump2``; else
    the caller bumps (release) and the merges merge.
    Returns the wait's ``failed``."""
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
        failed = _wait_counter(ctr_ptr + w0, target, timeout_ns, failed, err, instr, POLL)
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
                    kc_ptr, vc_ptr, pm_ptr, pl_ptr, po_ptr, SPMAX, scale, G, GP, D, BT, sl,
                    ql)
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
def _op_attn_merge(h, splits, unit, pos, pm_ptr, pl_ptr, po_ptr, attn_ptr, SPMAX,
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


@gluon.jit
def _op_embed(row0, rows, pos_ptr, seq_ptr, emb_ptr, x_ptr, H, EB: gl.constexpr,
              num_warps: gl.constexpr):
    """x[row0:row0 + rows] = E[seq[pos], row0:row0 + rows]."""
    l1: gl.constexpr = gl.BlockedLayout([8], [32], [num_warps], [0])
    pos = gl.load(pos_ptr, cache_modifier=".cg")
    tok = gl.load(seq_ptr + pos, cache_modifier=".cg").to(gl.int64)
    for c0 in range(row0, row0 + rows, EB):
        cc = c0 + gl.arange(0, EB, l1)
        m = cc < row0 + rows
        gl.store(x_ptr + cc, gl.load(emb_ptr + tok * H + cc, mask=m, other=0.0), mask=m)


@gluon.jit
def _op_argmax(n, pos_ptr, plen_ptr, seq_ptr, amax_ptr, val_ptr, idx_ptr,
               NPB: gl.constexpr, num_warps: gl.constexpr):
    """The token: the largest of the LM-head instructions' bests, the lowest row among
    equals; into argmax[pos + 1] (and seq[pos + 1] past the prompt); pos + 1."""
    l1: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    j = gl.arange(0, NPB, l1)
    v = gl.load(val_ptr + j, mask=j < n, other=float("-inf"), cache_modifier=".cg")
    ix = gl.load(idx_ptr + j, mask=j < n, other=2147483647, cache_modifier=".cg")
    best = gl.max(v, axis=0)
    tok = gl.min(gl.where(v == best, ix, 2147483647), axis=0)
    pos = gl.load(pos_ptr, cache_modifier=".cg")
    gl.store(amax_ptr + pos + 1, tok)
    if pos + 1 >= gl.load(plen_ptr):
        gl.store(seq_ptr + pos + 1, tok)
    gl.store(pos_ptr, pos + 1)


# ---- the compute partition -------------------------------------------------------------------
@gluon.jit
def _compute(prog_ptr, n_instr, ring, ring_dk, ring_tk, ready, empty, vec, x_ptr, qkv_ptr,
             q_ptr, attn_ptr, h_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, pm_ptr, pl_ptr, po_ptr,
             val_ptr, idx_ptr, seq_ptr, amax_ptr, pos_ptr, plen_ptr, emb_ptr, gin_ptr, gpost_ptr,
             gfin_ptr, bqkv_ptr, ctr_ptr, err_ptr, clk_ptr, H, I, QKV, HQ, KVS, SPMAX, MAXCTX,
             eps, scale, timeout_ns, KG: gl.constexpr, GT: gl.constexpr, NF: gl.constexpr,
             KD: gl.constexpr, TAIL: gl.constexpr, STAGES: gl.constexpr,
             WIDTH: gl.constexpr, TN_: gl.constexpr, TK_: gl.constexpr, G: gl.constexpr,
             GP: gl.constexpr, D: gl.constexpr, HKV: gl.constexpr, BT: gl.constexpr,
             SB: gl.constexpr, SBF: gl.constexpr, NPB: gl.constexpr, EB: gl.constexpr,
             BIAS: gl.constexpr, ATT: gl.constexpr, CLOCK: gl.constexpr,
             POLL: gl.constexpr, num_warps: gl.constexpr):
    # a row box [TN, kb, TK]: rows over the warps, K tiles in each thread's registers,
    # columns over a warp's lanes, 8 a lane (16-byte shared loads)
    l3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 1, 32], [num_warps, 1, 1], [2, 1, 0])
    vl: gl.constexpr = gl.SliceLayout(0, l3)             # [kb, TK]: the vector's pieces
    al: gl.constexpr = gl.SliceLayout(1, l3)             # [TN, TK]: the accumulator
    rl: gl.constexpr = gl.SliceLayout(1, al)             # [TN]: a row block's results
    KTV: gl.constexpr = NF * KD + TAIL                   # K tiles of h in shared memory
    pid = gl.program_id(0)
    base = prog_ptr + pid * n_instr * WIDTH
    err = err_ptr + pid * 4
    clk = clk_ptr + pid * n_instr * 4                    # [P, N, 4] globaltimer stamps
    kk = gl.arange(0, KG, gl.SliceLayout(1, vl))
    cc = gl.arange(0, TK_, gl.SliceLayout(0, vl))
    offs = kk[:, None] * TK_ + cc[None, :]               # [KG, TK]
    offs_t = (KG + gl.arange(0, GT, gl.SliceLayout(1, vl)))[:, None] * TK_ + cc[None, :]
    k4 = gl.arange(0, 4, gl.SliceLayout(1, vl))
    offs4 = k4[:, None] * TK_ + cc[None, :]              # [4, TK]: h staged 4 tiles a time
    rows_ = gl.arange(0, TN_, rl)
    # the down projection: a box [TN, NW, KD / NW, TK], its K tiles over the warps
    NW: gl.constexpr = num_warps
    l4: gl.constexpr = gl.BlockedLayout([1, 1, 1, 8], [1, 1, 1, 32], [1, NW, 1, 1],
                                        [3, 2, 1, 0])
    vl4: gl.constexpr = gl.SliceLayout(0, l4)
    a4: gl.constexpr = gl.SliceLayout(2, l4)
    rows_d = gl.arange(0, TN_, gl.SliceLayout(1, gl.SliceLayout(2, a4)))
    pl3: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=1,
                                                order=[2, 1, 0])
    v_full = vec._reinterpret(gl.bfloat16, [NF, NW, KD // NW, TK_], pl3)
    # an instruction's header (its first 16 fields) in every thread's registers, the
    # next one asked for while this one runs (the list is read once a step: DRAM)
    HDR: gl.constexpr = 32 if ATT == 2 else 16         # BUMP2 is field 18
    hl: gl.constexpr = gl.BlockedLayout([HDR], [32], [num_warps], [0])
    f16 = gl.arange(0, HDR, hl)
    nxt = gl.load(base + f16)
    # this step's pos, read once: only ARGMAX, the last instruction, writes it (after
    # every other through the counters), and the launch is not programmatic-dependent
    pos_now = gl.load(pos_ptr, cache_modifier=".cg")
    t = 0
    failed = 0
    for i in range(n_instr):
        hdr = nxt
        nxt = gl.load(base + (i + 1) * WIDTH + f16, mask=(i + 1 < n_instr) & (f16 < HDR),
                      other=0)
        op = _field(hdr, f16, 0)
        layer = _field(hdr, f16, 1)
        row0 = _field(hdr, f16, 2)
        rows = _field(hdr, f16, 3)
        w0 = _field(hdr, f16, 6)
        t0 = _field(hdr, f16, 7)
        w1 = _field(hdr, f16, 8)
        t1 = _field(hdr, f16, 9)
        bump = _field(hdr, f16, 10)
        arg = _field(hdr, f16, 11)
        idx = _field(hdr, f16, 12)
        splits = _field(hdr, f16, 13)
        unit = _field(hdr, f16, 14)
        if CLOCK:
            gl.store(clk + i * 4, _now())
        # QKV's first bias rows, before its wait; loaded (masked off) for every op, as a
        # value the QKV loop carries must exist before the branch on op
        if BIAS:
            qb = op == 1
            bo = bqkv_ptr + layer * QKV + row0
            ba = gl.load(bo + rows_, mask=qb & (rows_ < rows), other=0.0)
            bb = gl.load(bo + TN_ + rows_, mask=qb & (TN_ + rows_ < rows), other=0.0)
        if (w0 >= 0) & (op != 2) & (op != 3) & (op != 15):   # these wait in their code
            if failed == 0:
                gl.store(err + 1, w0)
            failed = _wait_counter(ctr_ptr + w0, t0, timeout_ns, failed, err, i, POLL)
        if w1 >= 0:
            if failed == 0:
                gl.store(err + 1, w1)
            failed = _wait_counter(ctr_ptr + w1, t1, timeout_ns, failed, err, i, POLL)
        if CLOCK:
            gl.store(clk + i * 4 + 1, _now())
        if op == 1:                                   # RMS_QKV (+ bias)
            xn, xnt = _rms_vec(x_ptr, gin_ptr + layer * H, H, eps, offs, offs_t, GT)
            for rb in range(0, rows, 2 * TN_):
                ra = row0 + rb + rows_
                rbb = ra + TN_
                if BIAS:                              # the next pair's, before these tiles
                    nr = ra + 2 * TN_
                    na = gl.load(bqkv_ptr + layer * QKV + nr, mask=nr < row0 + rows,
                                 other=0.0)
                    nb = gl.load(bqkv_ptr + layer * QKV + nr + TN_,
                                 mask=nr + TN_ < row0 + rows, other=0.0)
                s = _stage_ready(ready, t, STAGES)
                ya = _row_dot(ring, 2 * s, xn, xnt, KG, GT, TN_, TK_, l3, al)
                yb = _row_dot(ring, 2 * s + 1, xn, xnt, KG, GT, TN_, TK_, l3, al)
                _stage_free(empty, s)
                t += 1
                if BIAS:
                    ya = ya.to(gl.bfloat16).to(gl.float32) + ba.to(gl.float32)
                    yb = yb.to(gl.bfloat16).to(gl.float32) + bb.to(gl.float32)
                    ba = na
                    bb = nb
                gl.store(qkv_ptr + ra, ya.to(gl.bfloat16))
                gl.store(qkv_ptr + rbb, yb.to(gl.bfloat16), mask=rbb < row0 + rows)
        elif op == 2:                                 # ROPE_KV
            failed = _op_rope_kv(layer, row0, pos_ptr, qkv_ptr, q_ptr, kc_ptr, vc_ptr, cos_ptr,
                                 sin_ptr, HQ, KVS, MAXCTX, ctr_ptr, w0, t0, timeout_ns, failed,
                                 err, i, G, GP, D, HKV, POLL, num_warps)
        elif op == 3:                                 # ATTN_PARTIAL
            failed = _op_attn_partial(layer, row0, arg, splits, unit, pos_ptr, q_ptr, kc_ptr,
                                      vc_ptr, pm_ptr, pl_ptr, po_ptr, SPMAX, MAXCTX, scale,
                                      ctr_ptr, w0, t0, timeout_ns, failed, err, i, G, GP, D,
                                      HKV, BT, POLL, num_warps)
        elif op == 4:                                 # ATTN_MERGE
            _op_attn_merge(row0, splits, unit, pos_now, pm_ptr, pl_ptr, po_ptr, attn_ptr, SPMAX,
                           D, SB, num_warps)
        elif op == 5:                                 # O_PROJ (+ residual)
            av = gl.load(attn_ptr + offs, mask=offs < HQ, other=0.0,
                         cache_modifier=".cg").to(gl.float32)
            avt = gl.load(attn_ptr + offs_t, mask=offs_t < HQ, other=0.0,
                          cache_modifier=".cg").to(gl.float32)
            for rb in range(0, rows, 2 * TN_):
                ra = row0 + rb + rows_
                rbb = ra + TN_
                xa = gl.load(x_ptr + ra, cache_modifier=".cg").to(gl.float32)
                xb = gl.load(x_ptr + rbb, mask=rbb < row0 + rows, other=0.0,
                             cache_modifier=".cg").to(gl.float32)
                s = _stage_ready(ready, t, STAGES)
                ya = _row_dot(ring, 2 * s, av, avt, KG, GT, TN_, TK_, l3, al)
                yb = _row_dot(ring, 2 * s + 1, av, avt, KG, GT, TN_, TK_, l3, al)
                _stage_free(empty, s)
                t += 1
                gl.store(x_ptr + ra, (xa + ya.to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16))
                gl.store(x_ptr + rbb, (xb + yb.to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16),
                         mask=rbb < row0 + rows)
        elif op == 6:                                 # GATE_UP (+ SwiGLU)
            xn, xnt = _rms_vec(x_ptr, gpost_ptr + layer * H, H, eps, offs, offs_t, GT)
            for rb in range(0, rows, TN_):
                s = _stage_ready(ready, t, STAGES)
                g = _row_dot(ring, 2 * s, xn, xnt, KG, GT, TN_, TK_, l3, al)
                u = _row_dot(ring, 2 * s + 1, xn, xnt, KG, GT, TN_, TK_, l3, al)
                _stage_free(empty, s)
                t += 1
                gb = g.to(gl.bfloat16).to(gl.float32)          # bf16 SwiGLU, as HF
                sg = (gb / (1.0 + gl.exp(-gb))).to(gl.bfloat16).to(gl.float32)
                hv = sg * u.to(gl.bfloat16).to(gl.float32)
                gl.store(h_ptr + row0 + rb + rows_, hv.to(gl.bfloat16))
        elif op == 7:                                 # DOWN (+ residual), all of K
            for c in gl.static_range(KTV // 4):
                hv = gl.load(h_ptr + c * 4 * TK_ + offs4, mask=c * 4 * TK_ + offs4 < I,
                             other=0.0, cache_modifier=".cg")
                vec.index(c).store(hv)
            gl.thread_barrier()
            for rb in range(0, rows, TN_):
                r = row0 + rb + rows_d
                xr = gl.load(x_ptr + r, cache_modifier=".cg").to(gl.float32)
                acc = gl.zeros([TN_, NW, TK_], gl.float32, a4)
                for j in range(NF):
                    s = _stage_ready(ready, t, STAGES)
                    hj = v_full.index(j).load(vl4).to(gl.float32)
                    acc = _dot_box_k(ring_dk, s, hj, acc, True, l4)
                    _stage_free(empty, s)
                    t += 1
                if TAIL > 0:
                    v_tail = vec._reinterpret(gl.bfloat16, [KTV // TAIL, NW, TAIL // NW, TK_],
                                              pl3)
                    s = _stage_ready(ready, t, STAGES)
                    ht = v_tail.index(NF * KD // TAIL).load(vl4).to(gl.float32)
                    acc = _dot_box_k(ring_tk, s * (KD // TAIL), ht, acc, True, l4)
                    _stage_free(empty, s)
                    t += 1
                y = gl.sum(gl.sum(acc, axis=2), axis=1).to(gl.bfloat16).to(gl.float32)
                gl.store(x_ptr + r, (xr + y).to(gl.bfloat16))
            gl.thread_barrier()                       # vec is rewritten by the next DOWN
        elif op == 8:                                 # LM_HEAD: this instruction's best
            xn, xnt = _rms_vec(x_ptr, gfin_ptr, H, eps, offs, offs_t, GT)
            best_v = gl.full([TN_], float("-inf"), gl.float32, rl)
            best_i = gl.full([TN_], 2147483647, gl.int32, rl)
            for rb in range(0, rows, 2 * TN_):
                s = _stage_ready(ready, t, STAGES)
                ya = _row_dot(ring, 2 * s, xn, xnt, KG, GT, TN_, TK_, l3, al)
                yb = _row_dot(ring, 2 * s + 1, xn, xnt, KG, GT, TN_, TK_, l3, al)
                _stage_free(empty, s)
                t += 1
                ra = row0 + rb + rows_
                ya = ya.to(gl.bfloat16).to(gl.float32)
                yb = gl.where(ra + TN_ < row0 + rows, yb.to(gl.bfloat16).to(gl.float32),
                              float("-inf"))
                up = ya > best_v                      # rows in order: strict keeps the
                best_i = gl.where(up, ra, best_i)     # earlier row among equals
                best_v = gl.where(up, ya, best_v)
                up = yb > best_v
                best_i = gl.where(up, ra + TN_, best_i)
                best_v = gl.where(up, yb, best_v)
            bv = gl.max(best_v, axis=0)
            bi = gl.min(gl.where(best_v == bv, best_i, 2147483647), axis=0)
            gl.store(val_ptr + idx, bv)
            gl.store(idx_ptr + idx, bi)
        elif op == 9:                                 # ARGMAX
            _op_argmax(rows, pos_ptr, plen_ptr, seq_ptr, amax_ptr, val_ptr, idx_ptr, NPB,
                       num_warps)
        elif op == 10:                                # EMBED
            _op_embed(row0, rows, pos_ptr, seq_ptr, emb_ptr, x_ptr, H, EB, num_warps)
        elif op == 15:                                # ATTN_FUSED ("two": bumps in its code)
            if ATT < 4:                               # compiled only for fused lists
                failed = _op_attn_fused(layer, row0, arg, splits, unit, bump,
                                        _field(hdr, f16, 18) if ATT == 2 else -1, pos_ptr,
                                        qkv_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, pm_ptr,
                                        pl_ptr, po_ptr, attn_ptr, SPMAX, MAXCTX, HQ, KVS,
                                        scale, ctr_ptr, w0, t0, timeout_ns, failed, err, i, G,
                                        GP, D, HKV, BT, SBF, ATT == 2, POLL, num_warps)
        if (bump >= 0) & ((op != 15) | (ATT != 2)):   # every thread's stores, then release
            gl.thread_barrier()
            gl.atomic_add(ctr_ptr + bump, 1, sem="release", scope="gpu")
        if CLOCK:
            gl.store(clk + i * 4 + 2, _now())


@gluon.jit
def step_kernel(prog_ptr, n_instr, d_qkv, d_o, d_gu, d_dn, d_dt, d_lm, x_ptr, qkv_ptr,
                q_ptr, attn_ptr, h_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, pm_ptr,
                pl_ptr, po_ptr, val_ptr, idx_ptr, seq_ptr, amax_ptr, pos_ptr, plen_ptr,
                emb_ptr, gin_ptr, gpost_ptr, gfin_ptr, bqkv_ptr, ctr_ptr, err_ptr,
                clk_ptr, L, H, I, QKV, HQ, KVS, V, SPMAX, MAXCTX, eps, scale,
                timeout_ns, n_ctr,
                KB_: gl.constexpr, KG: gl.constexpr, GT: gl.constexpr,
                NF: gl.constexpr, TAIL: gl.constexpr, STAGES: gl.constexpr,
                WIDTH: gl.constexpr, G: gl.constexpr, GP: gl.constexpr,
                D: gl.constexpr, HKV: gl.constexpr, BT: gl.constexpr,
                SB: gl.constexpr, SBF: gl.constexpr, NPB: gl.constexpr,
                EB: gl.constexpr, BIAS: gl.constexpr, ATT: gl.constexpr,
                CTR_BLOCK: gl.constexpr, CLOCK: gl.constexpr, POLL: gl.constexpr,
                num_warps: gl.constexpr):
    TN_: gl.constexpr = d_gu.block_type.shape[0]
    TK_: gl.constexpr = d_gu.block_type.shape[2]
    # a stage: two slots of [TN, KB_, TK] (two row blocks, or gate and up), or the same
    # bytes as one [TN, KD = 2 KB_, TK] down box
    ring = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, TN_, KB_, TK_],
                                     d_gu.layout)
    ring_dn, ring_dt, ring_dk, ring_tk = _down_views(ring, d_dn, d_dt, STAGES,
                                                     num_warps)
    KD: gl.constexpr = d_dn.block_type.shape[1]
    vec, ready, empty = _h_and_barriers(NF, KD, TAIL, TK_, STAGES)
    gl.warp_specialize([
        (_compute, (prog_ptr, n_instr, ring, ring_dk, ring_tk, ready, empty, vec,
                    x_ptr, qkv_ptr, q_ptr, attn_ptr, h_ptr, kc_ptr, vc_ptr, cos_ptr,
                    sin_ptr, pm_ptr, pl_ptr, po_ptr, val_ptr, idx_ptr, seq_ptr,
                    amax_ptr, pos_ptr, plen_ptr, emb_ptr, gin_ptr, gpost_ptr,
                    gfin_ptr, bqkv_ptr, ctr_ptr, err_ptr, clk_ptr, H, I, QKV, HQ, KVS,
                    SPMAX, MAXCTX, eps, scale, timeout_ns, KG, GT, NF, KD, TAIL,
                    STAGES, WIDTH, TN_, TK_, G, GP, D, HKV, BT, SB, SBF, NPB, EB, BIAS,
                    ATT, CLOCK, POLL, num_warps)),
        (_loader, (prog_ptr, n_instr, d_qkv, d_o, d_gu, d_dn, d_dt, d_lm, ring,
                   ring_dn, ring_dt, ready, empty, clk_ptr, L, H, I, QKV, V, NF, TAIL,
                   STAGES, WIDTH, CLOCK))],
        [1], [48])
    _reset_on_exit(ctr_ptr, n_ctr, CTR_BLOCK, num_warps)
