"""One whole layer in one launch: a persistent kernel with grid barriers.

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

Either way the sums and roundings are the unfused plan's at the same tiles, so the
layer's bits are those of an unfused engine at ``plan.persistent_cfgs``. The launch
itself is a PDL launch on Hopper, so layer boundaries overlap too.

The barrier (``grid_barrier``): every thread fences its writes, the program arrives on a
counter with a release atomic and spins with acquire atomics until every program has
arrived at that barrier (targets P, 2P, ... within one launch); after the last barrier of
the launch each program bumps an exit counter, and the last one resets both counters, so
the next launch (the next layer, a CUDA-graph replay) finds zeros with no host reset. The
next launch touches the counters only after its ``gdc_wait``, when this grid has finished.

Phases are a constexpr range [FIRST, LAST]. On the GPU one launch runs 0..6 (MoE 0..7).
Triton's interpreter runs programs one after another, where a spinning barrier would
never end, so there the launcher issues one launch per phase (no barrier), running the
same code; with a grid of one program the interpreter runs the one launch, barriers and
the requests before them included (a lone program never waits for another).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..options import PersistentOptions
from . import config
from ._common import pdl_wait, rms_rstd, row_tiles, stream_gemv, thread_fence
from .attention_splitk import (BLOCK_S, block_m, live_share, live_splits, partial_early,
                               partial_rest, reduce_head, split_range)
from .down_residual import down_first, down_split, down_tile
from .moe_experts import stream_experts_down, stream_experts_gate_up
from .moe_router import route
from .o_proj_residual import o_proj_tile
from .rms_gate_up_swiglu import gate_up_first, gate_up_tile
from .rms_qkv import rms_qkv_tile
from .rope_attention_partial import rope_partial
from .rope_kv_write import rope_kv_head

PHASES = ("rms_qkv", "rope_kv_write", "attention_partial", "attention_reduce", "o_proj_residual",
          "rms_gate_up_swiglu", "down_residual")
LAST_PHASE = len(PHASES) - 1
MOE_PHASES = PHASES[:5] + ("router_logits", "route_experts_gate_up", "experts_down")


@triton.jit
def stamp(clk_ptr, slot, CLOCK: tl.constexpr):
    """With CLOCK (a measurement, never the engine's default): the GPU's global clock in
    ns (``%globaltimer``) into this program's ``slot``."""
    if CLOCK:
        t = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [],
                                      dtype=tl.int64, is_pure=False, pack=1)
        tl.store(clk_ptr + slot, t)


@triton.jit
def share_early(k_cache_ptr, v_cache_ptr, pos, t, n_share, stride_c_h, stride_c_t,
                HKV: tl.constexpr, CHUNK: tl.constexpr, D: tl.constexpr,
                BLOCK_DA: tl.constexpr, BLOCK_T: tl.constexpr):
    """Attention work item ``t`` (kv head t % HKV, split t // HKV): its live share
    [start, end) and its first tile of keys and values older than pos, which may be
    requested before any barrier (``partial_early``)."""
    start, end = split_range(pos, t // HKV, n_share, CHUNK)
    k0, v0, tm0 = partial_early(k_cache_ptr, v_cache_ptr, pos, t % HKV, start, end,
                                stride_c_h, stride_c_t, D, BLOCK_DA, BLOCK_T)
    return start, end, k0, v0, tm0


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
        # phase 0: RMSNorm + QKV
        x_ptr, gin_ptr, w_qkv_ptr, b_qkv_ptr, qkv_ptr, N_QKV, H, eps, stride_qkv,
        # phase 1: RoPE + KV write
        q_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, pos_ptr, qn_ptr, kn_ptr,
        stride_c_h, stride_c_t, HQ, HKV,
        # phases 2-3: split-K attention
        part_o_ptr, part_m_ptr, part_l_ptr, attn_ptr, n_splits, n_share, scale,
        # phase 4: O-projection + residual
        w_o_ptr, K_O, stride_o,
        # phase 5: RMSNorm + gate/up + SwiGLU
        gpost_ptr, w_gu_ptr, h_ptr, I, stride_gu,
        # phase 6: down + residual
        w_dn_ptr, scratch_ptr, counter_ptr, k_per_split, stride_dn,
        bar_ptr,
        # MoE (MOE): router, then the chosen experts (phases 5-7)
        w_r_ptr, stride_r, E, logits_ptr, ids_ptr, wts_ptr, log_ptr, log_row,
        log_offset,
        w_egu_ptr, stride_egu_e, stride_egu_n, I_E, w_edn_ptr, stride_edn_e,
        stride_edn_n,
        eh_ptr,
        # CLOCK: the programs' stamps, [P, SLOTS] int64 (read by profile.clock_phases)
        clock_ptr,
        HAS_BIAS: tl.constexpr, QK_NORM: tl.constexpr, D: tl.constexpr,
        BLOCK_D: tl.constexpr,
        BLOCK_R: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
        BLOCK_DA: tl.constexpr, CHUNK: tl.constexpr, BLOCK_T: tl.constexpr,
        DOT_F32: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr,
        BN_QKV: tl.constexpr, BK_QKV: tl.constexpr, PF_QKV: tl.constexpr,
        BN_O: tl.constexpr, BK_O: tl.constexpr, PF_O: tl.constexpr,
        BN_GU: tl.constexpr, BK_GU: tl.constexpr, PF_GU: tl.constexpr,
        BN_DN: tl.constexpr, BK_DN: tl.constexpr, PF_DN: tl.constexpr,
        SPLIT_K: tl.constexpr,
        FIRST: tl.constexpr, LAST: tl.constexpr, NEXT: tl.constexpr,
        USE_PDL: tl.constexpr,
        FENCE: tl.constexpr, STAGES: tl.constexpr, MOE: tl.constexpr,
        TOP_K: tl.constexpr,
        TOP_KP: tl.constexpr, BLOCK_E: tl.constexpr, BN_R: tl.constexpr,
        BK_R: tl.constexpr,
        BN_EGU: tl.constexpr, BK_EGU: tl.constexpr, BN_EDN: tl.constexpr,
        BK_EDN: tl.constexpr, CLOCK: tl.constexpr, SLOTS: tl.constexpr,
        FOLD: tl.constexpr, SKIP: tl.constexpr):
    pid = tl.program_id(0)
    P = tl.num_programs(0)
    clk = clock_ptr + pid * SLOTS      # slot 2k: phase k starts here, 2k + 1: it ends
    # STAGES > 0: the GEMV phases stream through shared memory (stream_gemv), whose
    # pipeline starts after the barrier; nothing of theirs is requested before it
    RING: tl.constexpr = STAGES == 0
    AHEAD: tl.constexpr = NEXT and RING
    n_qkv = tl.cdiv(N_QKV, BN_QKV)
    n_attn = HKV * n_splits
    n_o = tl.cdiv(H, BN_O)
    n_gu = tl.cdiv(I, BN_GU)
    n_dn_rows = tl.cdiv(H, BN_DN)
    n_dn = n_dn_rows * SPLIT_K
    # pos before the wait: the previous step's head kernel wrote it, and it has finished
    # (a kernel starts only after every program of the one before passed its wait)
    pos = tl.load(pos_ptr)

    # ---- before the PDL wait: the first weight tiles of the launch's first phase -----
    if FIRST == 0 and RING:
        a0, a1, a2, a3 = row_tiles(w_qkv_ptr, stride_qkv, N_QKV, pid, 0, H, BN_QKV,
                                   BK_QKV, PF_QKV)
    if FIRST == 2:
        start, end, k0, v0, tm0 = share_early(k_cache_ptr, v_cache_ptr, pos, pid,
                                              n_share, stride_c_h, stride_c_t, HKV,
                                              CHUNK, D, BLOCK_DA, BLOCK_T)
    if FIRST == 4 and RING:
        o0, o1, o2, o3 = row_tiles(w_o_ptr, stride_o, H, pid, 0, K_O, BN_O, BK_O, PF_O)
    if FIRST == 5 and RING:
        g0, g1, g2, g3, u0, u1, u2, u3 = gate_up_first(w_gu_ptr, stride_gu, I, H, pid,
                                                       BN_GU, BK_GU,
                                                       PF_GU)
    if FIRST == 6 and RING:
        d0, d1, d2, d3 = down_first(w_dn_ptr, stride_dn, H, I, k_per_split,
                                    pid % n_dn_rows,
                                    pid // n_dn_rows, BN_DN, BK_DN, PF_DN)
    pdl_wait(USE_PDL)
    stamp(clk, 2 * FIRST, CLOCK)

    # ---- phase 0: RMSNorm + QKV (+ bias) ---------------------------------------------
    if FIRST <= 0 and LAST >= 0:
        rstd = rms_rstd(x_ptr, H, eps, BK_QKV)
        if STAGES > 0:
            stream_gemv(w_qkv_ptr, stride_qkv, N_QKV, H, x_ptr, gin_ptr, rstd, qkv_ptr,
                        b_qkv_ptr,
                        pid, P, 0, True, HAS_BIAS, FENCE, BN_QKV, BK_QKV, STAGES)
        else:
            for t in range(pid, n_qkv, P):
                rms_qkv_tile(x_ptr, gin_ptr, w_qkv_ptr, b_qkv_ptr, qkv_ptr, N_QKV, H,
                             rstd, stride_qkv, t,
                             a0, a1, a2, a3, HAS_BIAS, BN_QKV, BK_QKV, PF_QKV)
                a0, a1, a2, a3 = row_tiles(w_qkv_ptr, stride_qkv, N_QKV, t + P, 0, H,
                                           BN_QKV, BK_QKV,
                                           PF_QKV)
    if FIRST <= 0 and LAST >= 1:       # RoPE reads no weights: nothing to request early
        # (folded: attention's keys and values older than pos)
        if FOLD and NEXT and LAST >= 2:
            start, end, k0, v0, tm0 = share_early(k_cache_ptr, v_cache_ptr, pos, pid,
                                                  n_share, stride_c_h, stride_c_t, HKV,
                                                  CHUNK, D, BLOCK_DA, BLOCK_T)
        grid_barrier(bar_ptr, (1 - FIRST) * P, P, LAST == 1, FENCE, clk, 1, CLOCK)

    # ---- phase 1: RoPE + KV write (FOLD: inside phase 2, no barrier between) ---------
    if FIRST <= 1 and LAST >= 1 and not FOLD:
        for t in range(pid, HQ + HKV, P):
            rope_kv_head(t, pos, qkv_ptr, q_ptr, k_cache_ptr, v_cache_ptr, cos_ptr,
                         sin_ptr,
                         qn_ptr, kn_ptr, qkv_ptr, eps, 0, 0, stride_c_h, stride_c_t,
                         HQ, HKV, D,
                         BLOCK_D, QK_NORM, False, BLOCK_R)
    if FOLD and FIRST <= 1 and LAST >= 2:
        stamp(clk, 3, CLOCK)           # (phase 1 is empty: it ends where it starts)
        stamp(clk, 4, CLOCK)
        if not NEXT or FIRST == 1:
            start, end, k0, v0, tm0 = share_early(k_cache_ptr, v_cache_ptr, pos, pid,
                                                  n_share, stride_c_h, stride_c_t, HKV,
                                                  CHUNK, D, BLOCK_DA, BLOCK_T)
    if not FOLD and FIRST <= 1 and LAST >= 2:   # keys and values older than pos: early
        if NEXT:
            start, end, k0, v0, tm0 = share_early(k_cache_ptr, v_cache_ptr, pos, pid,
                                                  n_share, stride_c_h, stride_c_t, HKV,
                                                  CHUNK, D, BLOCK_DA, BLOCK_T)
        grid_barrier(bar_ptr, (2 - FIRST) * P, P, LAST == 2, FENCE, clk, 2, CLOCK)
        if not NEXT:
            start, end, k0, v0, tm0 = share_early(k_cache_ptr, v_cache_ptr, pos, pid,
                                                  n_share, stride_c_h, stride_c_t, HKV,
                                                  CHUNK, D, BLOCK_DA, BLOCK_T)

    # ---- phase 2: split-K attention partials -----------------------------------------
    if FIRST <= 2 and LAST >= 2:
        for t in range(pid, n_attn, P):
            if start < end and FOLD:
                rope_partial(qkv_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr,
                             part_o_ptr,
                             part_m_ptr, part_l_ptr, pos, t % HKV, t // HKV, start,
                             end, k0, v0,
                             tm0, stride_c_h, stride_c_t, n_splits, scale, HQ, HKV,
                             GROUP,
                             GROUP_PAD, D, BLOCK_DA, BLOCK_T, DOT_F32)
            if start < end and not FOLD:
                partial_rest(q_ptr, k_cache_ptr, v_cache_ptr, part_o_ptr, part_m_ptr,
                             part_l_ptr, pos,
                             t % HKV, t // HKV, start, end, k0, v0, tm0, stride_c_h,
                             stride_c_t,
                             n_splits, scale, GROUP, GROUP_PAD, D, BLOCK_DA, BLOCK_T,
                             DOT_F32)
            start, end, k0, v0, tm0 = share_early(k_cache_ptr, v_cache_ptr, pos, t + P,
                                                  n_share, stride_c_h, stride_c_t, HKV,
                                                  CHUNK, D, BLOCK_DA, BLOCK_T)
    # the merge is short: W_o's tiles are requested here
    if FIRST <= 2 and LAST >= 3:
        if AHEAD:
            o0, o1, o2, o3 = row_tiles(w_o_ptr, stride_o, H, pid, 0, K_O, BN_O, BK_O,
                                       PF_O)
        grid_barrier(bar_ptr, (3 - FIRST - SKIP) * P, P, LAST == 3, FENCE, clk, 3,
                     CLOCK)

    # ---- phase 3: merge of the splits ------------------------------------------------
    if FIRST <= 3 and LAST >= 3:
        n_valid = live_splits(pos, n_share, CHUNK)
        for t in range(pid, HQ, P):
            reduce_head(part_o_ptr, part_m_ptr, part_l_ptr, attn_ptr, t, n_splits,
                        n_valid, D,
                        BLOCK_D, BLOCK_S, BLOCK_M, True)
    if FIRST <= 3 and LAST >= 4:
        if FIRST == 3 and AHEAD:
            o0, o1, o2, o3 = row_tiles(w_o_ptr, stride_o, H, pid, 0, K_O, BN_O, BK_O,
                                       PF_O)
        grid_barrier(bar_ptr, (4 - FIRST - SKIP) * P, P, LAST == 4, FENCE, clk, 4,
                     CLOCK)
        if not NEXT and RING:
            o0, o1, o2, o3 = row_tiles(w_o_ptr, stride_o, H, pid, 0, K_O, BN_O, BK_O,
                                       PF_O)

    # ---- phase 4: O-projection + residual --------------------------------------------
    if FIRST <= 4 and LAST >= 4:
        if STAGES > 0:
            stream_gemv(w_o_ptr, stride_o, H, K_O, attn_ptr, attn_ptr, 1.0, x_ptr,
                        x_ptr, pid, P,
                        1, False, False, FENCE, BN_O, BK_O, STAGES)
        else:
            for t in range(pid, n_o, P):
                o_proj_tile(attn_ptr, w_o_ptr, x_ptr, x_ptr, x_ptr, H, K_O, stride_o,
                            t, o0, o1, o2, o3,
                            False, False, 1, FENCE, BN_O, BK_O, PF_O)
                o0, o1, o2, o3 = row_tiles(w_o_ptr, stride_o, H, t + P, 0, K_O, BN_O,
                                           BK_O, PF_O)
    if FIRST <= 4 and LAST >= 5:
        if AHEAD:
            g0, g1, g2, g3, u0, u1, u2, u3 = gate_up_first(w_gu_ptr, stride_gu, I, H,
                                                           pid, BN_GU,
                                                           BK_GU, PF_GU)
        grid_barrier(bar_ptr, (5 - FIRST - SKIP) * P, P, LAST == 5, FENCE, clk, 5,
                     CLOCK)
        if not NEXT and RING:
            g0, g1, g2, g3, u0, u1, u2, u3 = gate_up_first(w_gu_ptr, stride_gu, I, H,
                                                           pid, BN_GU,
                                                           BK_GU, PF_GU)

    # ---- phase 5: RMSNorm + gate/up + SwiGLU (MoE: the router's logits) --------------
    if MOE and FIRST <= 5 and LAST >= 5:
        rstd_r = rms_rstd(x_ptr, H, eps, BK_R)
        stream_gemv(w_r_ptr, stride_r, E, H, x_ptr, gpost_ptr, rstd_r, logits_ptr,
                    logits_ptr,
                    pid, P, 0, True, False, FENCE, BN_R, BK_R, STAGES)
    if not MOE and FIRST <= 5 and LAST >= 5:
        rstd2 = rms_rstd(x_ptr, H, eps, BK_GU)
        if STAGES > 0:
            stream_gemv(w_gu_ptr, stride_gu, I, H, x_ptr, gpost_ptr, rstd2, h_ptr,
                        h_ptr, pid, P,
                        2, True, False, FENCE, BN_GU, BK_GU, STAGES)
        else:
            for t in range(pid, n_gu, P):
                gate_up_tile(x_ptr, gpost_ptr, w_gu_ptr, h_ptr, I, H, rstd2, stride_gu,
                             t,
                             g0, g1, g2, g3, u0, u1, u2, u3, BN_GU, BK_GU, PF_GU)
                g0, g1, g2, g3, u0, u1, u2, u3 = gate_up_first(w_gu_ptr, stride_gu, I,
                                                               H, t + P, BN_GU,
                                                               BK_GU, PF_GU)
    if FIRST <= 5 and LAST >= 6:
        if AHEAD:
            d0, d1, d2, d3 = down_first(w_dn_ptr, stride_dn, H, I, k_per_split,
                                        pid % n_dn_rows,
                                        pid // n_dn_rows, BN_DN, BK_DN, PF_DN)
        grid_barrier(bar_ptr, (6 - FIRST - SKIP) * P, P, LAST == 6, FENCE, clk, 6,
                     CLOCK)
        if not NEXT and RING:
            d0, d1, d2, d3 = down_first(w_dn_ptr, stride_dn, H, I, k_per_split,
                                        pid % n_dn_rows,
                                        pid // n_dn_rows, BN_DN, BK_DN, PF_DN)

    # ---- phase 6: down + residual (the last split to arrive adds the row block) ------
    # (MoE: every program routes from the logits, one stores; the experts' gate/up)
    if MOE and FIRST <= 6 and LAST >= 6:
        ids, wts = route(logits_ptr, ids_ptr, wts_ptr, log_ptr, pos, log_row,
                         log_offset, E,
                         pid == 0, TOP_K, TOP_KP, BLOCK_E)
        rstd_r = rms_rstd(x_ptr, H, eps, BK_R)
        stream_experts_gate_up(w_egu_ptr, stride_egu_e, stride_egu_n, ids, I_E, H,
                               x_ptr,
                               gpost_ptr, rstd_r, eh_ptr, pid, P, TOP_K, TOP_KP, BN_EGU,
                               BK_EGU, STAGES)
    if MOE and FIRST <= 6 and LAST >= 7:
        grid_barrier(bar_ptr, (7 - FIRST - SKIP) * P, P, LAST == 7, FENCE, clk, 7,
                     CLOCK)
    # ---- phase 7 (MoE): the experts' down, routing weights, residual -----------------
    if MOE and FIRST <= 7 and LAST >= 7:
        stream_experts_down(w_edn_ptr, stride_edn_e, stride_edn_n, ids_ptr, wts_ptr, H,
                            I_E,
                            eh_ptr, x_ptr, pid, P, FENCE, TOP_K, TOP_KP, BN_EDN, BK_EDN,
                            STAGES)
    if not MOE and FIRST <= 6 and LAST >= 6:
        # whole rows (SPLIT_K 1): no last arrival in the loop
        if STAGES > 0:
            stream_gemv(w_dn_ptr, stride_dn, H, I, h_ptr, h_ptr, 1.0, x_ptr, x_ptr,
                        pid, P,
                        1, False, False, FENCE, BN_DN, BK_DN, STAGES)
        else:
            for t in range(pid, n_dn, P):
                down_tile(h_ptr, w_dn_ptr, x_ptr, scratch_ptr, counter_ptr, x_ptr,
                          x_ptr, H, I,
                          k_per_split, stride_dn, t % n_dn_rows, t // n_dn_rows, d0,
                          d1, d2, d3,
                          SPLIT_K, FENCE, False, False, 1, BN_DN, BK_DN, PF_DN)
                d0, d1, d2, d3 = down_first(w_dn_ptr, stride_dn, H, I, k_per_split,
                                            (t + P) % n_dn_rows,
                                            (t + P) // n_dn_rows, BN_DN, BK_DN, PF_DN)
    stamp(clk, 2 * LAST + 1, CLOCK)


# ---- the launcher --------------------------------------------------------------------
def grid_size(device, cfg: dict, opts: PersistentOptions | None = None) -> int:
    """Programs of the persistent grid: ``opts.grid`` if set, else the entry's GRID, else
    SMs x PER_SM (``opts.per_sm``, else the entry's, default 1). In the interpreter a
    few programs (each then walks several tiles of most phases)."""
    opts = opts or PersistentOptions()
    g = opts.grid if opts.grid is not None else cfg.get("GRID")
    if g:
        return int(g)
    if config.interpreting() or torch.device(device).type != "cuda":
        return 3
    sms = torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
    return sms * int(opts.per_sm if opts.per_sm is not None else cfg.get("PER_SM", 1))


def entry(c_p: dict, opts: PersistentOptions | None = None) -> dict:
    """The persistent kernel's table entry with ``opts``' overrides (``options.py``):
    ``stages`` (STAGES), ``tile`` (TILE, ``own``: none) and ``fold_rope`` (FOLD_ROPE)."""
    opts = opts or PersistentOptions()
    c = dict(c_p)
    c["STAGES"] = int(opts.stages if opts.stages is not None else c.get("STAGES", 0))
    if opts.fold_rope if opts.fold_rope is not None else int(c.get("FOLD_ROPE", 0)):
        c["FOLD_ROPE"] = 1
    else:
        c.pop("FOLD_ROPE", None)
    tile = opts.tile or c.get("TILE")
    c.pop("TILE", None)
    if tile and tile != "own":
        c["TILE"] = str(tile)
    return c


def launch_options(device, use_pdl: bool, c_p: dict | None = None,
                   opts: PersistentOptions | None = None) -> dict:
    """How the launch is made: cooperative (``opts.coop``, on a GPU) and PDL
    (``opts.pdl``, default: the engine's, unless the launch table's entry ``c_p`` says
    ``PDL=0``), and whether all phases run in one launch (``opts.split``: "1", one
    launch per phase, as the interpreter; "0-4,5-7", those groups of phases, see
    ``phase_ranges``)."""
    opts = opts or PersistentOptions()
    gpu = not config.interpreting() and torch.device(device).type == "cuda"
    split = opts.split or "0"
    pdl = opts.pdl if opts.pdl is not None else int((c_p or {}).get("PDL", 1))
    return dict(cooperative=gpu and bool(opts.coop),
                pdl=bool(use_pdl) and bool(pdl), split=not gpu or split != "0",
                groups=None if split in ("0", "1") else split)


def phase_ranges(opts: dict, grid: int, last: int) -> list:
    """The launches of one layer as (first, last) phase ranges: one launch for all phases,
    one per phase (split), or the groups of ``PersistentOptions.split`` when it names them
    ("0-4,5-7": the attention block in one launch and the MoE block in another; a
    measurement of where one launch gains or loses). In the interpreter a range of more
    than one phase runs only at grid 1 (see ``one_launch``)."""
    if not opts.get("groups") or config.interpreting() and grid > 1:
        return [(0, last)] if one_launch(opts, grid) else [(p, p) for p in range(last + 1)]
    ranges = []
    for part in opts["groups"].split(","):
        a, _, b = part.partition("-")
        ranges.append((int(a), int(b or a)))
    if [p for a, b in ranges for p in range(a, b + 1)] != list(range(last + 1)):
        raise ValueError(f"split={opts['groups']!r} must cover phases "
                         f"0-{last} in order, each once (e.g. '0-4,5-{last}')")
    return ranges


def one_launch(opts: dict, grid: int) -> bool:
    """All phases in one launch: on the GPU unless split was asked for; in the interpreter
    only with one program (its barriers never wait for another program, so they run)."""
    return not opts["split"] or grid == 1


def layer_persistent(x, L: dict, qkv, q, attn, h, k_cache, v_cache, cos, sin, pos, part_o, part_m,
                     part_l, scratch, counter, bar, heads, kv_heads, head_dim, eps, chunk, cfgs: dict,
                     use_pdl=False, grid=None, opts=None, live_cap=None, moe=None, clock=None,
                     persist: PersistentOptions | None = None):
    """One layer. ``L``: the layer's packed weights (input_norm, w_qkv, b_qkv, w_o,
    post_norm, then w_gate_up, w_down, or for a mixture of experts w_router,
    w_experts_gate_up, w_experts_down); the activation buffers, caches and split-K partials
    as the unfused plan has them; ``bar`` int32 [2] zeros (left zero); ``cfgs``: op ->
    launch config for rms_qkv, o_proj, gate_up and down (MoE: router, moe_gate_up,
    moe_down), attn_split and layer_persistent (num_warps of the whole kernel, NEXT,
    STAGES: see ``entry``). ``moe``: the router's buffers (logits, ids, weights, log,
    log_row, log_offset) and the experts' h [top_k, I]; the MoE layer must stream
    (STAGES > 0). ``clock``: int64 [grid, 2 x phases] for the programs' clock stamps
    (a measurement on a GPU: ``measure.profile.clock_phases``). ``persist``: the
    engine's ``PersistentOptions`` (grid, cooperative launch, PDL, split). Returns the
    compiled kernels of the launches it made."""
    w_qkv, w_o = L["w_qkv"], L["w_o"]
    N_QKV, H = w_qkv.shape
    c_qkv, c_o = cfgs["rms_qkv"], cfgs["o_proj_residual"]
    c_at, c_p = cfgs["attention_splitk"], cfgs["layer_persistent"]
    stages = int(c_p.get("STAGES", 0))
    if moe is None:
        w_gu, w_dn = L["w_gate_up"], L["w_down"]
        I = w_gu.shape[0] // 2
        c_gu, c_dn = cfgs["rms_gate_up_swiglu"], cfgs["down_residual"]
        k_per_split, split = down_split(I, c_dn)
        assert not stages or split == 1, "the streamed down phase runs whole rows (SPLIT_K 1)"
        n_dn_rows = triton.cdiv(H, c_dn["BLOCK_N"])
        assert counter.numel() >= n_dn_rows and scratch.numel() >= split * H, "scratch too small"
        w_r = w_egu = w_edn = eh = logits = ids = wts = log = w_qkv   # (not read)
        E = top_k = I_E = log_row = log_offset = 1
        c_r = c_egu = c_edn = c_qkv
    else:
        assert stages, "the persistent MoE layer streams its phases: STAGES > 0"
        w_gu = w_dn = w_qkv                                            # (not read)
        I, k_per_split, split, c_gu, c_dn = 1, 1, 1, c_qkv, c_qkv
        w_r, w_egu, w_edn = L["w_router"], L["w_experts_gate_up"], L["w_experts_down"]
        E, I_E = w_r.shape[0], w_edn.shape[2]
        logits, ids, wts, log, eh = (moe[k] for k in ("logits", "ids", "weights", "log", "h"))
        log_row, log_offset, top_k = moe["log_row"], moe["log_offset"], ids.numel()
        c_r, c_egu, c_edn = cfgs["moe_router"], cfgs["moe_gate_up_swiglu"], cfgs["moe_down_residual"]
    n_splits = part_m.shape[1]
    group = heads // kv_heads
    block_t = min(c_at["BLOCK_T"], chunk)
    assert chunk % block_t == 0, "a tile must not straddle two chunks"
    qn, kn = L.get("q_norm"), L.get("k_norm")
    opts = opts or launch_options(x.device, use_pdl, c_p, persist)
    P = grid or grid_size(x.device, c_p, persist)
    kw = {}
    if opts["pdl"]:
        kw["launch_pdl"] = True
    if opts["cooperative"]:
        kw["launch_cooperative_grid"] = True
    last = LAST_PHASE + (moe is not None)                 # MoE: router, experts' gate/up, down
    ranges = phase_ranges(opts, P, last)
    slots = 2 * (last + 1)
    if clock is not None:
        if config.interpreting():
            raise ValueError("the layer's clock reads %globaltimer: a GPU measurement, not "
                             "for Triton's interpreter (leave PersistentOptions.clock False)")
        assert clock.dtype == torch.int64 and clock.numel() >= P * slots, "clock too small"
    # RoPE folded into the attention phase (``rope_attention_partial.rope_partial``): one
    # barrier fewer a layer; not where q and k are normed over all heads (OLMoE)
    fold = bool(c_p.get("FOLD_ROPE")) and qn is None
    if fold and any(a <= 1 and z == 2 for a, z in ranges):
        raise ValueError("with RoPE folded into attention a launch cannot end at phase 2 "
                         "(it has no barrier there): group phases 1-2 with 3")
    b = L["b_qkv"]
    compiled = []
    for first, final in ranges:
        compiled.append(_layer_persistent_kernel[(P,)](
            x, L["input_norm"], w_qkv, b if b is not None else w_qkv, qkv, N_QKV, H, eps,
            w_qkv.stride(0),
            q, k_cache, v_cache, cos, sin, pos, qn if qn is not None else qkv,
            kn if kn is not None else qkv, k_cache.stride(0), k_cache.stride(1), heads, kv_heads,
            part_o, part_m, part_l, attn, n_splits, live_share(n_splits, live_cap),
            head_dim ** -0.5,
            w_o, w_o.shape[1], w_o.stride(0),
            L["post_norm"], w_gu, h, I, w_gu.stride(0),
            w_dn, scratch, counter, k_per_split, w_dn.stride(0),
            bar,
            w_r, w_r.stride(0), E, logits, ids, wts, log, log_row, log_offset,
            w_egu, w_egu.stride(0), w_egu.stride(1) if w_egu.dim() > 2 else 0, I_E,
            w_edn, w_edn.stride(0), w_edn.stride(1) if w_edn.dim() > 2 else 0, eh,
            clock if clock is not None else bar,
            HAS_BIAS=b is not None, QK_NORM=qn is not None, D=head_dim,
            BLOCK_D=triton.next_power_of_2(head_dim),
            BLOCK_R=min(1024, triton.next_power_of_2(heads * head_dim)), GROUP=group,
            GROUP_PAD=max(16, triton.next_power_of_2(group)),
            BLOCK_DA=max(16, triton.next_power_of_2(head_dim)), CHUNK=chunk, BLOCK_T=block_t,
            DOT_F32=config.interpreting(), BLOCK_S=BLOCK_S, BLOCK_M=block_m(n_splits),
            BN_QKV=c_qkv["BLOCK_N"], BK_QKV=c_qkv["BLOCK_K"], PF_QKV=config.prefetch(c_qkv, H),
            BN_O=c_o["BLOCK_N"], BK_O=c_o["BLOCK_K"], PF_O=config.prefetch(c_o, w_o.shape[1]),
            BN_GU=c_gu["BLOCK_N"], BK_GU=c_gu["BLOCK_K"], PF_GU=config.prefetch(c_gu, H),
            BN_DN=c_dn["BLOCK_N"], BK_DN=c_dn["BLOCK_K"], PF_DN=config.prefetch(c_dn, k_per_split),
            SPLIT_K=split, FIRST=first, LAST=final, NEXT=bool(c_p.get("NEXT", 1)),
            USE_PDL=opts["pdl"], FENCE=not config.interpreting(), STAGES=stages,
            MOE=moe is not None, TOP_K=top_k, TOP_KP=triton.next_power_of_2(top_k),
            BLOCK_E=triton.next_power_of_2(E), BN_R=c_r["BLOCK_N"], BK_R=c_r["BLOCK_K"],
            BN_EGU=c_egu["BLOCK_N"], BK_EGU=c_egu["BLOCK_K"], BN_EDN=c_edn["BLOCK_N"],
            BK_EDN=c_edn["BLOCK_K"], CLOCK=clock is not None, SLOTS=slots,
            FOLD=fold, SKIP=int(fold and first <= 1 and final >= 2),
            num_warps=c_p["num_warps"], **kw))
    return compiled
