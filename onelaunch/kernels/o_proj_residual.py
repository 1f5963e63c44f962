"""O-projection + residual add.

    x[n] = x[n] + (W_o @ attn)[n]          W_o: [N, K] = [hidden, Hq D], x: [N] bf16

The residual update happens in the GEMV's epilogue, in place: a program reads and writes
only its own BLOCK_N rows of x, and reads only ``attn`` otherwise, so no two programs touch
the same bytes. Grid: one program per BLOCK_N rows. Bytes: N*K*2 of weights (Qwen2.5-1.5B:
4.7 MB a layer), N*2 read and written for the residual.
"""
import triton
import triton.language as tl

from . import config
from ._common import bf16_round, gemv_tiles, load_w_tiles, pdl_wait


@triton.jit
def _o_proj_residual_kernel(a_ptr, w_ptr, x_ptr, N, K, stride_w_n, USE_PDL: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w0, w1, w2, w3 = load_w_tiles(w_ptr, stride_w_n, offs_n, n_mask, 0, K, BLOCK_K, PREFETCH)
    pdl_wait(USE_PDL)
    y = gemv_tiles(w_ptr, stride_w_n, offs_n, n_mask, a_ptr, a_ptr, 1.0, w0, w1, w2, w3, 0, K,
                   BLOCK_K, False, PREFETCH)
    y = bf16_round(y)            # the projection's bf16 output, as HF
    x = tl.load(x_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    tl.store(x_ptr + offs_n, bf16_round(x + y).to(x_ptr.dtype.element_ty), mask=n_mask)


def o_proj_residual(attn, w_o, x, use_pdl=False, cfg=None):
    """x += W_o @ attn, in place.  attn: [K], w_o: [N, K], x: [N]."""
    N, K = w_o.shape
    c = cfg or config.get("o_proj", x.device, w_o.shape)
    kw = {"launch_pdl": True} if use_pdl else {}
    _o_proj_residual_kernel[(triton.cdiv(N, c["BLOCK_N"]),)](
        attn, w_o, x, N, K, w_o.stride(0), USE_PDL=use_pdl, BLOCK_N=c["BLOCK_N"],
        BLOCK_K=c["BLOCK_K"], PREFETCH=config.prefetch(c, K), num_warps=c["num_warps"], **kw)
