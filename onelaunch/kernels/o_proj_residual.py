"""O-projection + residual add.

    x[n] = x[n] + (W_o @ attn)[n]          W_o: [N, K] = [hidden, Hq D], x: [N] bf16

The residual update happens in the GEMV's epilogue, in place: a program reads and writes
only its own BLOCK_N rows of x, and reads only ``attn`` otherwise, so no two programs
touch the same bytes. Grid: one program per BLOCK_N rows. Bytes: N*K*2 of weights
(Qwen2.5-1.5B: 4.7 MB a layer), N*2 read and written for the residual.

Tensor parallelism (row-parallel: each rank holds a column slice of W_o and the matching
slice of ``attn``): with ``out`` the rank's partial goes, unrounded, to ``out`` and x is
left alone; with ``peer`` each program sums its rows' partials over the ranks itself
(``peer.peer_sum``) and then adds the residual. See ``_common.finish_rows``.
"""
import triton
import triton.language as tl

from . import config
from ._common import finish_rows, gemv_tiles, pdl_wait, row_tiles
from .peer import epilogue_args


@triton.jit
def o_proj_tile(a_ptr, w_ptr, x_ptr, out_ptr, peer_ptr, N, K, stride_w_n, tile, w0, w1, w2, w3,
                OUT: tl.constexpr, PEER: tl.constexpr, WORLD: tl.constexpr, FENCE: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    """Row tile ``tile`` of x += W_o @ attn, given its first weight tiles (``row_tiles``)."""
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    y = gemv_tiles(w_ptr, stride_w_n, offs_n, n_mask, a_ptr, a_ptr, 1.0, w0, w1, w2, w3, 0, K,
                   BLOCK_K, False, PREFETCH)
    # x = bf16(x + bf16(y)): the projection's bf16 output, as HF, then the residual add
    finish_rows(y, x_ptr, out_ptr, offs_n, n_mask, tile, peer_ptr, OUT, PEER, WORLD, FENCE)


@triton.jit
def _o_proj_residual_kernel(a_ptr, w_ptr, x_ptr, out_ptr, peer_ptr, N, K, stride_w_n,
                            USE_PDL: tl.constexpr, OUT: tl.constexpr, PEER: tl.constexpr,
                            WORLD: tl.constexpr, FENCE: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    pid = tl.program_id(0)
    w0, w1, w2, w3 = row_tiles(w_ptr, stride_w_n, N, pid, 0, K, BLOCK_N, BLOCK_K, PREFETCH)
    pdl_wait(USE_PDL)
    o_proj_tile(a_ptr, w_ptr, x_ptr, out_ptr, peer_ptr, N, K, stride_w_n, pid, w0, w1, w2, w3,
                OUT, PEER, WORLD, FENCE, BLOCK_N, BLOCK_K, PREFETCH)


def o_proj_residual(attn, w_o, x, use_pdl=False, cfg=None, out=None, peer=None):
    """x += W_o @ attn, in place.  attn: [K], w_o: [N, K], x: [N].
    TP: ``out`` fp32 [N] gets this rank's partial W_o @ attn (fp32, unrounded) and x is left
    alone; ``peer`` (a ``PeerBuffers`` site, tiles_max >= ceil(N / BLOCK_N)) sums the ranks'
    partials in rank order and adds them to x on every rank."""
    N, K = w_o.shape
    c = cfg or config.get("o_proj_residual", x.device, w_o.shape)
    n_blocks = triton.cdiv(N, c["BLOCK_N"])
    out_ptr, peer_ptr, ep = epilogue_args(x, out, peer, N, n_blocks)
    kw = {"launch_pdl": True} if use_pdl else {}
    _o_proj_residual_kernel[(n_blocks,)](
        attn, w_o, x, out_ptr, peer_ptr, N, K, w_o.stride(0), USE_PDL=use_pdl,
        FENCE=not config.interpreting(), **ep, BLOCK_N=c["BLOCK_N"],
        BLOCK_K=c["BLOCK_K"], PREFETCH=config.prefetch(c, K), num_warps=c["num_warps"], **kw)
