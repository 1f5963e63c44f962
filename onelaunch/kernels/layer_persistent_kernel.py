"""The persistent layer's kernel: one whole layer in one launch, its phases separated
by grid barriers. The launcher, the phase names and the launch options are
``layer_persistent.py``; the argument groups ``layer_persistent_args.py``.

    phase 0  RMSNorm + QKV (+ bias)          tiles: row tiles of W_qkv
    phase 1  RoPE + KV write                 tiles: Hq + Hkv heads
    phase 2  split-K attention partials      tiles: Hkv x n_splits
    phase 3  merge of the splits             tiles: Hq heads
    phase 4  O-projection + residual         tiles: row tiles of W_o
    dense:
    phase 5  RMSNorm + gate/up + SwiGLU      tiles: channel tiles of W_gate_up
    phase 6  down + residual                 tiles: row tiles x splits of K (last arrival)
    mixture of experts (MOE, streamed only):
    phase 5  RMSNorm + router logits         tiles: row tiles of W_router
    phase 6  top-k (every program), experts' gate/up    tiles: slots x channel tiles
    phase 7  experts' down, weighted, + residual        tiles: row tiles (all slots each)

A fixed grid of resident programs (``launch_cooperative_grid``: all of them on the GPU at
once, which a grid barrier needs) walks each phase's tiles, and a grid barrier
(``grid_barrier``) separates two phases. A GEMV phase runs in one of two ways (STAGES):

* STAGES 0, the register ring: the unfused kernels' device functions (``rms_qkv_tile``,
  ``o_proj_tile``, ``gate_up_tile``, ``down_tile``) tile by tile (``for t in range(pid,
  n, P)``), each program keeping a few weight tiles requested in registers. Before a
  barrier each program requests the first tiles of the next phase (``NEXT``), as a PDL
  kernel requests them before ``gdc_wait``.
* STAGES > 0, streamed: one flat loop over (row tile, K tile) per phase
  (``_common.stream_gemv``; ``moe_experts.stream_experts_*``) that Triton's pipeliner
  turns into asynchronous copies into shared memory, STAGES - 1 tiles ahead: more bytes
  in flight per program than registers can hold (measured in ``persistent_stream.json``).
  The pipeline starts after each barrier.

The barrier (``grid_barrier``): every thread fences its writes, the program arrives on a
counter with a release atomic and spins with acquire atomics until every program has
arrived at that barrier (targets P, 2P, ... within one launch); after the last barrier of
the launch each program bumps an exit counter, and the last one resets both counters, so
the next launch (the next layer, a CUDA-graph replay) finds zeros with no host reset. The
next launch touches the counters only after its ``gdc_wait``, when this grid has finished.

The phases a launch runs are the constexpr range [FIRST, LAST].
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._common import pdl_wait, rms_rstd, row_tiles, stream_gemv, thread_fence
from .attention_splitk import (live_splits, partial_early, partial_rest, reduce_head,
                               split_range)
from .down_residual import down_first, down_tile
from .moe_experts import stream_experts_down, stream_experts_gate_up
from .moe_router import route
from .o_proj_residual import o_proj_tile
from .rms_gate_up_swiglu import gate_up_first, gate_up_tile
from .rms_qkv import rms_qkv_tile
from .rope_attention_partial import rope_partial
from .rope_kv_write import rope_kv_head


@triton.jit
def stamp(clk_ptr, slot, CLOCK: tl.constexpr):
    """With CLOCK (a measurement, never the engine's default): the GPU's global clock in
    ns (``%globaltimer``) into this program's ``slot``."""
    if CLOCK:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [],
                                      dtype=tl.int64, is_pure=False, pack=1)
        tl.store(clk_ptr + slot, t)


@triton.jit
def share_early(rope, att, pos, t, A: tl.constexpr):
    """Attention work item ``t`` (kv head t % HKV, split t // HKV): its live share
    [start, end) and its first tile of keys and values older than pos, which may be
    requested before any barrier (``partial_early``). ``rope``, ``att``: the kernel's
    ``Rope`` and ``Attn`` groups; ``A`` its ``Heads``."""
    start, end = split_range(pos, t // rope.HKV, att.n_share, A.CHUNK)
    k0, v0, tm0 = partial_early(rope.kc, rope.vc, pos, t % rope.HKV, start, end,
                                rope.stride_h, rope.stride_t, A.D, A.BLOCK_DA, A.BLOCK_T)
    return start, end, k0, v0, tm0


@triton.jit
def qkv_tiles(qkv, t, T: tl.constexpr):
    """The register ring's first weight tiles of W_qkv's row tile ``t``."""
    return row_tiles(qkv.w, qkv.stride, qkv.N, t, 0, qkv.H, T.BN_QKV, T.BK_QKV, T.PF_QKV)


@triton.jit
def o_tiles(oproj, H, t, T: tl.constexpr):
    """The register ring's first weight tiles of W_o's row tile ``t``."""
    return row_tiles(oproj.w, oproj.stride, H, t, 0, oproj.K, T.BN_O, T.BK_O, T.PF_O)


@triton.jit
def gu_tiles(gu, H, t, T: tl.constexpr):
    """The register ring's first weight tiles of W_gate_up's channel tile ``t`` (its
    gate rows and its up rows)."""
    return gate_up_first(gu.w, gu.stride, gu.I, H, t, T.BN_GU, T.BK_GU, T.PF_GU)


@triton.jit
def grid_barrier(bar_ptr, target, n_progs, RESET: tl.constexpr, FENCE: tl.constexpr,
                 clk_ptr, PHASE: tl.constexpr, CLOCK: tl.constexpr):
    """Wait until ``target`` arrivals (every program's, at this and earlier barriers of
    the launch) are counted in bar[0]. With RESET (the launch's last barrier) each
    program then bumps bar[1], and the last one resets both to zero. With CLOCK the
    program stamps its arrival (the end of phase PHASE - 1) and its leaving (the start
    of PHASE): see ``measure.profile.clock_phases``."""
    thread_fence(FENCE)                # this thread's writes are visible GPU-wide ...
    tl.debug_barrier()                 # ... and every thread's, before the arrival
    stamp(clk_ptr, 2 * PHASE - 1, CLOCK)
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    # no thread reads the phase's inputs before the spin ends
    tl.debug_barrier()
    thread_fence(FENCE)
    stamp(clk_ptr, 2 * PHASE, CLOCK)
    # every program has left the spin once bar[1] is full
    if RESET:
        done = tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if done == n_progs - 1:
            tl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")
            tl.atomic_xchg(bar_ptr + 1, 0, sem="relaxed", scope="gpu")


@triton.jit
def _layer_persistent_kernel(
        qkv, rope, att, oproj, gu, dn,   # phases 0-6: Qkv, Rope, Attn, OProj, GateUp, Down
        bar_ptr,                         # int32 [2]: arrivals, exits (zeros between launches)
        rt, ex,                          # the MoE phases 5-7 (M.MOE): Router, Experts
        clock_ptr,                       # CLOCK: int64 [P, SLOTS] (profile.clock_phases)
        A: tl.constexpr, T: tl.constexpr, M: tl.constexpr,   # Heads, Tiles, MoETiles
        FIRST: tl.constexpr, LAST: tl.constexpr,             # the phases this launch runs
        NEXT: tl.constexpr, USE_PDL: tl.constexpr, FENCE: tl.constexpr,
        STAGES: tl.constexpr, CLOCK: tl.constexpr, SLOTS: tl.constexpr,
        FOLD: tl.constexpr, SKIP: tl.constexpr):
    """The layer's phases FIRST..LAST. The groups are ``layer_persistent_args``'
    NamedTuples (one kernel parameter a field, in order), read by field."""
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    clk = clock_ptr + pid * SLOTS      # slot 2k: phase k starts here, 2k + 1: it ends
    # STAGES > 0: the GEMV phases stream through shared memory (stream_gemv), whose
    # pipeline starts after the barrier; nothing of theirs is requested before it
    RING: tl.constexpr = STAGES == 0
    AHEAD: tl.constexpr = NEXT and RING
    n_qkv = tl.cdiv(qkv.N, T.BN_QKV)
    n_attn = rope.HKV * att.n_splits
    n_o = tl.cdiv(qkv.H, T.BN_O)
    n_gu = tl.cdiv(gu.I, T.BN_GU)
    n_dn_rows = tl.cdiv(qkv.H, T.BN_DN)
    n_dn = n_dn_rows * T.SPLIT_K
    # pos before the wait: the previous step's head kernel wrote it, and it has finished
    # (a kernel starts only after every program of the one before passed its wait)
    pos = tl.load(rope.pos)

    # ---- before the PDL wait: the first weight tiles of the launch's first phase -----
    if FIRST == 0 and RING:
        a0, a1, a2, a3 = qkv_tiles(qkv, pid, T)
    if FIRST == 2:
        start, end, k0, v0, tm0 = share_early(rope, att, pos, pid, A)
    if FIRST == 4 and RING:
        o0, o1, o2, o3 = o_tiles(oproj, qkv.H, pid, T)
    if FIRST == 5 and RING:
        g0, g1, g2, g3, u0, u1, u2, u3 = gu_tiles(gu, qkv.H, pid, T)
    if FIRST == 6 and RING:
        d0, d1, d2, d3 = down_first(dn.w, dn.stride, qkv.H, gu.I, dn.k_per_split,
                                    pid % n_dn_rows, pid // n_dn_rows, T.BN_DN, T.BK_DN,
                                    T.PF_DN)
    pdl_wait(USE_PDL)
    stamp(clk, 2 * FIRST, CLOCK)

    # ---- phase 0: RMSNorm + QKV (+ bias) ---------------------------------------------
    if FIRST <= 0 and LAST >= 0:
        rstd = rms_rstd(qkv.x, qkv.H, qkv.eps, T.BK_QKV)
        if STAGES > 0:
            stream_gemv(qkv.w, qkv.stride, qkv.N, qkv.H, qkv.x, qkv.gin, rstd, qkv.out, qkv.b, pid,
                        P, 0, True, A.HAS_BIAS, FENCE, T.BN_QKV, T.BK_QKV, STAGES)
        else:
            for t in range(pid, n_qkv, P):
                rms_qkv_tile(qkv.x, qkv.gin, qkv.w, qkv.b, qkv.out, qkv.N, qkv.H, rstd, qkv.stride,
                             t, a0, a1, a2, a3, A.HAS_BIAS, T.BN_QKV, T.BK_QKV, T.PF_QKV)
                a0, a1, a2, a3 = qkv_tiles(qkv, t + P, T)
    if FIRST <= 0 and LAST >= 1:       # RoPE reads no weights: nothing to request early
        # (folded: attention's keys and values older than pos)
        if FOLD and NEXT and LAST >= 2:
            start, end, k0, v0, tm0 = share_early(rope, att, pos, pid, A)
        grid_barrier(bar_ptr, (1 - FIRST) * P, P, LAST == 1, FENCE, clk, 1, CLOCK)

    # ---- phase 1: RoPE + KV write (FOLD: inside phase 2, no barrier between) ---------
    if FIRST <= 1 and LAST >= 1 and not FOLD:
        for t in range(pid, rope.HQ + rope.HKV, P):
            rope_kv_head(t, pos, qkv.out, rope.q, rope.kc, rope.vc, rope.cos, rope.sin, rope.qn,
                         rope.kn, qkv.out, qkv.eps, 0, 0, rope.stride_h, rope.stride_t, rope.HQ,
                         rope.HKV, A.D, A.BLOCK_D, A.QK_NORM, False, A.BLOCK_R)
    if FOLD and FIRST <= 1 and LAST >= 2:
        stamp(clk, 3, CLOCK)           # (phase 1 is empty: it ends where it starts)
        stamp(clk, 4, CLOCK)
        if not NEXT or FIRST == 1:
            start, end, k0, v0, tm0 = share_early(rope, att, pos, pid, A)
    if not FOLD and FIRST <= 1 and LAST >= 2:   # keys and values older than pos: early
        if NEXT:
            start, end, k0, v0, tm0 = share_early(rope, att, pos, pid, A)
        grid_barrier(bar_ptr, (2 - FIRST) * P, P, LAST == 2, FENCE, clk, 2, CLOCK)
        if not NEXT:
            start, end, k0, v0, tm0 = share_early(rope, att, pos, pid, A)

    # ---- phase 2: split-K attention partials -----------------------------------------
    if FIRST <= 2 and LAST >= 2:
        for t in range(pid, n_attn, P):
            if start < end and FOLD:
                rope_partial(qkv.out, rope.kc, rope.vc, rope.cos, rope.sin, att.po, att.pm, att.pl,
                             pos, t % rope.HKV, t // rope.HKV, start, end, k0, v0, tm0,
                             rope.stride_h, rope.stride_t, att.n_splits, att.scale, rope.HQ,
                             rope.HKV, A.GROUP, A.GROUP_PAD, A.D, A.BLOCK_DA, A.BLOCK_T, A.DOT_F32)
            if start < end and not FOLD:
                partial_rest(rope.q, rope.kc, rope.vc, att.po, att.pm, att.pl, pos, t % rope.HKV,
                             t // rope.HKV, start, end, k0, v0, tm0, rope.stride_h, rope.stride_t,
                             att.n_splits, att.scale, A.GROUP, A.GROUP_PAD, A.D, A.BLOCK_DA,
                             A.BLOCK_T, A.DOT_F32)
            start, end, k0, v0, tm0 = share_early(rope, att, pos, t + P, A)
    # the merge is short: W_o's tiles are requested here
    if FIRST <= 2 and LAST >= 3:
        if AHEAD:
            o0, o1, o2, o3 = o_tiles(oproj, qkv.H, pid, T)
        grid_barrier(bar_ptr, (3 - FIRST - SKIP) * P, P, LAST == 3, FENCE, clk, 3, CLOCK)

    # ---- phase 3: merge of the splits ------------------------------------------------
    if FIRST <= 3 and LAST >= 3:
        n_valid = live_splits(pos, att.n_share, A.CHUNK)
        for t in range(pid, rope.HQ, P):
            reduce_head(att.po, att.pm, att.pl, att.out, t, att.n_splits, n_valid, A.D, A.BLOCK_D,
                        A.BLOCK_S, A.BLOCK_M, True)
    if FIRST <= 3 and LAST >= 4:
        if FIRST == 3 and AHEAD:
            o0, o1, o2, o3 = o_tiles(oproj, qkv.H, pid, T)
        grid_barrier(bar_ptr, (4 - FIRST - SKIP) * P, P, LAST == 4, FENCE, clk, 4, CLOCK)
        if not NEXT and RING:
            o0, o1, o2, o3 = o_tiles(oproj, qkv.H, pid, T)

    # ---- phase 4: O-projection + residual --------------------------------------------
    if FIRST <= 4 and LAST >= 4:
        if STAGES > 0:
            stream_gemv(oproj.w, oproj.stride, qkv.H, oproj.K, att.out, att.out, 1.0, qkv.x, qkv.x,
                        pid, P, 1, False, False, FENCE, T.BN_O, T.BK_O, STAGES)
        else:
            for t in range(pid, n_o, P):
                o_proj_tile(att.out, oproj.w, qkv.x, qkv.x, qkv.x, qkv.H, oproj.K, oproj.stride, t,
                            o0, o1, o2, o3, False, False, 1, FENCE, T.BN_O, T.BK_O, T.PF_O)
                o0, o1, o2, o3 = o_tiles(oproj, qkv.H, t + P, T)
    if FIRST <= 4 and LAST >= 5:
        if AHEAD:
            g0, g1, g2, g3, u0, u1, u2, u3 = gu_tiles(gu, qkv.H, pid, T)
        grid_barrier(bar_ptr, (5 - FIRST - SKIP) * P, P, LAST == 5, FENCE, clk, 5, CLOCK)
        if not NEXT and RING:
            g0, g1, g2, g3, u0, u1, u2, u3 = gu_tiles(gu, qkv.H, pid, T)

    # ---- phase 5: RMSNorm + gate/up + SwiGLU (MoE: the router's logits) --------------
    if M.MOE and FIRST <= 5 and LAST >= 5:
        rstd_r = rms_rstd(qkv.x, qkv.H, qkv.eps, M.BK_R)
        stream_gemv(rt.w, rt.stride, rt.E, qkv.H, qkv.x, gu.gpost, rstd_r, rt.logits, rt.logits,
                    pid, P, 0, True, False, FENCE, M.BN_R, M.BK_R, STAGES)
    if not M.MOE and FIRST <= 5 and LAST >= 5:
        rstd2 = rms_rstd(qkv.x, qkv.H, qkv.eps, T.BK_GU)
        if STAGES > 0:
            stream_gemv(gu.w, gu.stride, gu.I, qkv.H, qkv.x, gu.gpost, rstd2, gu.h, gu.h, pid, P, 2,
                        True, False, FENCE, T.BN_GU, T.BK_GU, STAGES)
        else:
            for t in range(pid, n_gu, P):
                gate_up_tile(qkv.x, gu.gpost, gu.w, gu.h, gu.I, qkv.H, rstd2, gu.stride, t, g0, g1,
                             g2, g3, u0, u1, u2, u3, T.BN_GU, T.BK_GU, T.PF_GU)
                g0, g1, g2, g3, u0, u1, u2, u3 = gu_tiles(gu, qkv.H, t + P, T)
    if FIRST <= 5 and LAST >= 6:
        if AHEAD:
            d0, d1, d2, d3 = down_first(dn.w, dn.stride, qkv.H, gu.I, dn.k_per_split,
                                    pid % n_dn_rows, pid // n_dn_rows, T.BN_DN, T.BK_DN,
                                    T.PF_DN)
        grid_barrier(bar_ptr, (6 - FIRST - SKIP) * P, P, LAST == 6, FENCE, clk, 6, CLOCK)
        if not NEXT and RING:
            d0, d1, d2, d3 = down_first(dn.w, dn.stride, qkv.H, gu.I, dn.k_per_split,
                                    pid % n_dn_rows, pid // n_dn_rows, T.BN_DN, T.BK_DN,
                                    T.PF_DN)

    # ---- phase 6: down + residual (the last split to arrive adds the row block) ------
    # (MoE: every program routes from the logits, one stores; the experts' gate/up)
    if M.MOE and FIRST <= 6 and LAST >= 6:
        ids, wts = route(rt.logits, rt.ids, rt.wts, rt.log, pos, rt.log_row, rt.log_offset, rt.E,
                         pid == 0, M.TOP_K, M.TOP_KP, M.BLOCK_E)
        rstd_r = rms_rstd(qkv.x, qkv.H, qkv.eps, M.BK_R)
        stream_experts_gate_up(ex.w_gu, ex.stride_gu_e, ex.stride_gu_n, ids, ex.I, qkv.H, qkv.x,
                               gu.gpost, rstd_r, ex.h, pid, P, M.TOP_K, M.TOP_KP, M.BN_EGU,
                               M.BK_EGU, STAGES)
    if M.MOE and FIRST <= 6 and LAST >= 7:
        grid_barrier(bar_ptr, (7 - FIRST - SKIP) * P, P, LAST == 7, FENCE, clk, 7, CLOCK)
    # ---- phase 7 (MoE): the experts' down, routing weights, residual -----------------
    if M.MOE and FIRST <= 7 and LAST >= 7:
        stream_experts_down(ex.w_dn, ex.stride_dn_e, ex.stride_dn_n, rt.ids, rt.wts, qkv.H, ex.I,
                            ex.h, qkv.x, pid, P, FENCE, M.TOP_K, M.TOP_KP, M.BN_EDN, M.BK_EDN,
                            STAGES)
    if not M.MOE and FIRST <= 6 and LAST >= 6:
        # whole rows (SPLIT_K 1): no last arrival in the loop
        if STAGES > 0:
            stream_gemv(dn.w, dn.stride, qkv.H, gu.I, gu.h, gu.h, 1.0, qkv.x, qkv.x, pid, P, 1,
                        False, False, FENCE, T.BN_DN, T.BK_DN, STAGES)
        else:
            for t in range(pid, n_dn, P):
                down_tile(gu.h, dn.w, qkv.x, dn.scratch, dn.counter, qkv.x, qkv.x, qkv.H, gu.I,
                          dn.k_per_split, dn.stride, t % n_dn_rows, t // n_dn_rows, d0, d1, d2, d3,
                          T.SPLIT_K, FENCE, False, False, 1, T.BN_DN, T.BK_DN, T.PF_DN)
                d0, d1, d2, d3 = down_first(dn.w, dn.stride, qkv.H, gu.I, dn.k_per_split,
                                            (t + P) % n_dn_rows, (t + P) // n_dn_rows, T.BN_DN,
                                            T.BK_DN, T.PF_DN)
    stamp(clk, 2 * LAST + 1, CLOCK)
