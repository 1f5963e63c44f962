"""The one-launch step of a mixture of experts (OLMoE, issue 26): ``gluon_step``'s kernel
with the MoE opcodes, in a kernel of its own so the dense one stays exactly as it was
(its helpers are shared, its top-level loops are not).

It runs ``schedule.build(spec, attention="four")``'s lists for an MoE spec (the q/k norm
lives in ROPE_KV, which the fused attention forms do not have). Per layer:

    RMS_QKV     rows of qkv, and its rows' sums of squares of q and of k (row IDX of
                ``qk_ss``: the q/k norm's statistic over the whole projection)
    ROPE_KV     sums the SPLITS blocks' squares, RMS-normalises its heads' q and its k
                (OLMoE's q_norm / k_norm gains, HF's rounding), RoPE, the cache write
    ATTN_PARTIAL, ATTN_MERGE, O_PROJ    as the dense kernel
    ROUTER      rows of the router's logits = W_r @ rmsnorm(x) (post-attention gain),
                rounded to bf16, stored fp32
    TOPK        softmax over the E logits (fp32), top-k as rounds of "largest, lowest
                index among equals", the ids and bf16-rounded weights into the layer's
                row of ``route_ids`` / ``route_w`` (not renormalised)
    EXPERT_GATE_UP  (slot, row) blocks of h: each slot's expert's gate and up rows (the
                loader addressed them by the slot's id) and the bf16 SwiGLU
    EXPERT_DOWN rows of x += sum over the slots in slot order of bf16(bf16(W_down[id]
                @ h_slot) * w_slot), then the residual (one group of all slots: the host
                refuses lists that split the slots); a stage holds R = 2 KB / KE slots'
                [TN, KE, TK] boxes of one row block (OLMoE: 4 slots, 32 KB)

The loader (one warp) streams as ``loads.stream`` models: an instruction whose LWAIT
names a counter (the experts: their tiles are addressed by the router's ids) has its
loader wait for it (bounded, the stall recorded in the loader's err row, once per
counter) before asking for its first tile and reading the ids; the first of a run of
such instructions (HOIST > 0) first streams into the ring's HOLD extra "held" stages the
first stages of what follows the run up to the next loader wait (QKV, O, router or LM
head rows, which depend on nothing the router picks). The kernel's unit is a ring stage
(two [TN, KB, TK] boxes: 16 of the VM's 4 x 256 tiles for a GEMV pair), so the first
held stage holds the VM's HOIST tiles (the host checks ``sched.hold`` fits in HOLD
stages). Both partitions keep the same count: after a run with a hoist, the first
HOLD stages of GEMV-pair instructions come from the held stages, in order, each with
its own barrier phase.

The host side is ``step.py`` (``MegaStep`` picks this kernel for an MoE spec).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .gluon_mlp import (_dot_box_k, _now, _reset_on_exit, _stage_free, _stage_ready,
                        _store_mine, _wait_counter)
from .gluon_step import (_attn_block, _field, _op_argmax, _op_attn_merge, _op_embed,
                         _rms_vec, _row_dot, _split_keys)

# opcodes by value (isa.py; tests/test_gluon_step.py holds them to isa's): RMS_QKV 1,
# ROPE_KV 2, ATTN_PARTIAL 3, ATTN_MERGE 4, O_PROJ 5, LM_HEAD 8, ARGMAX 9, EMBED 10,
# ROUTER 11, TOPK 12, EXPERT_GATE_UP 13, EXPERT_DOWN 14; fields OP 0 .. UNIT 14,
# LWAIT 15, LTARGET 16, HOIST 17


# ---- the loader -------------------------------------------------------------------------
@gluon.jit
def _pair_at(desc, ring, ready, empty, s, ph, r, n_rows, r_end):
    """Stage s (its ``ph``-th use's phase) <- row blocks r and r + TN of ``desc`` (whole
    rows); a second block at or past ``r_end`` is asked for past ``n_rows``: zeros."""
    TN_: gl.constexpr = desc.block_type.shape[0]
    mbarrier.wait(empty.index(s), ph ^ 1)
    mbarrier.expect(ready.index(s), 2 * desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [r, 0, 0], ready.index(s), ring.index(2 * s))
    r2 = gl.where(r + TN_ < r_end, r + TN_, n_rows)
    tma.async_copy_global_to_shared(desc, [r2, 0, 0], ready.index(s), ring.index(2 * s + 1))


@gluon.jit
def _pair_of(op, layer, row0, rb, rows, d_qkv, d_o, d_rt, d_lm, ring, ready, empty, s, ph,
             L, H, QKV, E, V):
    """Stage s <- the GEMV pair at rows row0 + rb of instruction (op, layer, row0, rows):
    QKV, O, router or LM-head rows."""
    if op == 1:
        r = layer * QKV + row0
        _pair_at(d_qkv, ring, ready, empty, s, ph, r + rb, L * QKV, r + rows)
    elif op == 5:
        r = layer * H + row0
        _pair_at(d_o, ring, ready, empty, s, ph, r + rb, L * H, r + rows)
    elif op == 11:
        r = layer * E + row0
        _pair_at(d_rt, ring, ready, empty, s, ph, r + rb, L * E, r + rows)
    elif op == 8:
        _pair_at(d_lm, ring, ready, empty, s, ph, row0 + rb, V, row0 + rows)


@gluon.jit
def _is_pair(op):
    return (op == 1) | (op == 5) | (op == 11) | (op == 8)


@gluon.jit
def _hoist(base, i, n_instr, f, hph, d_qkv, d_o, d_rt, d_lm, ring, ready, empty, L, H, QKV,
           E, V, STAGES: gl.constexpr, HOLD: gl.constexpr, WIDTH: gl.constexpr):
    """Held stages 0.. <- the first HOLD GEMV-pair stages after this run of
    loader-waiting instructions (from instruction i on), up to the next loader wait.
    Returns the held stages' phases (bit h: held stage h's uses, mod 2)."""
    TN_: gl.constexpr = d_qkv.block_type.shape[0]
    n = 0
    j = i + 1
    past = 0                                          # past the run
    while (j < n_instr) & (n < HOLD):
        h2 = gl.load(base + j * WIDTH + f)
        if _field(h2, f, 15) >= 0:
            if past != 0:                             # the next run: stop
                n = HOLD
        else:
            past = 1
            op = _field(h2, f, 0)
            if _is_pair(op):
                layer = _field(h2, f, 1)
                row0 = _field(h2, f, 2)
                rows = _field(h2, f, 3)
                for rb in range(0, gl.minimum(rows, (HOLD - n) * 2 * TN_), 2 * TN_):
                    _pair_of(op, layer, row0, rb, rows, d_qkv, d_o, d_rt, d_lm, ring, ready,
                             empty, STAGES + n, (hph >> n) & 1, L, H, QKV, E, V)
                    hph = hph ^ (1 << n)
                    n += 1
        j += 1
    return hph


@gluon.jit
def _expert_id(ids_ptr, layer, j, E, TOPK: gl.constexpr):
    """Slot j's expert in this layer (read after the router's counter), kept in [0, E)
    (after a timed-out wait it may be anything: the TMA then still reads a real row)."""
    e = gl.load(ids_ptr + layer * TOPK + j, cache_modifier=".cg")
    return gl.minimum(gl.maximum(e, 0), E - 1)


@gluon.jit
def _loader(prog_ptr, n_instr, d_qkv, d_o, d_rt, d_egu, d_edn, d_lm, d_kc, d_vc, ring, ring_e,
            ring_kv, ready, empty, ids_ptr, pos_ptr, ctr_ptr, err_ptr, clk_ptr, timeout_ns, L,
            H, I, QKV, E, V, MAXCTX, TOPK: gl.constexpr, STAGES: gl.constexpr,
            HOLD: gl.constexpr, HKV: gl.constexpr, WIDTH: gl.constexpr,
            CLOCK: gl.constexpr, POLL: gl.constexpr):
    """Every weight stage of this SM's list in the compute's order (``loads.stream``):
    the GEMV pairs (QKV, O, router, LM head), an expert's gate and up rows a row block,
    R slots' experts' down rows (all of I) a (row block, R slots); before an expert
    instruction's first stage its LWAIT counter (once per counter), after streaming the
    hoist."""
    TN_: gl.constexpr = d_qkv.block_type.shape[0]
    KB_: gl.constexpr = d_qkv.block_type.shape[1]
    KEB: gl.constexpr = d_edn.block_type.shape[1]
    R: gl.constexpr = 2 * KB_ // KEB                  # expert-down boxes a stage
    pid = gl.program_id(0)
    base = prog_ptr + pid * n_instr * WIDTH
    err = err_ptr + (gl.num_programs(0) + pid) * 4    # the loaders' rows after the computes'
    hl: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    f = gl.arange(0, 32, hl)                          # a header over the warp's lanes
    nxt = gl.load(base + f)
    KVB: gl.constexpr = d_kc.block_type.shape[0]      # keys a KV stage (K and V boxes)
    pos = gl.load(pos_ptr)                            # this step's: no instruction writes
    t = 0                                             # it before the loaders pass it
    pend = 0                                          # held stages still to come
    hph = 0
    prev_lw = -1
    last_w = -1
    failed = 0
    for i in range(n_instr):
        hdr = nxt
        nxt = gl.load(base + (i + 1) * WIDTH + f, mask=(i + 1 < n_instr) & (f < 32), other=0)
        op = _field(hdr, f, 0)
        layer = _field(hdr, f, 1)
        row0 = _field(hdr, f, 2)
        rows = _field(hdr, f, 3)
        lw = _field(hdr, f, 15)
        if (lw >= 0) & (prev_lw < 0):                 # the first of a run: its hoist
            pend = 0
            if HOLD > 0:
                if _field(hdr, f, 17) > 0:
                    pend = HOLD
                    hph = _hoist(base, i, n_instr, f, hph, d_qkv, d_o, d_rt, d_lm, ring,
                                 ready, empty, L, H, QKV, E, V, STAGES, HOLD, WIDTH)
        if (lw >= 0) & (lw != last_w):                # the router's counter, then its ids
            was = failed
            failed = _wait_counter(ctr_ptr + lw, _field(hdr, f, 16), timeout_ns, failed, err,
                                   i, POLL)
            if (was == 0) & (failed != 0):
                _store_mine(err + 1, lw)
            last_w = lw
        prev_lw = lw
        if _is_pair(op):
            for rb in range(0, rows, 2 * TN_):
                if pend > 0:                          # held: streamed before the wait
                    pend -= 1
                else:
                    _pair_of(op, layer, row0, rb, rows, d_qkv, d_o, d_rt, d_lm, ring, ready,
                             empty, t % STAGES, (t // STAGES) & 1, L, H, QKV, E, V)
                    t += 1
        elif op == 13:                                # EXPERT_GATE_UP: gate rows, up rows
            for rb in range(0, rows, TN_):
                rr = row0 + rb
                j = rr // I
                e = _expert_id(ids_ptr, layer, j, E, TOPK)
                r = (layer * E + e) * 2 * I + rr - j * I
                s = t % STAGES
                mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), 2 * d_egu.block_type.nbytes)
                tma.async_copy_global_to_shared(d_egu, [r, 0, 0], ready.index(s),
                                                ring.index(2 * s))
                tma.async_copy_global_to_shared(d_egu, [r + I, 0, 0], ready.index(s),
                                                ring.index(2 * s + 1))
                t += 1
        elif op == 14:                                # EXPERT_DOWN: a row block's slots,
            j0 = _field(hdr, f, 4) // I               # R of them a stage
            ns = _field(hdr, f, 5) // I
            for rb in range(0, rows, TN_):
                for jg in range(0, ns, R):            # a box past the group's slots is
                    s = t % STAGES                    # asked for past the tensor: zeros
                    mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
                    mbarrier.expect(ready.index(s), R * d_edn.block_type.nbytes)
                    for b in gl.static_range(R):
                        j = jg + b
                        e = _expert_id(ids_ptr, layer, gl.minimum(j0 + j, TOPK - 1), E, TOPK)
                        r = gl.where(j < ns, (layer * E + e) * H + row0 + rb, L * E * H)
                        tma.async_copy_global_to_shared(d_edn, [r, 0, 0], ready.index(s),
                                                        ring_e.index(s * R + b))
                    t += 1
        elif op == 3:                                 # ATTN_PARTIAL: its split's keys before
            start, end, per = _split_keys(pos + 1, _field(hdr, f, 11), _field(hdr, f, 13),
                                          _field(hdr, f, 14))          # pos, K and V boxes
            krow = (layer * HKV + row0) * MAXCTX      # a stage (rows past the split: masked)
            for k0 in range(start, gl.minimum(end, pos), KVB):
                s = t % STAGES
                mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), 2 * d_kc.block_type.nbytes)
                tma.async_copy_global_to_shared(d_kc, [krow + k0, 0], ready.index(s),
                                                ring_kv.index(2 * s))
                tma.async_copy_global_to_shared(d_vc, [krow + k0, 0], ready.index(s),
                                                ring_kv.index(2 * s + 1))
                t += 1
        if CLOCK & (_is_pair(op) | (op == 13) | (op == 14) | (op == 3)):
            gl.store(clk_ptr + (pid * n_instr + i) * 4 + 3, _now())


# ---- the compute partition's MoE pieces ------------------------------------------------------
@gluon.jit
def _take(ready, t, pend, hph, STAGES: gl.constexpr, HOLD: gl.constexpr):
    """The next GEMV-pair stage in order: a held one while a hoist's are pending, else
    the ring's; waits for it. Returns (stage, t, pend, hph)."""
    if pend > 0:
        h = HOLD - pend
        s = STAGES + h
        ph = (hph >> h) & 1
        hph = hph ^ (1 << h)
        pend -= 1
    else:
        s = t % STAGES
        ph = (t // STAGES) & 1
        t += 1
    mbarrier.wait(ready.index(s), ph)
    return s, t, pend, hph


@gluon.jit
def _rope_normed(ptr, gptr, d, D: gl.constexpr, c, s, mask, rstd):
    """``gluon_step._rope`` of the head rows at ``ptr`` RMS-normalised first (OLMoE's q/k
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
def _op_rope_kv_qkn(layer, kh, n_blocks, pos_ptr, qkv_ptr, q_ptr, kc_ptr, vc_ptr, cos_ptr,
                    sin_ptr, qn_ptr, kn_ptr, ss_ptr, HQ, KVS, MAXCTX, eps, ctr_ptr, w0, target,
                    timeout_ns, failed, err, instr, G: gl.constexpr, GP: gl.constexpr,
                    D: gl.constexpr, HKV: gl.constexpr, QSB: gl.constexpr,
                    POLL: gl.constexpr, num_warps: gl.constexpr):
    """ROPE_KV with OLMoE's q/k norm: the statistic of the whole q (k) from the
    ``n_blocks`` QKV blocks' partial squares (chunks of QSB, each summed in a fixed
    order), kv head kh's G query heads and its key normalised (their gains), RoPE'd
    (into q; the key into the cache at slot pos), its value into the cache. cos/sin
    and the gains are asked for before the counter wait. Returns the wait's ``failed``."""
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
def _op_topk(layer, pos, rl_ptr, ids_ptr, rw_ptr, log_ptr, L, E, EP: gl.constexpr,
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


@gluon.jit
def _op_attn_partial_kv(layer, kh, sp, splits, unit, pos, q_ptr, kc_ptr, vc_ptr, pm_ptr, pl_ptr,
                        po_ptr, ring_kc, ready, empty, t, SPMAX, MAXCTX, scale, ctr_ptr, w0,
                        target, timeout_ns, failed, err, instr, STAGES: gl.constexpr,
                        G: gl.constexpr, GP: gl.constexpr, D: gl.constexpr,
                        HKV: gl.constexpr, BT: gl.constexpr, KVB: gl.constexpr,
                        POLL: gl.constexpr, num_warps: gl.constexpr):
    """``gluon_step._op_attn_partial`` with the keys before pos from the ring: the loader
    streamed them as stages of KVB keys (K and V boxes), in order with the weights, so no
    key costs the compute a round trip; the newest key (this step's RoPE) comes from L2
    after the wait, last. Returns (the wait's ``failed``, t)."""
    l3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 1, 32], [num_warps, 1, 1], [2, 1, 0])
    sl: gl.constexpr = gl.SliceLayout(2, l3)              # [GP, BT] scores
    kl: gl.constexpr = gl.SliceLayout(0, l3)              # [BT, D] keys / values
    ql: gl.constexpr = gl.SliceLayout(1, l3)              # [GP, D] queries / output
    start, end, per = _split_keys(pos + 1, sp, splits, unit)
    tk = gl.arange(0, BT, gl.SliceLayout(1, kl))
    dk = gl.arange(0, D, gl.SliceLayout(0, kl))
    ts = gl.arange(0, BT, gl.SliceLayout(0, sl))
    if w0 >= 0:
        if failed == 0:
            gl.store(err + 1, w0)
        failed = _wait_counter(ctr_ptr + w0, target, timeout_ns, failed, err, instr, POLL)
    hq = gl.arange(0, GP, gl.SliceLayout(1, ql))
    dq = gl.arange(0, D, gl.SliceLayout(0, ql))
    qmask = (hq[:, None] < G) & (dq[None, :] < D)
    q = gl.load(q_ptr + (kh * G + hq[:, None]) * D + dq[None, :], mask=qmask, other=0.0,
                cache_modifier=".cg").to(gl.float32)
    at_pos = (start <= pos) & (pos < end)
    pm = (tk[:, None] == 0) & (dk[None, :] < D) & at_pos
    kv_pos = ((layer * HKV + kh) * MAXCTX + pos) * D + tk[:, None] * 0 + dk[None, :]
    k_new = gl.load(kc_ptr + kv_pos, mask=pm, other=0.0, cache_modifier=".cg").to(gl.float32)
    v_new = gl.load(vc_ptr + kv_pos, mask=pm, other=0.0, cache_modifier=".cg").to(gl.float32)
    m_i = gl.full([GP], float("-inf"), gl.float32, gl.SliceLayout(1, sl))
    l_i = gl.zeros([GP], gl.float32, gl.SliceLayout(1, sl))
    o = gl.zeros([GP, D], gl.float32, ql)
    old = gl.minimum(end, pos)
    for k0 in range(start, old, KVB):
        s = t % STAGES
        mbarrier.wait(ready.index(s), (t // STAGES) & 1)
        for b in gl.static_range(KVB // BT):
            k = ring_kc.index(2 * s * (KVB // BT) + b).load(kl).to(gl.float32)
            v = ring_kc.index((2 * s + 1) * (KVB // BT) + b).load(kl).to(gl.float32)
            m_i, l_i, o = _attn_block(q, k, v, k0 + b * BT + ts < old, m_i, l_i, o, scale,
                                      ql)
        _stage_free(empty, s)
        t += 1
    if at_pos:
        m_i, l_i, o = _attn_block(q, k_new, v_new, ts == 0, m_i, l_i, o, scale, ql)
    hs = gl.arange(0, GP, gl.SliceLayout(1, sl))
    row = (kh * G + hs) * SPMAX + sp
    gl.store(pm_ptr + row, m_i, mask=hs < G)
    gl.store(pl_ptr + row, l_i, mask=hs < G)
    gl.store(po_ptr + ((kh * G + hq[:, None]) * SPMAX + sp) * D + dq[None, :], o, mask=qmask)
    return failed, t


# ---- the compute partition -------------------------------------------------------------------
@gluon.jit
def _compute(prog_ptr, n_instr, ring, ring_ek, ring_kc, ready, empty, hs, x_ptr, qkv_ptr, q_ptr,
             attn_ptr, h_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, pm_ptr, pl_ptr, po_ptr, val_ptr,
             idx_ptr, seq_ptr, amax_ptr, pos_ptr, plen_ptr, emb_ptr, gin_ptr, gpost_ptr,
             gfin_ptr, qn_ptr, kn_ptr, ss_ptr, rl_ptr, ids_ptr, rw_ptr, log_ptr, ctr_ptr,
             err_ptr, clk_ptr, L, H, I, QKV, HQ, KVS, E, SPMAX, MAXCTX, eps, scale, timeout_ns,
             KB_: gl.constexpr, KG: gl.constexpr, GT: gl.constexpr, KE: gl.constexpr,
             TOPK: gl.constexpr,
             EP: gl.constexpr, QSB: gl.constexpr, STAGES: gl.constexpr, HOLD: gl.constexpr,
             WIDTH: gl.constexpr, TN_: gl.constexpr, TK_: gl.constexpr, G: gl.constexpr,
             GP: gl.constexpr, D: gl.constexpr, HKV: gl.constexpr, BT: gl.constexpr,
             SB: gl.constexpr, NPB: gl.constexpr, EB: gl.constexpr, CLOCK: gl.constexpr,
             POLL: gl.constexpr, KVB: gl.constexpr,
             num_warps: gl.constexpr):
    # a row box [TN, kb, TK]: rows over the warps, K tiles in each thread's registers,
    # columns over a warp's lanes, 8 a lane (16-byte shared loads) (as gluon_step)
    l3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 1, 32], [num_warps, 1, 1], [2, 1, 0])
    vl: gl.constexpr = gl.SliceLayout(0, l3)
    al: gl.constexpr = gl.SliceLayout(1, l3)
    rl: gl.constexpr = gl.SliceLayout(1, al)
    R: gl.constexpr = 2 * KB_ // KE                      # expert-down boxes a stage
    pid = gl.program_id(0)
    base = prog_ptr + pid * n_instr * WIDTH
    err = err_ptr + pid * 4
    clk = clk_ptr + pid * n_instr * 4
    kk = gl.arange(0, KG, gl.SliceLayout(1, vl))
    cc = gl.arange(0, TK_, gl.SliceLayout(0, vl))
    offs = kk[:, None] * TK_ + cc[None, :]               # [KG, TK]
    if GT > 0:
        offs_t = (KG + gl.arange(0, GT, gl.SliceLayout(1, vl)))[:, None] * TK_ + cc[None, :]
    else:                                                # all of K in the KG tiles: the
        offs_t = offs + KG * TK_                         # tail's loads are masked off
    k4 = gl.arange(0, 4, gl.SliceLayout(1, vl))
    offs4 = k4[:, None] * TK_ + cc[None, :]              # [4, TK]: h staged 4 tiles a time
    rows_ = gl.arange(0, TN_, rl)
    # the experts' down: a box [TN, NW, KE / NW, TK] a (row block, slot), K over the warps
    NW: gl.constexpr = num_warps
    l4: gl.constexpr = gl.BlockedLayout([1, 1, 1, 8], [1, 1, 1, 32], [1, NW, 1, 1],
                                        [3, 2, 1, 0])
    vl4: gl.constexpr = gl.SliceLayout(0, l4)
    a4: gl.constexpr = gl.SliceLayout(2, l4)
    rows_d = gl.arange(0, TN_, gl.SliceLayout(1, gl.SliceLayout(2, a4)))
    pl3: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=1,
                                                order=[2, 1, 0])
    h_slots = hs._reinterpret(gl.bfloat16, [TOPK, NW, KE // NW, TK_], pl3)
    hl: gl.constexpr = gl.BlockedLayout([32], [32], [num_warps], [0])
    f = gl.arange(0, 32, hl)
    nxt = gl.load(base + f)
    pos_now = gl.load(pos_ptr, cache_modifier=".cg")
    t = 0
    pend = 0
    hph = 0
    prev_lw = -1
    failed = 0
    for i in range(n_instr):
        hdr = nxt
        nxt = gl.load(base + (i + 1) * WIDTH + f, mask=(i + 1 < n_instr) & (f < 32), other=0)
        op = _field(hdr, f, 0)
        layer = _field(hdr, f, 1)
        row0 = _field(hdr, f, 2)
        rows = _field(hdr, f, 3)
        w0 = _field(hdr, f, 6)
        t0 = _field(hdr, f, 7)
        w1 = _field(hdr, f, 8)
        t1 = _field(hdr, f, 9)
        bump = _field(hdr, f, 10)
        idx = _field(hdr, f, 12)
        splits = _field(hdr, f, 13)
        lw = _field(hdr, f, 15)
        if (lw >= 0) & (prev_lw < 0):                 # the first of a run: its hoist
            pend = 0
            if HOLD > 0:
                if _field(hdr, f, 17) > 0:
                    pend = HOLD
        prev_lw = lw
        if CLOCK:
            gl.store(clk + i * 4, _now())
        if (w0 >= 0) & (op != 2) & (op != 3):         # these wait in their code
            if failed == 0:
                gl.store(err + 1, w0)
            failed = _wait_counter(ctr_ptr + w0, t0, timeout_ns, failed, err, i, POLL)
        if w1 >= 0:
            if failed == 0:
                gl.store(err + 1, w1)
            failed = _wait_counter(ctr_ptr + w1, t1, timeout_ns, failed, err, i, POLL)
        if CLOCK:
            gl.store(clk + i * 4 + 1, _now())
        if op == 1:                                   # RMS_QKV (+ its q and k squares)
            xn, xnt = _rms_vec(x_ptr, gin_ptr + layer * H, H, eps, offs, offs_t, GT)
            sq = gl.zeros([TN_], gl.float32, rl)
            sk = gl.zeros([TN_], gl.float32, rl)
            for rb in range(0, rows, 2 * TN_):
                ra = row0 + rb + rows_
                rbb = ra + TN_
                s, t, pend, hph = _take(ready, t, pend, hph, STAGES, HOLD)
                ya = _row_dot(ring, 2 * s, xn, xnt, KG, GT, TN_, TK_, l3, al)
                yb = _row_dot(ring, 2 * s + 1, xn, xnt, KG, GT, TN_, TK_, l3, al)
                _stage_free(empty, s)
                ya = ya.to(gl.bfloat16).to(gl.float32)
                yb = gl.where(rbb < row0 + rows, yb.to(gl.bfloat16).to(gl.float32), 0.0)
                sq += gl.where(ra < HQ, ya * ya, 0.0) + gl.where(rbb < HQ, yb * yb, 0.0)
                sk += (gl.where((ra >= HQ) & (ra < HQ + KVS), ya * ya, 0.0)
                       + gl.where((rbb >= HQ) & (rbb < HQ + KVS), yb * yb, 0.0))
                gl.store(qkv_ptr + ra, ya.to(gl.bfloat16))
                gl.store(qkv_ptr + rbb, yb.to(gl.bfloat16), mask=rbb < row0 + rows)
            gl.store(ss_ptr + idx * 2, gl.sum(sq, axis=0))
            gl.store(ss_ptr + idx * 2 + 1, gl.sum(sk, axis=0))
        elif op == 2:                                 # ROPE_KV (+ the q/k norm)
            failed = _op_rope_kv_qkn(layer, row0, splits, pos_ptr, qkv_ptr, q_ptr, kc_ptr,
                                     vc_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, ss_ptr, HQ,
                                     KVS, MAXCTX, eps, ctr_ptr, w0, t0, timeout_ns, failed,
                                     err, i, G, GP, D, HKV, QSB, POLL, num_warps)
        elif op == 3:                                 # ATTN_PARTIAL, keys from the ring
            failed, t = _op_attn_partial_kv(layer, row0, _field(hdr, f, 11), splits,
                                            _field(hdr, f, 14), pos_now, q_ptr, kc_ptr,
                                            vc_ptr, pm_ptr, pl_ptr, po_ptr, ring_kc, ready,
                                            empty, t, SPMAX, MAXCTX, scale, ctr_ptr, w0, t0,
                                            timeout_ns, failed, err, i, STAGES, G, GP, D,
                                            HKV, BT, KVB, POLL, num_warps)
        elif op == 4:                                 # ATTN_MERGE
            _op_attn_merge(row0, splits, _field(hdr, f, 14), pos_now, pm_ptr, pl_ptr, po_ptr,
                           attn_ptr, SPMAX, D, SB, num_warps)
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
                s, t, pend, hph = _take(ready, t, pend, hph, STAGES, HOLD)
                ya = _row_dot(ring, 2 * s, av, avt, KG, GT, TN_, TK_, l3, al)
                yb = _row_dot(ring, 2 * s + 1, av, avt, KG, GT, TN_, TK_, l3, al)
                _stage_free(empty, s)
                gl.store(x_ptr + ra, (xa + ya.to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16))
                gl.store(x_ptr + rbb, (xb + yb.to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16),
                         mask=rbb < row0 + rows)
        elif op == 11:                                # ROUTER: rows of the logits
            xn, xnt = _rms_vec(x_ptr, gpost_ptr + layer * H, H, eps, offs, offs_t, GT)
            for rb in range(0, rows, 2 * TN_):
                ra = row0 + rb + rows_
                rbb = ra + TN_
                s, t, pend, hph = _take(ready, t, pend, hph, STAGES, HOLD)
                ya = _row_dot(ring, 2 * s, xn, xnt, KG, GT, TN_, TK_, l3, al)
                yb = _row_dot(ring, 2 * s + 1, xn, xnt, KG, GT, TN_, TK_, l3, al)
                _stage_free(empty, s)
                gl.store(rl_ptr + ra, ya.to(gl.bfloat16).to(gl.float32),
                         mask=ra < row0 + rows)
                gl.store(rl_ptr + rbb, yb.to(gl.bfloat16).to(gl.float32),
                         mask=rbb < row0 + rows)
        elif op == 12:                                # TOPK
            _op_topk(layer, pos_now, rl_ptr, ids_ptr, rw_ptr, log_ptr, L, E, EP, TOPK,
                     num_warps)
        elif op == 13:                                # EXPERT_GATE_UP (+ SwiGLU)
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
        elif op == 14:                                # EXPERT_DOWN (+ residual)
            j0 = _field(hdr, f, 4) // I
            ns = _field(hdr, f, 5) // I
            for c in gl.static_range(TOPK * KE // 4):  # every slot's h, 4 K tiles a time
                hv = gl.load(h_ptr + c * 4 * TK_ + offs4, cache_modifier=".cg")
                hs.index(c).store(hv)
            gl.thread_barrier()
            for rb in range(0, rows, TN_):
                r = row0 + rb + rows_d
                xr = gl.load(x_ptr + r, cache_modifier=".cg").to(gl.float32)
                part = gl.zeros([TN_], gl.float32, gl.SliceLayout(1, gl.SliceLayout(2, a4)))
                for jg in range(0, ns, R):            # R slots a stage, in slot order
                    s = _stage_ready(ready, t, STAGES)
                    for b in range(gl.minimum(ns - jg, R)):
                        j = j0 + jg + b
                        wj = gl.load(rw_ptr + layer * TOPK + j, cache_modifier=".cg")
                        hj = h_slots.index(j).load(vl4).to(gl.float32)
                        acc = _dot_box_k(ring_ek, s * R + b, hj,
                                         gl.zeros([TN_, NW, TK_], gl.float32, a4), True, l4)
                        y = gl.sum(gl.sum(acc, axis=2), axis=1).to(gl.bfloat16).to(gl.float32)
                        part += (y * wj).to(gl.bfloat16).to(gl.float32)
                    _stage_free(empty, s)
                    t += 1
                gl.store(x_ptr + r, (xr + part.to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16))
            gl.thread_barrier()                       # hs is rewritten by the next
        elif op == 8:                                 # LM_HEAD: this instruction's best
            xn, xnt = _rms_vec(x_ptr, gfin_ptr, H, eps, offs, offs_t, GT)
            best_v = gl.full([TN_], float("-inf"), gl.float32, rl)
            best_i = gl.full([TN_], 2147483647, gl.int32, rl)
            for rb in range(0, rows, 2 * TN_):
                s, t, pend, hph = _take(ready, t, pend, hph, STAGES, HOLD)
                ya = _row_dot(ring, 2 * s, xn, xnt, KG, GT, TN_, TK_, l3, al)
                yb = _row_dot(ring, 2 * s + 1, xn, xnt, KG, GT, TN_, TK_, l3, al)
                _stage_free(empty, s)
                ra = row0 + rb + rows_
                ya = ya.to(gl.bfloat16).to(gl.float32)
                yb = gl.where(ra + TN_ < row0 + rows, yb.to(gl.bfloat16).to(gl.float32),
                              float("-inf"))
                up = ya > best_v
                best_i = gl.where(up, ra, best_i)
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
        if bump >= 0:                                 # every thread's stores, then release
            gl.thread_barrier()
            gl.atomic_add(ctr_ptr + bump, 1, sem="release", scope="gpu")
        if CLOCK:
            gl.store(clk + i * 4 + 2, _now())


@gluon.jit
def moe_step_kernel(prog_ptr, n_instr, d_qkv, d_o, d_rt, d_egu, d_edn, d_lm, d_kc, d_vc,
                    x_ptr, qkv_ptr,
                    q_ptr, attn_ptr, h_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, pm_ptr, pl_ptr,
                    po_ptr, val_ptr, idx_ptr, seq_ptr, amax_ptr, pos_ptr, plen_ptr, emb_ptr,
                    gin_ptr, gpost_ptr, gfin_ptr, qn_ptr, kn_ptr, ss_ptr, rl_ptr, ids_ptr,
                    rw_ptr, log_ptr, ctr_ptr, err_ptr, clk_ptr, L, H, I, QKV, HQ, KVS, V, E, SPMAX,
                    MAXCTX, eps, scale, timeout_ns, n_ctr, KB_: gl.constexpr,
                    KG: gl.constexpr, GT: gl.constexpr, KE: gl.constexpr,
                    TOPK: gl.constexpr, EP: gl.constexpr, QSB: gl.constexpr,
                    STAGES: gl.constexpr, HOLD: gl.constexpr, WIDTH: gl.constexpr,
                    G: gl.constexpr, GP: gl.constexpr, D: gl.constexpr, HKV: gl.constexpr,
                    BT: gl.constexpr, SB: gl.constexpr, NPB: gl.constexpr, EB: gl.constexpr,
                    CTR_BLOCK: gl.constexpr, CLOCK: gl.constexpr, POLL: gl.constexpr,
                    num_warps: gl.constexpr):
    TN_: gl.constexpr = d_qkv.block_type.shape[0]
    TK_: gl.constexpr = d_qkv.block_type.shape[2]
    NS: gl.constexpr = STAGES + HOLD                  # the ring's stages, then the held
    # a stage: two slots of [TN, KB_, TK] (a GEMV pair, or an expert's gate and up rows),
    # or R boxes of [TN, KE, TK] (an expert's down rows, one a (row block, slot))
    ring = gl.allocate_shared_memory(gl.bfloat16, [2 * NS, TN_, KB_, TK_], d_qkv.layout)
    R: gl.constexpr = 2 * KB_ // KE
    ring_e = ring._reinterpret(gl.bfloat16, [NS * R, TN_, KE, TK_], d_edn.layout)
    pl4: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=1,
                                                order=[3, 2, 1, 0])
    ring_ek = ring._reinterpret(gl.bfloat16, [NS * R, TN_, num_warps, KE // num_warps, TK_],
                                pl4)
    # or a K box and a V box of KVB keys each (unswizzled, as the weights' boxes: the same
    # bytes in the same order), read back BT keys a time
    KVB: gl.constexpr = d_kc.block_type.shape[0]
    ring_kv = ring._reinterpret(gl.bfloat16, [2 * NS, KVB, D], d_kc.layout)
    kvl: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=1,
                                                order=[1, 0])
    ring_kc = ring._reinterpret(gl.bfloat16, [2 * NS * (KVB // BT), BT, D], kvl)
    vlay: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=1,
                                                 order=[1, 0])
    hs = gl.allocate_shared_memory(gl.bfloat16, [TOPK * KE // 4, 4, TK_], vlay)
    ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NS):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize([
        (_compute, (prog_ptr, n_instr, ring, ring_ek, ring_kc, ready, empty, hs, x_ptr,
                    qkv_ptr, q_ptr,
                    attn_ptr, h_ptr, kc_ptr, vc_ptr, cos_ptr, sin_ptr, pm_ptr, pl_ptr, po_ptr,
                    val_ptr, idx_ptr, seq_ptr, amax_ptr, pos_ptr, plen_ptr, emb_ptr, gin_ptr,
                    gpost_ptr, gfin_ptr, qn_ptr, kn_ptr, ss_ptr, rl_ptr, ids_ptr, rw_ptr,
                    log_ptr, ctr_ptr, err_ptr, clk_ptr, L, H, I, QKV, HQ, KVS, E, SPMAX, MAXCTX,
                    eps, scale, timeout_ns, KB_, KG, GT, KE, TOPK, EP, QSB, STAGES, HOLD, WIDTH,
                    TN_, TK_, G, GP, D, HKV, BT, SB, NPB, EB, CLOCK, POLL, KVB,
                    num_warps)),
        (_loader, (prog_ptr, n_instr, d_qkv, d_o, d_rt, d_egu, d_edn, d_lm, d_kc, d_vc, ring,
                   ring_e, ring_kv, ready, empty, ids_ptr, pos_ptr, ctr_ptr, err_ptr, clk_ptr,
                   timeout_ns, L, H, I, QKV, E, V, MAXCTX, TOPK, STAGES, HOLD, HKV,
                   WIDTH, CLOCK, POLL))],
        [1], [48])
    _reset_on_exit(ctr_ptr, n_ctr, CTR_BLOCK, num_warps)
