"""The one-launch decode step of a mixture of experts (OLMoE): ``dense.py``'s kernel with
the MoE opcodes. Its loader is ``moe_loader.py``, its q/k-normed RoPE and top-k
``moe_ops.py``; the dense kernel's other pieces are shared (``ops.py``, ``attention.py``).

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

The kernel's unit is a ring stage (two [TN, KB, TK] boxes: 16 of the VM's 4 x 256 tiles
for a GEMV pair), so the first held stage holds the VM's HOIST tiles (the host checks
``sched.hold`` fits in HOLD stages). Both partitions keep the same count: after a run
with a hoist, the first HOLD stages of GEMV-pair instructions come from the held
stages, in order, each with its own barrier phase.

The host side is ``step.py`` (``MoEStep``).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from .. import isa
from .attention import op_attn_merge, op_attn_partial
from .moe_loader import _loader
from .moe_ops import op_rope_kv_qkn, op_topk
from .ops import field, op_argmax, op_embed, rms_vec, row_dot
from .ring import dot_box_k
from .sync import now, reset_on_exit, stage_free, stage_ready, wait_counter


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
def _compute(prog_ptr, n_instr, ring, ring_ek, ready, empty, hs, acts, cache, parts, token,
             gains, route, sync, sizes, eps, scale, timeout_ns, C: gl.constexpr,
             TN_: gl.constexpr, TK_: gl.constexpr, num_warps: gl.constexpr):
    """This SM's list, one instruction at a time (as ``dense._compute``), the GEMV pairs'
    stages taken in the loader's order, held ones first after a hoist (``_take``)."""
    x_ptr, qkv_ptr, q_ptr, attn_ptr, h_ptr = acts
    kc_ptr, vc_ptr, cos_ptr, sin_ptr = cache
    pm_ptr, pl_ptr, po_ptr = parts
    val_ptr, idx_ptr, seq_ptr, amax_ptr, pos_ptr, plen_ptr = token
    emb_ptr, gin_ptr, gpost_ptr, gfin_ptr, qn_ptr, kn_ptr = gains
    ss_ptr, rl_ptr, ids_ptr, rw_ptr, log_ptr = route
    ctr_ptr, err_ptr, clk_ptr = sync
    L, H, I, QKV, HQ, KVS, V, E, SPMAX, MAXCTX = sizes
    KB_: gl.constexpr = C.KB_
    KG: gl.constexpr = C.KG
    GT: gl.constexpr = C.GT
    KE: gl.constexpr = C.KE
    TOPK: gl.constexpr = C.TOPK
    EP: gl.constexpr = C.EP
    STAGES: gl.constexpr = C.STAGES
    HOLD: gl.constexpr = C.HOLD
    WIDTH: gl.constexpr = C.WIDTH
    D: gl.constexpr = C.D
    SB: gl.constexpr = C.SB
    NPB: gl.constexpr = C.NPB
    EB: gl.constexpr = C.EB
    CLOCK: gl.constexpr = C.CLOCK
    POLL: gl.constexpr = C.POLL
    # a row box [TN, kb, TK]: rows over the warps, K tiles in each thread's registers,
    # columns over a warp's lanes, 8 a lane (16-byte shared loads) (as dense.py)
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
        op = field(hdr, f, isa.OP)
        layer = field(hdr, f, isa.LAYER)
        row0 = field(hdr, f, isa.ROW0)
        rows = field(hdr, f, isa.ROWS)
        w0 = field(hdr, f, isa.WAIT0)
        t0 = field(hdr, f, isa.TARGET0)
        w1 = field(hdr, f, isa.WAIT1)
        t1 = field(hdr, f, isa.TARGET1)
        bump = field(hdr, f, isa.BUMP)
        idx = field(hdr, f, isa.IDX)
        splits = field(hdr, f, isa.SPLITS)
        lw = field(hdr, f, isa.LWAIT)
        if (lw >= 0) & (prev_lw < 0):                 # the first of a run: its hoist
            pend = 0
            if HOLD > 0:
                if field(hdr, f, isa.HOIST) > 0:
                    pend = HOLD
        prev_lw = lw
        if CLOCK:
            gl.store(clk + i * 4, now())
        # ROPE_KV and the partials wait in their code (after their early loads)
        if (w0 >= 0) & (op != isa.OP_ROPE_KV) & (op != isa.OP_ATTN_PARTIAL):
            if failed == 0:
                gl.store(err + 1, w0)
            failed = wait_counter(ctr_ptr + w0, t0, timeout_ns, failed, err, i, POLL)
        if w1 >= 0:
            if failed == 0:
                gl.store(err + 1, w1)
            failed = wait_counter(ctr_ptr + w1, t1, timeout_ns, failed, err, i, POLL)
        if CLOCK:
            gl.store(clk + i * 4 + 1, now())
        if op == isa.OP_RMS_QKV:                  # + its q and k squares
            xn, xnt = rms_vec(x_ptr, gin_ptr + layer * H, H, eps, offs, offs_t, GT)
            sq = gl.zeros([TN_], gl.float32, rl)
            sk = gl.zeros([TN_], gl.float32, rl)
            for rb in range(0, rows, 2 * TN_):
                ra = row0 + rb + rows_
                rbb = ra + TN_
                s, t, pend, hph = _take(ready, t, pend, hph, STAGES, HOLD)
                ya = row_dot(ring, 2 * s, xn, xnt, KG, GT, TN_, TK_, l3, al)
                yb = row_dot(ring, 2 * s + 1, xn, xnt, KG, GT, TN_, TK_, l3, al)
                stage_free(empty, s)
                ya = ya.to(gl.bfloat16).to(gl.float32)
                yb = gl.where(rbb < row0 + rows, yb.to(gl.bfloat16).to(gl.float32), 0.0)
                sq += gl.where(ra < HQ, ya * ya, 0.0) + gl.where(rbb < HQ, yb * yb, 0.0)
                sk += (gl.where((ra >= HQ) & (ra < HQ + KVS), ya * ya, 0.0)
                       + gl.where((rbb >= HQ) & (rbb < HQ + KVS), yb * yb, 0.0))
                gl.store(qkv_ptr + ra, ya.to(gl.bfloat16))
                gl.store(qkv_ptr + rbb, yb.to(gl.bfloat16), mask=rbb < row0 + rows)
            gl.store(ss_ptr + idx * 2, gl.sum(sq, axis=0))
            gl.store(ss_ptr + idx * 2 + 1, gl.sum(sk, axis=0))
        elif op == isa.OP_ROPE_KV:                # + the q/k norm
            failed = op_rope_kv_qkn(layer, row0, splits, pos_ptr, qkv_ptr, q_ptr, kc_ptr,
                                    vc_ptr, cos_ptr, sin_ptr, qn_ptr, kn_ptr, ss_ptr, HQ,
                                    KVS, MAXCTX, eps, ctr_ptr, w0, t0, timeout_ns, failed,
                                    err, i, C, num_warps)
        elif op == isa.OP_ATTN_PARTIAL:
            failed = op_attn_partial(layer, row0, field(hdr, f, isa.ARG), splits,
                                     field(hdr, f, isa.UNIT), pos_ptr, q_ptr, kc_ptr, vc_ptr,
                                     pm_ptr, pl_ptr, po_ptr, SPMAX, MAXCTX, scale, ctr_ptr,
                                     w0, t0, timeout_ns, failed, err, i, C, num_warps)
        elif op == isa.OP_ATTN_MERGE:
            op_attn_merge(row0, splits, field(hdr, f, isa.UNIT), pos_now, pm_ptr, pl_ptr, po_ptr,
                          attn_ptr, SPMAX, D, SB, num_warps)
        elif op == isa.OP_O_PROJ:                 # + residual
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
                ya = row_dot(ring, 2 * s, av, avt, KG, GT, TN_, TK_, l3, al)
                yb = row_dot(ring, 2 * s + 1, av, avt, KG, GT, TN_, TK_, l3, al)
                stage_free(empty, s)
                gl.store(x_ptr + ra, (xa + ya.to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16))
                gl.store(x_ptr + rbb, (xb + yb.to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16),
                         mask=rbb < row0 + rows)
        elif op == isa.OP_ROUTER:                 # rows of the logits
            xn, xnt = rms_vec(x_ptr, gpost_ptr + layer * H, H, eps, offs, offs_t, GT)
            for rb in range(0, rows, 2 * TN_):
                ra = row0 + rb + rows_
                rbb = ra + TN_
                s, t, pend, hph = _take(ready, t, pend, hph, STAGES, HOLD)
                ya = row_dot(ring, 2 * s, xn, xnt, KG, GT, TN_, TK_, l3, al)
                yb = row_dot(ring, 2 * s + 1, xn, xnt, KG, GT, TN_, TK_, l3, al)
                stage_free(empty, s)
                gl.store(rl_ptr + ra, ya.to(gl.bfloat16).to(gl.float32),
                         mask=ra < row0 + rows)
                gl.store(rl_ptr + rbb, yb.to(gl.bfloat16).to(gl.float32),
                         mask=rbb < row0 + rows)
        elif op == isa.OP_TOPK:
            op_topk(layer, pos_now, rl_ptr, ids_ptr, rw_ptr, log_ptr, L, E, EP, TOPK,
                    num_warps)
        elif op == isa.OP_EXPERT_GATE_UP:         # + SwiGLU
            xn, xnt = rms_vec(x_ptr, gpost_ptr + layer * H, H, eps, offs, offs_t, GT)
            for rb in range(0, rows, TN_):
                s = stage_ready(ready, t, STAGES)
                g = row_dot(ring, 2 * s, xn, xnt, KG, GT, TN_, TK_, l3, al)
                u = row_dot(ring, 2 * s + 1, xn, xnt, KG, GT, TN_, TK_, l3, al)
                stage_free(empty, s)
                t += 1
                gb = g.to(gl.bfloat16).to(gl.float32)          # bf16 SwiGLU, as HF
                sg = (gb / (1.0 + gl.exp(-gb))).to(gl.bfloat16).to(gl.float32)
                hv = sg * u.to(gl.bfloat16).to(gl.float32)
                gl.store(h_ptr + row0 + rb + rows_, hv.to(gl.bfloat16))
        elif op == isa.OP_EXPERT_DOWN:            # + residual
            j0 = field(hdr, f, isa.K0) // I
            ns = field(hdr, f, isa.KLEN) // I
            for c in gl.static_range(TOPK * KE // 4):  # every slot's h, 4 K tiles a time
                hv = gl.load(h_ptr + c * 4 * TK_ + offs4, cache_modifier=".cg")
                hs.index(c).store(hv)
            gl.thread_barrier()
            for rb in range(0, rows, TN_):
                r = row0 + rb + rows_d
                xr = gl.load(x_ptr + r, cache_modifier=".cg").to(gl.float32)
                part = gl.zeros([TN_], gl.float32, gl.SliceLayout(1, gl.SliceLayout(2, a4)))
                for jg in range(0, ns, R):            # R slots a stage, in slot order
                    s = stage_ready(ready, t, STAGES)
                    for b in range(gl.minimum(ns - jg, R)):
                        j = j0 + jg + b
                        wj = gl.load(rw_ptr + layer * TOPK + j, cache_modifier=".cg")
                        hj = h_slots.index(j).load(vl4).to(gl.float32)
                        acc = dot_box_k(ring_ek, s * R + b, hj,
                                        gl.zeros([TN_, NW, TK_], gl.float32, a4), True, l4)
                        y = gl.sum(gl.sum(acc, axis=2), axis=1).to(gl.bfloat16).to(gl.float32)
                        part += (y * wj).to(gl.bfloat16).to(gl.float32)
                    stage_free(empty, s)
                    t += 1
                gl.store(x_ptr + r, (xr + part.to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16))
            gl.thread_barrier()                       # hs is rewritten by the next
        elif op == isa.OP_LM_HEAD:                # this instruction's best
            xn, xnt = rms_vec(x_ptr, gfin_ptr, H, eps, offs, offs_t, GT)
            best_v = gl.full([TN_], float("-inf"), gl.float32, rl)
            best_i = gl.full([TN_], 2147483647, gl.int32, rl)
            for rb in range(0, rows, 2 * TN_):
                s, t, pend, hph = _take(ready, t, pend, hph, STAGES, HOLD)
                ya = row_dot(ring, 2 * s, xn, xnt, KG, GT, TN_, TK_, l3, al)
                yb = row_dot(ring, 2 * s + 1, xn, xnt, KG, GT, TN_, TK_, l3, al)
                stage_free(empty, s)
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
        elif op == isa.OP_ARGMAX:
            op_argmax(rows, pos_ptr, plen_ptr, seq_ptr, amax_ptr, val_ptr, idx_ptr, NPB,
                      num_warps)
        elif op == isa.OP_EMBED:
            op_embed(row0, rows, pos_ptr, seq_ptr, emb_ptr, x_ptr, H, EB, num_warps)
        if bump >= 0:                                 # every thread's stores, then release
            gl.thread_barrier()
            gl.atomic_add(ctr_ptr + bump, 1, sem="release", scope="gpu")
        if CLOCK:
            gl.store(clk + i * 4 + 2, now())


@gluon.jit
def moe_step_kernel(prog_ptr, n_instr, d_qkv, d_o, d_rt, d_egu, d_edn, d_lm, acts, cache,
                    parts, token, gains, route, sync, sizes, eps, scale, timeout_ns, n_ctr,
                    C: gl.constexpr, num_warps: gl.constexpr):
    """The whole step of a mixture of experts: ``prog_ptr`` the lists; ``d_*`` the TMA
    descriptors of the stacked weights (QKV, O, router, the experts' gate/up and down,
    LM head); the groups of ``args.py`` (``Acts``, ``Cache``, ``Partials``, ``Token``,
    ``MoEGains``, ``Route``, ``Sync``, ``MoESizes``); ``C`` its ``MoEConsts``."""
    TN_: gl.constexpr = d_qkv.block_type.shape[0]
    TK_: gl.constexpr = d_qkv.block_type.shape[2]
    KB_: gl.constexpr = C.KB_
    KE: gl.constexpr = C.KE
    NS: gl.constexpr = C.STAGES + C.HOLD              # the ring's stages, then the held
    # a stage: two slots of [TN, KB_, TK] (a GEMV pair, or an expert's gate and up rows),
    # or R boxes of [TN, KE, TK] (an expert's down rows, one a (row block, slot))
    ring = gl.allocate_shared_memory(gl.bfloat16, [2 * NS, TN_, KB_, TK_], d_qkv.layout)
    R: gl.constexpr = 2 * KB_ // KE
    ring_e = ring._reinterpret(gl.bfloat16, [NS * R, TN_, KE, TK_], d_edn.layout)
    pl4: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=1,
                                                order=[3, 2, 1, 0])
    ring_ek = ring._reinterpret(gl.bfloat16, [NS * R, TN_, num_warps, KE // num_warps, TK_],
                                pl4)
    vlay: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=1,
                                                 order=[1, 0])
    hs = gl.allocate_shared_memory(gl.bfloat16, [C.TOPK * KE // 4, 4, TK_], vlay)
    ready = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NS, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NS):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize([
        (_compute, (prog_ptr, n_instr, ring, ring_ek, ready, empty, hs, acts, cache, parts,
                    token, gains, route, sync, sizes, eps, scale, timeout_ns, C, TN_, TK_,
                    num_warps)),
        (_loader, (prog_ptr, n_instr, d_qkv, d_o, d_rt, d_egu, d_edn, d_lm, ring, ring_e,
                   ready, empty, route.ids, sync.ctr, sync.err, sync.clk, timeout_ns,
                   sizes.L, sizes.H, sizes.I, sizes.QKV, sizes.E, sizes.V, C))],
        [1], [48])
    reset_on_exit(sync.ctr, n_ctr, C.CTR_BLOCK, num_warps)
