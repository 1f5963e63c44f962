"""Down-projection + residual add, split over K, reduced in a fixed order.

    x[n] = x[n] + (W_down @ h)[n]          W_down: [N, K] = [hidden, I]   (1536 x 8960)

With one program per BLOCK_N rows there are only N / BLOCK_N programs (96 for 16-row
tiles), fewer than the H200's 132 SMs, each walking 8960 columns: measured on the H200,
such a GEMV reaches about a third of the read bandwidth. So the K axis is split too:
grid (N / BLOCK_N, SPLIT_K). Each program writes its partial dot products to its own row
of a scratch buffer and bumps a per-row-block counter; the program that arrives last for
a row block (the threadfence-reduction pattern) sums the SPLIT_K partials in split
order, adds the residual, writes x and resets the counter. One launch, and bit-for-bit
deterministic (atomic adds into one fp32 sum would not be: their order, and so the
rounding, changes from run to run).

    scratch  [SPLIT_K, N]      fp32   overwritten on every call
    counter  [N / BLOCK_N]     int32  zero between calls, left zero

Bytes: N*K*2 of weights (27.5 MB a layer); N*4*SPLIT_K of partials through L2.

Tensor parallelism: ``out`` / ``peer`` as in ``o_proj_residual``; the sum of the splits
(in split order) is the rank's partial, and the last arrival exchanges it.
"""
import triton
import triton.language as tl

from . import config
from ._common import finish_rows, gemv_tiles, last_arrival_residual, pdl_wait, row_tiles
from .peer import epilogue_args


@triton.jit
def down_first(w_ptr, stride_w_n, N, K, k_per_split, pid_n, pid_k,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    """The first weight tiles of row block ``pid_n``, split ``pid_k`` of K."""
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    return row_tiles(w_ptr, stride_w_n, N, pid_n, k_start, k_end, BLOCK_N, BLOCK_K,
                     PREFETCH)


@triton.jit
def down_tile(h_ptr, w_ptr, x_ptr, scratch_ptr, counter_ptr, out_ptr, peer_ptr, N, K,
              k_per_split, stride_w_n, pid_n, pid_k, w0, w1, w2, w3,
              SPLIT_K: tl.constexpr, FENCE: tl.constexpr, OUT: tl.constexpr,
              PEER: tl.constexpr, WORLD: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    """Row block ``pid_n``, split ``pid_k``, given its first tiles (``down_first``): the
    partial, and the residual add by the split that arrives last."""
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    y = gemv_tiles(w_ptr, stride_w_n, offs_n, n_mask, h_ptr, h_ptr, 1.0, w0, w1, w2, w3,
                   k_start, k_end, BLOCK_K, False, PREFETCH)
    if SPLIT_K == 1:
        finish_rows(y, x_ptr, out_ptr, offs_n, n_mask, pid_n, peer_ptr, OUT, PEER,
                    WORLD, FENCE)
    else:
        last_arrival_residual(y, scratch_ptr, counter_ptr, x_ptr, pid_n, pid_k, N,
                              offs_n, n_mask, out_ptr, peer_ptr, SPLIT_K, FENCE, OUT,
                              PEER, WORLD)


@triton.jit
def _down_residual_kernel(h_ptr, w_ptr, x_ptr, scratch_ptr, counter_ptr, out_ptr,
                          peer_ptr, N, K, k_per_split, stride_w_n,
                          SPLIT_K: tl.constexpr, USE_PDL: tl.constexpr,
                          FENCE: tl.constexpr, OUT: tl.constexpr, PEER: tl.constexpr,
                          WORLD: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    w0, w1, w2, w3 = down_first(w_ptr, stride_w_n, N, K, k_per_split, pid_n, pid_k,
                                BLOCK_N, BLOCK_K, PREFETCH)
    pdl_wait(USE_PDL)
    down_tile(h_ptr, w_ptr, x_ptr, scratch_ptr, counter_ptr, out_ptr, peer_ptr, N, K,
              k_per_split, stride_w_n, pid_n, pid_k, w0, w1, w2, w3, SPLIT_K, FENCE,
              OUT, PEER, WORLD, BLOCK_N, BLOCK_K, PREFETCH)


def down_split(K: int, cfg: dict) -> tuple[int, int]:
    """(k_per_split, splits) of a launch config: whole BLOCK_K tiles a split, no empty split."""
    bk = cfg["BLOCK_K"]
    k_per_split = triton.cdiv(triton.cdiv(K, cfg["SPLIT_K"]), bk) * bk
    return k_per_split, triton.cdiv(K, k_per_split)


def down_residual(h, w_down, x, scratch, counter, use_pdl=False, cfg=None, out=None, peer=None):
    """x += W_down @ h, in place.  h: [K], w_down: [N, K], x: [N];
    scratch: fp32 [>= SPLIT_K * N]; counter: int32 [>= N / BLOCK_N] zeros (left zero).
    TP: ``out`` fp32 [N] gets this rank's partial (the splits' fp32 sum) instead; ``peer``
    (tiles_max >= ceil(N / BLOCK_N)) sums the ranks' partials and adds them to x."""
    N, K = w_down.shape
    c = cfg or config.get("down_residual", x.device, w_down.shape)
    bk = c["BLOCK_K"]
    k_per_split, split = down_split(K, c)                     # no empty splits
    n_blocks = triton.cdiv(N, c["BLOCK_N"])
    assert counter.numel() >= n_blocks and scratch.numel() >= split * N, "scratch too small"
    out_ptr, peer_ptr, ep = epilogue_args(x, out, peer, N, n_blocks)
    kw = {"launch_pdl": True} if use_pdl else {}
    _down_residual_kernel[(n_blocks, split)](
        h, w_down, x, scratch, counter, out_ptr, peer_ptr, N, K, k_per_split, w_down.stride(0),
        SPLIT_K=split, USE_PDL=use_pdl, FENCE=not config.interpreting(), **ep,
        BLOCK_N=c["BLOCK_N"], BLOCK_K=bk,
        PREFETCH=config.prefetch(c, k_per_split), num_warps=c["num_warps"], **kw)
