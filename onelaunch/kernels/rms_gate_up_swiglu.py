"""Fused RMSNorm + gate/up projections + SwiGLU.

    xn   = rmsnorm(x) * g
    h[n] = silu(W_gate[n] . xn) * (W_up[n] . xn)        W_gu = [W_gate; W_up]: [2I, K]

Each program owns BLOCK_N channels and reads the matching rows of both halves of the
concatenated weight, so gate and up for a channel meet in registers and only h (I
values) is written. Grid: one program per BLOCK_N of the I channels. Bytes: 2*I*K*2 of
weights (Qwen2.5-1.5B: 55 MB a layer, the largest stream of the step), I*2 written.

A program keeps PREFETCH weight tiles of each half in flight (``_common.ring_start``,
``ring_next``), the first of them requested before its PDL wait.
"""
import triton
import triton.language as tl

from . import config
from ._common import (gemv2_tiles, load_x_tile, pdl_wait, ring_next, ring_start,
                      rms_rstd, row_tiles, swiglu)


@triton.jit
def _rms_gate_up_swiglu_kernel(x_ptr, g_ptr, w_ptr, h_ptr, I, K, eps, stride_w_n,
                               USE_PDL: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    # this program's BLOCK_N channels: rows n of W_gate and rows I + n of W_up
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < I

    # prologue: weights never depend on the previous kernel, so the first PREFETCH
    # tiles of both rows are requested before the wait for x (PDL; else no wait)
    gate = ring_start(w_ptr, stride_w_n, offs_n, n_mask, K, BLOCK_K, PREFETCH)
    up_ptr = w_ptr + I * stride_w_n               # W_up: the I rows below W_gate
    up = ring_start(up_ptr, stride_w_n, offs_n, n_mask, K, BLOCK_K, PREFETCH)
    pdl_wait(USE_PDL)
    rstd = rms_rstd(x_ptr, K, eps, BLOCK_K)       # RMSNorm's statistic, on chip

    # the K loop: a tile of normalised x (from L2) times a tile of each weight
    # (from HBM, read once); ring_next requests the tile PREFETCH - 1 ahead
    xt = load_x_tile(x_ptr, g_ptr, rstd, 0, K, BLOCK_K, True)[None, :]
    acc_gate = gate[0].to(tl.float32) * xt        # [BLOCK_N, BLOCK_K] fp32
    acc_up = up[0].to(tl.float32) * xt
    for k0 in range(BLOCK_K, K, BLOCK_K):
        gate = ring_next(gate, w_ptr, stride_w_n, offs_n, n_mask, k0, K, BLOCK_K,
                         PREFETCH)
        up = ring_next(up, up_ptr, stride_w_n, offs_n, n_mask, k0, K, BLOCK_K,
                       PREFETCH)
        xt = load_x_tile(x_ptr, g_ptr, rstd, k0, K, BLOCK_K, True)[None, :]
        acc_gate += gate[0].to(tl.float32) * xt
        acc_up += up[0].to(tl.float32) * xt

    # epilogue: gate and up meet in registers; only h is written
    gate_n, up_n = tl.sum(acc_gate, axis=1), tl.sum(acc_up, axis=1)
    tl.store(h_ptr + offs_n, swiglu(gate_n, up_n).to(h_ptr.dtype.element_ty),
             mask=n_mask)


def rms_gate_up_swiglu(x, g, w_gate_up, h, eps, use_pdl=False, cfg=None):
    """h[I] = silu(W_gate @ xn) * (W_up @ xn), xn = rmsnorm(x) * g.  w_gate_up: [2I, K]."""
    two_i, K = w_gate_up.shape
    I = two_i // 2
    c = cfg or config.get("rms_gate_up_swiglu", x.device, w_gate_up.shape)
    kw = {"launch_pdl": True} if use_pdl else {}
    _rms_gate_up_swiglu_kernel[(triton.cdiv(I, c["BLOCK_N"]),)](
        x, g, w_gate_up, h, I, K, eps, w_gate_up.stride(0), USE_PDL=use_pdl,
        BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], PREFETCH=config.prefetch(c, K),
        num_warps=c["num_warps"], **kw)


# ---- the persistent layer's gate/up phase (layer_persistent, STAGES 0) ------------
# The same loads and sums as the kernel above, split at the point where the kernel waits:
# a persistent program requests a tile's first weight tiles before a grid barrier.


@triton.jit
def gate_up_first(w_ptr, stride_w_n, I, K, tile, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    """The first weight tiles of channel tile ``tile``: gate rows, then up rows."""
    g0, g1, g2, g3 = row_tiles(w_ptr, stride_w_n, I, tile, 0, K, BLOCK_N, BLOCK_K,
                               PREFETCH)
    u0, u1, u2, u3 = row_tiles(w_ptr + I * stride_w_n, stride_w_n, I, tile, 0, K,
                               BLOCK_N, BLOCK_K, PREFETCH)
    return g0, g1, g2, g3, u0, u1, u2, u3


@triton.jit
def gate_up_tile(x_ptr, g_ptr, w_ptr, h_ptr, I, K, rstd, stride_w_n, tile,
                 g0, g1, g2, g3, u0, u1, u2, u3,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    """Channel tile ``tile`` of h, given its first tiles (``gate_up_first``) and x's
    RMS."""
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < I
    up_ptr = w_ptr + I * stride_w_n
    gate, up = gemv2_tiles(w_ptr, up_ptr, stride_w_n, offs_n, n_mask, x_ptr, g_ptr,
                           rstd, g0, g1, g2, g3, u0, u1, u2, u3, K, BLOCK_K, PREFETCH,
                           True)
    tl.store(h_ptr + offs_n, swiglu(gate, up).to(h_ptr.dtype.element_ty), mask=n_mask)
