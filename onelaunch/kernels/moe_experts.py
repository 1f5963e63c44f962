"""MoE experts read by id: gate/up + SwiGLU, then down + routing weight + residual.

The experts' weights are stacked, as vLLM's fused_moe stacks them:

    W_gu   [E, 2I, K]    gate rows 0..I-1, up rows I..2I-1 of each expert  (OLMoE 64 x 2048 x 2048)
    W_down [E, K, I]     (OLMoE 64 x 2048 x 1024)

and a program finds its expert by loading the id the router wrote (``moe_router``) and
offsetting its weight pointer by ``id * stride_e``. The launch shape is fixed (always
TOP_K experts), so a CUDA graph replays it while the experts it reads change every token.
What the indirection costs: an expert's address is known only after the router finishes,
so, unlike the dense GEMVs, no weight tile can be requested before the PDL wait.

Stage 1, ``_moe_gate_up_swiglu_kernel``, grid (TOP_K, I / BLOCK_N):

    h[j, n] = silu(W_gu[ids[j], n] . xn) * (W_gu[ids[j], I + n] . xn)       h: [TOP_K, I] bf16

Stage 2, ``_moe_down_residual_kernel``, grid (K / BLOCK_N, TOP_K): each program computes one
expert's rows, ``t_j = bf16(bf16(W_down[ids[j]] @ h[j]) * w_j)`` (HF's roundings), and the
last of the TOP_K programs of a row block adds them in slot order and the residual:

    x[n] = bf16(x[n] + bf16(sum_j t_j[n]))          fixed order: two replays, same bits

    scratch  [TOP_K, K]      fp32   the t_j rows, overwritten every call
    counter  [K / BLOCK_N]   int32  zero between calls, left zero

Bytes per token: TOP_K * 3 * I * K * 2 (OLMoE: 8 experts x 12.6 MB = 101 MB a layer).

Tensor parallelism (each rank holds a slice of every expert's I): ``out`` / ``peer`` on the
down stage as in ``o_proj_residual``; the rank's partial is the slot-order sum of t_j.
"""
import triton
import triton.language as tl

from . import config
from ._common import (bf16_round, finish_rows, gemv2_tiles, gemv_tiles, last_arrival_residual,
                      load_w_tile, load_w_tiles, load_x_tile, pdl_wait, swiglu)
from .peer import epilogue_args


@triton.jit
def _moe_gate_up_swiglu_kernel(xn_ptr, w_ptr, ids_ptr, h_ptr, I, K, stride_w_e,
                               stride_w_n, USE_PDL: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    slot = tl.program_id(0)                  # which of the TOP_K chosen experts
    pid = tl.program_id(1)                   # a block of BLOCK_N of its I rows
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < I
    pdl_wait(USE_PDL)                        # the ids come from the router: wait first
    e = tl.load(ids_ptr + slot).to(tl.int64)  # the expert chosen for this slot
    gate_ptr = w_ptr + e * stride_w_e        # its slab of the stacked W_gu [E, 2I, K]
    up_ptr = gate_ptr + I * stride_w_n       # up rows follow the I gate rows
    g0, g1, g2, g3 = load_w_tiles(gate_ptr, stride_w_n, offs_n, n_mask, 0, K, BLOCK_K,
                                  PREFETCH)
    u0, u1, u2, u3 = load_w_tiles(up_ptr, stride_w_n, offs_n, n_mask, 0, K, BLOCK_K,
                                  PREFETCH)
    gate, up = gemv2_tiles(gate_ptr, up_ptr, stride_w_n, offs_n, n_mask, xn_ptr, xn_ptr,
                           1.0, g0, g1, g2, g3, u0, u1, u2, u3, K, BLOCK_K, PREFETCH,
                           False)
    tl.store(h_ptr + slot * I + offs_n, swiglu(gate, up).to(h_ptr.dtype.element_ty),
             mask=n_mask)                    # h[slot, rows] = silu(gate) * up


@triton.jit
def _moe_down_residual_kernel(h_ptr, w_ptr, ids_ptr, wts_ptr, x_ptr, scratch_ptr,
                              counter_ptr, out_ptr, peer_ptr, N, I, stride_w_e,
                              stride_w_n, TOP_K: tl.constexpr, FENCE: tl.constexpr,
                              OUT: tl.constexpr, PEER: tl.constexpr,
                              WORLD: tl.constexpr, USE_PDL: tl.constexpr,
                              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              PREFETCH: tl.constexpr):
    pid_n = tl.program_id(0)
    slot = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    pdl_wait(USE_PDL)
    e = tl.load(ids_ptr + slot).to(tl.int64)
    w = w_ptr + e * stride_w_e
    w0, w1, w2, w3 = load_w_tiles(w, stride_w_n, offs_n, n_mask, 0, I, BLOCK_K,
                                  PREFETCH)
    y = gemv_tiles(w, stride_w_n, offs_n, n_mask, h_ptr + slot * I, h_ptr, 1.0, w0,
                   w1, w2, w3, 0, I, BLOCK_K, False, PREFETCH)
    # expert output x routing weight
    y = bf16_round(bf16_round(y) * tl.load(wts_ptr + slot))
    last_arrival_residual(y, scratch_ptr, counter_ptr, x_ptr, pid_n, slot, N, offs_n,
                          n_mask, out_ptr, peer_ptr, TOP_K, FENCE, OUT, PEER, WORLD)


@triton.jit
def stream_experts_gate_up(w_ptr, stride_w_e, stride_w_n, ids, I, K, x_ptr, g_ptr, rstd,
                           h_ptr, first, step, TOP_K: tl.constexpr, TOP_KP: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           STAGES: tl.constexpr):
    """The persistent MoE layer's gate/up phase: tiles (slot, row tile of I) ``first``,
    ``first + step``, ... of h[j] = swiglu of expert ``ids[j]`` (``ids``: [TOP_KP] in
    registers, from ``moe_router.route``) over rmsnorm(x) * g, as one flat loop over
    (tile, K tile) streamed through shared memory (see ``_common.stream_gemv``). Same
    sums and roundings as ``_moe_gate_up_swiglu_kernel`` reading the router's xn."""
    n_t = tl.cdiv(I, BLOCK_N)
    nk = tl.cdiv(K, BLOCK_K)
    mine = tl.cdiv(tl.maximum(TOP_K * n_t - first, 0), step)
    slots = tl.arange(0, TOP_KP)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for i in tl.range(0, mine * nk, num_stages=STAGES):
        t = first + (i // nk) * step
        slot = t // n_t
        k0 = (i % nk) * BLOCK_K
        offs_n = (t % n_t) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < I
        e = tl.sum(tl.where(slots == slot, ids, 0), axis=0).to(tl.int64)
        gate_ptr = w_ptr + e * stride_w_e
        xt = load_x_tile(x_ptr, g_ptr, rstd, k0, K, BLOCK_K, True)[None, :]
        w = load_w_tile(gate_ptr, stride_w_n, offs_n, n_mask, k0, K, BLOCK_K)
        u = load_w_tile(gate_ptr + I * stride_w_n, stride_w_n, offs_n, n_mask, k0, K,
                        BLOCK_K)
        acc += w.to(tl.float32) * xt
        acc2 += u.to(tl.float32) * xt
        if k0 + BLOCK_K >= K:                          # the tile's last K tile
            h = swiglu(tl.sum(acc, axis=1), tl.sum(acc2, axis=1))
            tl.store(h_ptr + slot * I + offs_n, h.to(h_ptr.dtype.element_ty), mask=n_mask)
            acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
            acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)


@triton.jit
def stream_experts_down(w_ptr, stride_w_e, stride_w_n, ids_ptr, wts_ptr, N, I, h_ptr,
                        x_ptr, first, step, FENCE: tl.constexpr, TOP_K: tl.constexpr,
                        TOP_KP: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """The persistent MoE layer's down phase: row tiles ``first``, ``first + step``, ...
    of x += sum_j w_j * W_down[ids[j]] @ h[j], one flat loop over (row tile, slot,
    K tile) streamed through shared memory. Each slot's rows are rounded and weighted
    as ``_moe_down_residual_kernel`` does, and summed in slot order, so the row tile
    needs no last-arrival exchange: one program owns all its slots."""
    nk = tl.cdiv(I, BLOCK_K)
    per = TOP_K * nk
    mine = tl.cdiv(tl.maximum(tl.cdiv(N, BLOCK_N) - first, 0), step)
    slots = tl.arange(0, TOP_KP)
    ids = tl.load(ids_ptr + slots, mask=slots < TOP_K, other=0)
    wts = tl.load(wts_ptr + slots, mask=slots < TOP_K, other=0.0)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for i in tl.range(0, mine * per, num_stages=STAGES):
        tile = first + (i // per) * step
        slot = (i % per) // nk
        k0 = (i % nk) * BLOCK_K
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_mask = offs_n < N
        e = tl.sum(tl.where(slots == slot, ids, 0), axis=0).to(tl.int64)
        ht = load_x_tile(h_ptr + slot * I, h_ptr, 1.0, k0, I, BLOCK_K, False)[None, :]
        w = load_w_tile(w_ptr + e * stride_w_e, stride_w_n, offs_n, n_mask, k0, I,
                        BLOCK_K)
        acc += w.to(tl.float32) * ht
        if k0 + BLOCK_K >= I:                          # the slot's last K tile
            wj = tl.sum(tl.where(slots == slot, wts, 0.0), axis=0)
            total += bf16_round(bf16_round(tl.sum(acc, axis=1)) * wj)
            acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
            if slot == TOP_K - 1:                      # the row tile's last slot
                finish_rows(total, x_ptr, x_ptr, offs_n, n_mask, tile, x_ptr, False,
                            False, 1, FENCE)
                total = tl.zeros([BLOCK_N], dtype=tl.float32)


def moe_gate_up_swiglu(xn, w_gate_up, ids, h, use_pdl=False, cfg=None):
    """h[j] = swiglu of expert ids[j] over xn.  xn: [K]; w_gate_up: [E, 2I, K];
    ids: int32 [top_k] on the device; h: [top_k, I]."""
    E, two_i, K = w_gate_up.shape
    I = two_i // 2
    top_k = ids.numel()
    assert h.numel() >= top_k * I and w_gate_up.stride(2) == 1
    c = cfg or config.get("moe_gate_up_swiglu", xn.device, (two_i, K))
    kw = {"launch_pdl": True} if use_pdl else {}
    _moe_gate_up_swiglu_kernel[(top_k, triton.cdiv(I, c["BLOCK_N"]))](
        xn, w_gate_up, ids, h, I, K, w_gate_up.stride(0), w_gate_up.stride(1), USE_PDL=use_pdl,
        BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], PREFETCH=config.prefetch(c, K),
        num_warps=c["num_warps"], **kw)


def moe_down_residual(h, w_down, ids, weights, x, scratch, counter, use_pdl=False, cfg=None,
                      out=None, peer=None):
    """x += sum_j weights[j] * W_down[ids[j]] @ h[j], in place.  h: [top_k, I];
    w_down: [E, N, I]; weights: fp32 [top_k]; x: [N]; scratch: fp32 [>= top_k * N];
    counter: int32 [>= N / BLOCK_N] zeros (left zero). TP: ``out`` fp32 [N] gets this
    rank's partial (the slot-order fp32 sum) instead; ``peer`` (tiles_max >= ceil(N /
    BLOCK_N)) sums the ranks' partials and adds them to x."""
    E, N, I = w_down.shape
    top_k = ids.numel()
    c = cfg or config.get("moe_down_residual", x.device, (N, I))
    n_blocks = triton.cdiv(N, c["BLOCK_N"])
    assert scratch.numel() >= top_k * N and counter.numel() >= n_blocks, "scratch too small"
    assert w_down.stride(2) == 1
    out_ptr, peer_ptr, ep = epilogue_args(x, out, peer, N, n_blocks)
    kw = {"launch_pdl": True} if use_pdl else {}
    _moe_down_residual_kernel[(n_blocks, top_k)](
        h, w_down, ids, weights, x, scratch, counter, out_ptr, peer_ptr, N, I, w_down.stride(0),
        w_down.stride(1), TOP_K=top_k, FENCE=not config.interpreting(), **ep, USE_PDL=use_pdl,
        BLOCK_N=c["BLOCK_N"],
        BLOCK_K=c["BLOCK_K"], PREFETCH=config.prefetch(c, I), num_warps=c["num_warps"], **kw)
