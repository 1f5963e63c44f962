"""Down-projection + residual add, split over K.

    x[n] = x[n] + (W_down @ h)[n]          W_down: [N, K] = [hidden, I]   (1536 x 8960)

With one program per BLOCK_N rows there are only N / BLOCK_N = 96 programs, fewer than
the SMs, each walking 8960 columns: the plain GEMV reaches about a third of the bandwidth
(ANCHORS.md). So the K axis is split too: grid (N / BLOCK_N, SPLIT_K). Each program adds
its partial dot products into an fp32 scratch row with atomics and bumps a per-row-block
counter; the program that arrives last for a row block (the threadfence-reduction
pattern) takes the sums out of the scratch with an atomic read and zeroes it for the
next call, adds the residual, writes x and resets the counter. No second launch,
and the scratch and counters are left clean, as a replayed CUDA graph needs.

    scratch  [N]            fp32   zero between calls
    counter  [N / BLOCK_N]  int32  zero between calls

Bytes: N*K*2 of weights (27.5 MB a layer), N*4*SPLIT_K of atomics in L2.
"""
import triton
import triton.language as tl

from . import config
from ._common import bf16_round, gemv_tiles, load_w_tile, pdl_wait, thread_fence


@triton.jit
def _down_residual_kernel(h_ptr, w_ptr, x_ptr, scratch_ptr, counter_ptr, N, K, k_per_split,
                          stride_w_n, SPLIT_K: tl.constexpr, USE_PDL: tl.constexpr, FENCE: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    k_start = pid_k * k_per_split
    k_end = tl.minimum(k_start + k_per_split, K)
    w_first = load_w_tile(w_ptr, stride_w_n, offs_n, n_mask, k_start, k_end, BLOCK_K)
    pdl_wait(USE_PDL)
    y = gemv_tiles(w_ptr, stride_w_n, offs_n, n_mask, h_ptr, h_ptr, 1.0, w_first, k_start, k_end,
                   BLOCK_K, False)
    if SPLIT_K == 1:
        total = y
        last = True
    else:
        tl.atomic_add(scratch_ptr + offs_n, y, mask=n_mask, sem="relaxed")
        thread_fence(FENCE)                                  # this thread's adds are visible
        tl.debug_barrier()                                   # ... and every thread's
        arrived = tl.atomic_add(counter_ptr + pid_n, 1, sem="acq_rel")
        last = arrived == SPLIT_K - 1
        total = y
    if last:
        if SPLIT_K > 1:
            # read the sums coherently (an atomic add of zero), then leave zeros behind
            total = tl.atomic_add(scratch_ptr + offs_n, tl.zeros_like(y), mask=n_mask, sem="acq_rel")
            tl.store(scratch_ptr + offs_n, tl.zeros_like(y), mask=n_mask)
            tl.store(counter_ptr + pid_n, 0)
        total = bf16_round(total)          # the projection's bf16 output
        x = tl.load(x_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        tl.store(x_ptr + offs_n, bf16_round(x + total).to(x_ptr.dtype.element_ty), mask=n_mask)


def down_residual(h, w_down, x, scratch, counter, use_pdl=False, cfg=None):
    """x += W_down @ h, in place.  h: [K], w_down: [N, K], x: [N];
    scratch: fp32 [N] zeros, counter: int32 [>= N / BLOCK_N] zeros (both left zero)."""
    N, K = w_down.shape
    c = cfg or config.get("down", x.device)
    split = c["SPLIT_K"]
    bk = c["BLOCK_K"]
    k_per_split = triton.cdiv(triton.cdiv(K, split), bk) * bk
    split = triton.cdiv(K, k_per_split)                       # no empty splits
    n_blocks = triton.cdiv(N, c["BLOCK_N"])
    assert counter.numel() >= n_blocks and scratch.numel() >= N
    kw = {"launch_pdl": True} if use_pdl else {}
    _down_residual_kernel[(n_blocks, split)](
        h, w_down, x, scratch, counter, N, K, k_per_split, w_down.stride(0), SPLIT_K=split,
        USE_PDL=use_pdl, FENCE=not config.interpreting(), BLOCK_N=c["BLOCK_N"], BLOCK_K=bk, num_warps=c["num_warps"], **kw)
