"""Fused RMSNorm + QKV projection (+ bias).

    xn      = rmsnorm(x) * g                      x: [K] bf16 residual, g: [K]
    qkv     = W_qkv @ xn + b                      W_qkv: [N, K], N = (Hq + 2 Hkv) D

q, k and v are one GEMV against the concatenated weight (packed once at load time), so
the normalised activation is computed on chip and never written out. Bias rides in the
epilogue. Grid: one program per BLOCK_N rows of W_qkv. Bytes: N*K*2 weight bytes read
once (Qwen2.5-1.5B: 2048 x 1536 x 2 = 6.3 MB a layer), plus K*2 activation bytes per
program from L2. The idea is the seed post's first fused kernel; the layout is
gpt-fast's wqkv.
"""
import torch
import triton
import triton.language as tl

from . import config
from ._common import bf16_round, gemv_tiles, pdl_wait, rms_rstd, row_tiles


@triton.jit
def rms_qkv_tile(x_ptr, g_ptr, w_ptr, b_ptr, out_ptr, N, K, rstd, stride_w_n, tile,
                 w0, w1, w2, w3, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    """Row tile ``tile`` of qkv, given its first weight tiles ``w0..w3`` (``row_tiles``)
    and the RMS statistic of x: the body of a program of this kernel, and of the
    persistent layer's QKV phase."""
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    y = gemv_tiles(w_ptr, stride_w_n, offs_n, n_mask, x_ptr, g_ptr, rstd, w0, w1, w2,
                   w3, 0, K, BLOCK_K, True, PREFETCH)
    y = bf16_round(y)          # the projection's bf16 output, as HF
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offs_n, bf16_round(y).to(out_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _rms_qkv_kernel(x_ptr, g_ptr, w_ptr, b_ptr, out_ptr, N, K, eps, stride_w_n,
                    HAS_BIAS: tl.constexpr, USE_PDL: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    PREFETCH: tl.constexpr):
    pid = tl.program_id(0)
    # the first weight tiles, before the wait
    w0, w1, w2, w3 = row_tiles(w_ptr, stride_w_n, N, pid, 0, K, BLOCK_N, BLOCK_K,
                               PREFETCH)
    pdl_wait(USE_PDL)
    rstd = rms_rstd(x_ptr, K, eps, BLOCK_K)
    rms_qkv_tile(x_ptr, g_ptr, w_ptr, b_ptr, out_ptr, N, K, rstd, stride_w_n, pid,
                 w0, w1, w2, w3, HAS_BIAS, BLOCK_N, BLOCK_K, PREFETCH)


def rms_qkv(x, g, w_qkv, b_qkv, out, eps, use_pdl=False, cfg=None):
    """out[N] = W_qkv @ (rmsnorm(x) * g) + b.   x: [K], w_qkv: [N, K], out: [N]."""
    N, K = w_qkv.shape
    c = cfg or config.get("rms_qkv", x.device, w_qkv.shape)
    grid = (triton.cdiv(N, c["BLOCK_N"]),)
    kw = {"launch_pdl": True} if use_pdl else {}
    _rms_qkv_kernel[grid](x, g, w_qkv, b_qkv if b_qkv is not None else w_qkv, out, N, K, eps,
                          w_qkv.stride(0), HAS_BIAS=b_qkv is not None, USE_PDL=use_pdl,
                          BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], PREFETCH=config.prefetch(c, K),
                          num_warps=c["num_warps"], **kw)
    return out
