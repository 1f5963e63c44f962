"""A dense model's whole decode step, embedding to argmax, in one persistent Gluon launch
that runs ``schedule.build``'s instruction lists (the lists the CPU VM checks, ``vm.py``).

One CTA an SM walks its own list (``isa`` format). Two partitions share a ring of
``STAGES`` shared-memory stages, each two slots of [TN, KB, TK] weights (``ring.py``):

- the **loader** (one warp) walks the same list and asks the TMA engine for every weight
  row block in order (QKV, O, gate/up, down, LM head), waiting only for a free stage,
  never for data: while the compute partition waits on the rest of the grid, the ring
  fills with what comes next; with ``C.L2PF`` (off by default) it also asks the L2 for
  the gate/up rows past the ring's while it waits there (``l2stage.py``);
- the **compute** partition (``num_warps`` warps) waits on each instruction's counters
  (acquire), computes (RMS + GEMV from the ring; RoPE, attention partials and merges from
  the activations and the KV cache, ``attention.py``), stores, and bumps its counter
  (release).

A GEMV over all of K (QKV, O, gate/up, the LM head) takes one stage a pair of row blocks
(gate/up: a row block's gate rows and up rows), each row whole in one TMA copy; the
down projection one box of KD K tiles a stage. A pair whose second block is past the
instruction's rows asks for rows past the tensor, which the TMA fills with zeros (its
bytes still count on the stage's barrier, no memory is read).

Activations other SMs write in this launch are read with ``.cg`` (from L2, never a stale
L1 line). Waits are bounded (``sync.py``): a stalled CTA records where, runs on without
waiting and still consumes every tile so its loader finishes; the host raises with the
stalled SM named. The last CTA out sets every counter back to zero, so CUDA-graph
replays need no host work.

The host side (weights stacked per kind, the TMA descriptors, buffers) is ``step.py``;
the compile for sm_90 without a GPU is ``aot.py``.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .. import isa
from .attention import op_attn_fused, op_attn_merge, op_attn_partial, op_rope_kv
from .ops import field, op_argmax, op_embed, rms_vec, row_dot
from .ring import (dot_box_k, down_views, fill, fill_one, fill_pair, h_and_barriers,
                   l2_prefetch, l2_ranges)
from .sync import now, reset_on_exit, stage_free, stage_ready, wait_counter


@gluon.jit
def _loader(prog_ptr, n_instr, d_qkv, d_o, d_gu, d_dn, d_dt, d_lm, ring, ring_dn,
            ring_dt, ready, empty, clk_ptr, L, H, I, QKV, V, l2_tab, C: gl.constexpr):
    """Every weight row block of this SM's list, in the order the compute eats them;
    the only wait is for a free stage. CLOCK: when it asked for an instruction's last
    tile. L2PF: at each GATE_UP, before the fill of the first stage the ring has no
    room for while the compute waits on the attention, ask the L2 for the ranges of its
    row of ``l2_tab`` (int64 [P, L, 3, 32], ``l2stage.py``)."""
    NF: gl.constexpr = C.NF
    TAIL: gl.constexpr = C.TAIL
    STAGES: gl.constexpr = C.STAGES
    WIDTH: gl.constexpr = C.WIDTH
    CLOCK: gl.constexpr = C.CLOCK
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
        op = field(hdr, f16, isa.OP)
        layer = field(hdr, f16, isa.LAYER)
        row0 = field(hdr, f16, isa.ROW0)
        rows = field(hdr, f16, isa.ROWS)
        if op == isa.OP_RMS_QKV:
            r = layer * QKV + row0
            for rb in range(0, rows, 2 * TN_):
                t = fill_pair(d_qkv, ring, ready, empty, t, r + rb, L * QKV, r + rows,
                              STAGES)
        elif op == isa.OP_O_PROJ:
            r = layer * H + row0
            for rb in range(0, rows, 2 * TN_):
                t = fill_pair(d_o, ring, ready, empty, t, r + rb, L * H, r + rows,
                              STAGES)
        elif op == isa.OP_GATE_UP:                # gate rows, up rows
            if C.L2PF > 0:                        # its ranges, and where to ask
                l2_row = l2_tab + (gl.program_id(0) * L + layer) * 96
                l2_a, l2_n, l2_at = l2_ranges(l2_row)
            for rb in range(0, rows, TN_):
                if C.L2PF > 0:                    # the stage the ring has no room for:
                    if rb == l2_at * TN_:         # the rows after it, into the L2
                        l2_prefetch(l2_a, l2_n, C.L2PF)
                t = fill(d_gu, ring, ready, empty, t, layer * 2 * I + row0 + rb, 0, 2,
                         I, STAGES)
        elif op == isa.OP_DOWN:                   # all of K a row block
            for rb in range(0, rows, TN_):
                r = layer * H + row0 + rb
                for j in range(NF):
                    t = fill_one(d_dn, ring_dn, ready, empty, t, r, j * KD, STAGES, 1)
                if TAIL > 0:
                    t = fill_one(d_dt, ring_dt, ready, empty, t, r, NF * KD, STAGES,
                                 KD // TAIL)
        elif op == isa.OP_LM_HEAD:
            for rb in range(0, rows, 2 * TN_):
                t = fill_pair(d_lm, ring, ready, empty, t, row0 + rb, V, row0 + rows,
                              STAGES)
        if CLOCK & ((op == isa.OP_RMS_QKV) | (op == isa.OP_O_PROJ)
                    | (op == isa.OP_GATE_UP) | (op == isa.OP_DOWN)
                    | (op == isa.OP_LM_HEAD)):
            gl.store(clk_ptr + (gl.program_id(0) * n_instr + i) * 4 + 3, now())


@gluon.jit
def _compute(prog_ptr, n_instr, ring, ring_dk, ring_tk, ready, empty, vec, acts, cache,
             parts, token, gains, sync, sizes, eps, scale, timeout_ns, C: gl.constexpr,
             KD: gl.constexpr, TN_: gl.constexpr, TK_: gl.constexpr,
             num_warps: gl.constexpr):
    """This SM's list, one instruction at a time: its counter waits, its math from the
    ring's stages (in the loader's order) and the activations, its stores, its bump."""
    x_ptr, qkv_ptr, q_ptr, attn_ptr, h_ptr = acts
    kc_ptr, vc_ptr, cos_ptr, sin_ptr = cache
    pm_ptr, pl_ptr, po_ptr = parts
    val_ptr, idx_ptr, seq_ptr, amax_ptr, pos_ptr, plen_ptr = token
    emb_ptr, gin_ptr, gpost_ptr, gfin_ptr, bqkv_ptr = gains
    ctr_ptr, err_ptr, clk_ptr = sync
    L, H, I, QKV, HQ, KVS, V, SPMAX, MAXCTX = sizes
    KG: gl.constexpr = C.KG
    GT: gl.constexpr = C.GT
    NF: gl.constexpr = C.NF
    TAIL: gl.constexpr = C.TAIL
    STAGES: gl.constexpr = C.STAGES
    WIDTH: gl.constexpr = C.WIDTH
    D: gl.constexpr = C.D
    SB: gl.constexpr = C.SB
    NPB: gl.constexpr = C.NPB
    EB: gl.constexpr = C.EB
    BIAS: gl.constexpr = C.BIAS
    ATT: gl.constexpr = C.ATT
    CLOCK: gl.constexpr = C.CLOCK
    POLL: gl.constexpr = C.POLL
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
        op = field(hdr, f16, isa.OP)
        layer = field(hdr, f16, isa.LAYER)
        row0 = field(hdr, f16, isa.ROW0)
        rows = field(hdr, f16, isa.ROWS)
        w0 = field(hdr, f16, isa.WAIT0)
        t0 = field(hdr, f16, isa.TARGET0)
        w1 = field(hdr, f16, isa.WAIT1)
        t1 = field(hdr, f16, isa.TARGET1)
        bump = field(hdr, f16, isa.BUMP)
        arg = field(hdr, f16, isa.ARG)
        idx = field(hdr, f16, isa.IDX)
        splits = field(hdr, f16, isa.SPLITS)
        unit = field(hdr, f16, isa.UNIT)
        if CLOCK:
            gl.store(clk + i * 4, now())
        # QKV's first bias rows, before its wait; loaded (masked off) for every op, as a
        # value the QKV loop carries must exist before the branch on op
        if BIAS:
            qb = op == isa.OP_RMS_QKV
            bo = bqkv_ptr + layer * QKV + row0
            ba = gl.load(bo + rows_, mask=qb & (rows_ < rows), other=0.0)
            bb = gl.load(bo + TN_ + rows_, mask=qb & (TN_ + rows_ < rows), other=0.0)
        # ROPE_KV and the attention wait in their code (after their early loads)
        if (w0 >= 0) & (op != isa.OP_ROPE_KV) & (op != isa.OP_ATTN_PARTIAL) & (
                op != isa.OP_ATTN_FUSED):
            if failed == 0:
                gl.store(err + 1, w0)
            failed = wait_counter(ctr_ptr + w0, t0, timeout_ns, failed, err, i, POLL)
        if w1 >= 0:
            if failed == 0:
                gl.store(err + 1, w1)
            failed = wait_counter(ctr_ptr + w1, t1, timeout_ns, failed, err, i, POLL)
        if CLOCK:
            gl.store(clk + i * 4 + 1, now())
        if op == isa.OP_RMS_QKV:                  # + bias
            xn, xnt = rms_vec(x_ptr, gin_ptr + layer * H, H, eps, offs, offs_t, GT)
            for rb in range(0, rows, 2 * TN_):
                ra = row0 + rb + rows_
                rbb = ra + TN_
                if BIAS:                              # the next pair's, before these tiles
                    nr = ra + 2 * TN_
                    na = gl.load(bqkv_ptr + layer * QKV + nr, mask=nr < row0 + rows,
                                 other=0.0)
                    nb = gl.load(bqkv_ptr + layer * QKV + nr + TN_,
                                 mask=nr + TN_ < row0 + rows, other=0.0)
                s = stage_ready(ready, t, STAGES)
                ya = row_dot(ring, 2 * s, xn, xnt, KG, GT, TN_, TK_, l3, al)
                yb = row_dot(ring, 2 * s + 1, xn, xnt, KG, GT, TN_, TK_, l3, al)
                stage_free(empty, s)
                t += 1
                if BIAS:
                    ya = ya.to(gl.bfloat16).to(gl.float32) + ba.to(gl.float32)
                    yb = yb.to(gl.bfloat16).to(gl.float32) + bb.to(gl.float32)
                    ba = na
                    bb = nb
                gl.store(qkv_ptr + ra, ya.to(gl.bfloat16))
                gl.store(qkv_ptr + rbb, yb.to(gl.bfloat16), mask=rbb < row0 + rows)
        elif op == isa.OP_ROPE_KV:
            failed = op_rope_kv(layer, row0, pos_ptr, qkv_ptr, q_ptr, kc_ptr, vc_ptr, cos_ptr,
                                sin_ptr, HQ, KVS, MAXCTX, ctr_ptr, w0, t0, timeout_ns, failed,
                                err, i, C, num_warps)
        elif op == isa.OP_ATTN_PARTIAL:
            failed = op_attn_partial(layer, row0, arg, splits, unit, pos_ptr, q_ptr, kc_ptr,
                                     vc_ptr, pm_ptr, pl_ptr, po_ptr, SPMAX, MAXCTX, scale,
                                     ctr_ptr, w0, t0, timeout_ns, failed, err, i, C,
                                     num_warps)
        elif op == isa.OP_ATTN_MERGE:
            op_attn_merge(row0, splits, unit, pos_now, pm_ptr, pl_ptr, po_ptr, attn_ptr, SPMAX,
                          D, SB, num_warps)
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
                s = stage_ready(ready, t, STAGES)
                ya = row_dot(ring, 2 * s, av, avt, KG, GT, TN_, TK_, l3, al)
                yb = row_dot(ring, 2 * s + 1, av, avt, KG, GT, TN_, TK_, l3, al)
                stage_free(empty, s)
                t += 1
                gl.store(x_ptr + ra, (xa + ya.to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16))
                gl.store(x_ptr + rbb, (xb + yb.to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16),
                         mask=rbb < row0 + rows)
        elif op == isa.OP_GATE_UP:                # + SwiGLU
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
        elif op == isa.OP_DOWN:                   # (+ residual), all of K
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
                    s = stage_ready(ready, t, STAGES)
                    hj = v_full.index(j).load(vl4).to(gl.float32)
                    acc = dot_box_k(ring_dk, s, hj, acc, True, l4)
                    stage_free(empty, s)
                    t += 1
                if TAIL > 0:
                    v_tail = vec._reinterpret(gl.bfloat16, [KTV // TAIL, NW, TAIL // NW, TK_],
                                              pl3)
                    s = stage_ready(ready, t, STAGES)
                    ht = v_tail.index(NF * KD // TAIL).load(vl4).to(gl.float32)
                    acc = dot_box_k(ring_tk, s * (KD // TAIL), ht, acc, True, l4)
                    stage_free(empty, s)
                    t += 1
                y = gl.sum(gl.sum(acc, axis=2), axis=1).to(gl.bfloat16).to(gl.float32)
                gl.store(x_ptr + r, (xr + y).to(gl.bfloat16))
            gl.thread_barrier()                       # vec is rewritten by the next DOWN
        elif op == isa.OP_LM_HEAD:                # this instruction's best
            xn, xnt = rms_vec(x_ptr, gfin_ptr, H, eps, offs, offs_t, GT)
            best_v = gl.full([TN_], float("-inf"), gl.float32, rl)
            best_i = gl.full([TN_], 2147483647, gl.int32, rl)
            for rb in range(0, rows, 2 * TN_):
                s = stage_ready(ready, t, STAGES)
                ya = row_dot(ring, 2 * s, xn, xnt, KG, GT, TN_, TK_, l3, al)
                yb = row_dot(ring, 2 * s + 1, xn, xnt, KG, GT, TN_, TK_, l3, al)
                stage_free(empty, s)
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
        elif op == isa.OP_ARGMAX:
            op_argmax(rows, pos_ptr, plen_ptr, seq_ptr, amax_ptr, val_ptr, idx_ptr, NPB,
                      num_warps)
        elif op == isa.OP_EMBED:
            op_embed(row0, rows, pos_ptr, seq_ptr, emb_ptr, x_ptr, H, EB, num_warps)
        elif op == isa.OP_ATTN_FUSED:             # ("two": bumps in its code)
            if ATT < 4:                               # compiled only for fused lists
                failed = op_attn_fused(layer, row0, arg, splits, unit, bump,
                                       field(hdr, f16, isa.BUMP2) if ATT == 2 else -1, pos_ptr,
                                       qkv_ptr, cache, parts, attn_ptr, SPMAX, MAXCTX, HQ,
                                       KVS, scale, ctr_ptr, w0, t0, timeout_ns, failed, err,
                                       i, C, ATT == 2, num_warps)
        # every thread's stores, then release (the "two" form's fused splits bump in
        # their code)
        if (bump >= 0) & ((op != isa.OP_ATTN_FUSED) | (ATT != 2)):
            gl.thread_barrier()
            gl.atomic_add(ctr_ptr + bump, 1, sem="release", scope="gpu")
        if CLOCK:
            gl.store(clk + i * 4 + 2, now())


@gluon.jit
def step_kernel(prog_ptr, n_instr, d_qkv, d_o, d_gu, d_dn, d_dt, d_lm, acts, cache, parts,
                token, gains, sync, sizes, eps, scale, timeout_ns, n_ctr, l2_tab,
                C: gl.constexpr, num_warps: gl.constexpr):
    """The whole step: ``prog_ptr`` the lists (int32 [P, n_instr, WIDTH]); ``d_*`` the TMA
    descriptors of the stacked weights (QKV, O, gate/up, down's full and tail boxes, LM
    head); the groups of ``args.py`` (``Acts``, ``Cache``, ``Partials``, ``Token``,
    ``Gains``, ``Sync``, ``Sizes``); ``l2_tab`` the loaders' L2 table (None, a
    compile-time constant, when ``C.L2PF`` is 0); ``C`` its ``Consts``."""
    TN_: gl.constexpr = d_gu.block_type.shape[0]
    TK_: gl.constexpr = d_gu.block_type.shape[2]
    # a stage: two slots of [TN, KB_, TK] (two row blocks, or gate and up), or the same
    # bytes as one [TN, KD = 2 KB_, TK] down box
    ring = gl.allocate_shared_memory(gl.bfloat16, [2 * C.STAGES, TN_, C.KB_, TK_],
                                     d_gu.layout)
    ring_dn, ring_dt, ring_dk, ring_tk = down_views(ring, d_dn, d_dt, C.STAGES, num_warps)
    KD: gl.constexpr = d_dn.block_type.shape[1]
    vec, ready, empty = h_and_barriers(C.NF, KD, C.TAIL, TK_, C.STAGES)
    gl.warp_specialize([
        (_compute, (prog_ptr, n_instr, ring, ring_dk, ring_tk, ready, empty, vec, acts,
                    cache, parts, token, gains, sync, sizes, eps, scale, timeout_ns, C, KD,
                    TN_, TK_, num_warps)),
        (_loader, (prog_ptr, n_instr, d_qkv, d_o, d_gu, d_dn, d_dt, d_lm, ring, ring_dn,
                   ring_dt, ready, empty, sync.clk, sizes.L, sizes.H, sizes.I, sizes.QKV,
                   sizes.V, l2_tab, C))],
        [1], [48])
    reset_on_exit(sync.ctr, n_ctr, C.CTR_BLOCK, num_warps)
