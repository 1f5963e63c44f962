"""Fused RMSNorm + gate/up projections + SwiGLU.

    xn   = rmsnorm(x) * g
    h[n] = silu(W_gate[n] . xn) * (W_up[n] . xn)        W_gu = [W_gate; W_up]: [2I, K]

Each program owns BLOCK_N channels and reads the matching rows of both halves of the
concatenated weight, so gate and up for a channel meet in registers and only h (I
values) is written. Grid: one program per BLOCK_N of the I channels. Bytes: 2*I*K*2 of
weights (Qwen2.5-1.5B: 55 MB a layer, the largest stream of the step), I*2 written.
"""
import triton
import triton.language as tl

from . import config
from ._common import gemv2_tiles, pdl_wait, rms_rstd, row_tiles, swiglu


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


@triton.jit
def _rms_gate_up_swiglu_kernel(x_ptr, g_ptr, w_ptr, h_ptr, I, K, eps, stride_w_n,
                               USE_PDL: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    pid = tl.program_id(0)
    g0, g1, g2, g3, u0, u1, u2, u3 = gate_up_first(w_ptr, stride_w_n, I, K, pid,
                                                   BLOCK_N, BLOCK_K, PREFETCH)
    pdl_wait(USE_PDL)
    rstd = rms_rstd(x_ptr, K, eps, BLOCK_K)
    gate_up_tile(x_ptr, g_ptr, w_ptr, h_ptr, I, K, rstd, stride_w_n, pid,
                 g0, g1, g2, g3, u0, u1, u2, u3, BLOCK_N, BLOCK_K, PREFETCH)


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
