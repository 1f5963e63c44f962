"""O-projection + residual add.

    x[n] = x[n] + (W_o @ attn)[n]          W_o: [N, K] = [hidden, Hq D], x: [N] bf16

The residual update happens in the GEMV's epilogue, in place: a program reads and writes
only its own BLOCK_N rows of x, and reads only ``attn`` otherwise, so no two programs
touch the same bytes. Grid: one program per BLOCK_N rows. Bytes: N*K*2 of weights
(Qwen2.5-1.5B: 4.7 MB a layer), N*2 read and written for the residual.

MERGE (short contexts): the kernel reads the split-K partials instead of ``attn`` and merges
every head's live splits itself, in its prologue (``attention_splitk.merge_heads``), so the
reduce kernel has nothing to do (``attention_reduce``'s ``few``) or is not launched. Each
program merges all heads (it needs the whole vector): Hq * n_live * (D + 2) * 4 bytes of L2
reads a program, which is why it stops at a few live splits (``few``). Needs the whole of K in
one tile (BLOCK_K = next_pow2(Hq) * D, PREFETCH 1): the merged [Hq, D] tile is the
activation, rounded to bf16 as the reduce kernel rounds ``attn``.

Tensor parallelism (row-parallel: each rank holds a column slice of W_o and the matching
slice of ``attn``): with ``out`` the rank's partial goes, unrounded, to ``out`` and x is
left alone; with ``peer`` each program sums its rows' partials over the ranks itself
(``peer.peer_sum``) and then adds the residual. See ``_common.finish_rows``.
"""
import triton
import triton.language as tl

from . import config
from ._common import bf16_round, finish_rows, gemv_tiles, pdl_wait, row_tiles
from .attention_splitk import live_share, live_splits, merge_heads
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
                            part_o_ptr, part_m_ptr, part_l_ptr, pos_ptr, n_splits, n_share,
                            USE_PDL: tl.constexpr, OUT: tl.constexpr, PEER: tl.constexpr,
                            WORLD: tl.constexpr, FENCE: tl.constexpr,
                            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PREFETCH: tl.constexpr,
                            MERGE: tl.constexpr, HEADS: tl.constexpr, H_PAD: tl.constexpr,
                            D: tl.constexpr, CHUNK: tl.constexpr, STAGES: tl.constexpr,
                            FEW: tl.constexpr):
    pid = tl.program_id(0)
    w0, w1, w2, w3 = row_tiles(w_ptr, stride_w_n, N, pid, 0, K, BLOCK_N, BLOCK_K, PREFETCH)
    if MERGE:
        n_valid = live_splits(tl.load(pos_ptr), n_share, CHUNK)     # pos is old: before the wait
        pdl_wait(USE_PDL)
        if n_valid <= FEW:                      # merge the partials here: the reduce did not
            a = merge_heads(part_o_ptr, part_m_ptr, part_l_ptr, n_splits, n_valid, HEADS,
                            H_PAD, D, D, FEW, STAGES)
            a = tl.reshape(bf16_round(a), [BLOCK_K])        # attn as the reduce rounds it
            offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
            y = tl.sum(w0.to(tl.float32) * a[None, :], axis=1)
            finish_rows(y, x_ptr, out_ptr, offs_n, offs_n < N, pid, peer_ptr, OUT, PEER,
                        WORLD, FENCE)
        else:
            o_proj_tile(a_ptr, w_ptr, x_ptr, out_ptr, peer_ptr, N, K, stride_w_n, pid, w0, w1,
                        w2, w3, OUT, PEER, WORLD, FENCE, BLOCK_N, BLOCK_K, PREFETCH)
    else:
        pdl_wait(USE_PDL)
        o_proj_tile(a_ptr, w_ptr, x_ptr, out_ptr, peer_ptr, N, K, stride_w_n, pid, w0, w1, w2,
                    w3, OUT, PEER, WORLD, FENCE, BLOCK_N, BLOCK_K, PREFETCH)


def o_proj_residual(attn, w_o, x, use_pdl=False, cfg=None, out=None, peer=None, merge=None):
    """x += W_o @ attn, in place.  attn: [K], w_o: [N, K], x: [N].
    TP: ``out`` fp32 [N] gets this rank's partial W_o @ attn (fp32, unrounded) and x is left
    alone; ``peer`` (a ``PeerBuffers`` site, tiles_max >= ceil(N / BLOCK_N)) sums the ranks'
    partials in rank order and adds them to x on every rank.
    ``merge``: (part_o, part_m, part_l, pos, chunk, live_cap, few): the split-K partials
    [Hq, n_splits(, D)] to merge instead of reading ``attn`` while at most ``few`` splits
    are live (past that ``attn``, from ``attention_reduce(..., few=few)``); K in one tile
    of next_pow2(Hq) * D (``plan.o_merge``: when the plan asks for it)."""
    N, K = w_o.shape
    c = cfg or config.get("o_proj", x.device, w_o.shape)
    n_blocks = triton.cdiv(N, c["BLOCK_N"])
    out_ptr, peer_ptr, ep = epilogue_args(x, out, peer, N, n_blocks)
    kw = {"launch_pdl": True} if use_pdl else {}
    if merge is not None:
        part_o, part_m, part_l, pos, chunk, live_cap, few = merge
        heads, n_splits, D = part_o.shape
        assert c["BLOCK_K"] == triton.next_power_of_2(heads) * D and heads * D == K
        assert few & (few - 1) == 0, "few: a power of two"
        mk = dict(MERGE=True, HEADS=heads, H_PAD=triton.next_power_of_2(heads), D=D,
                  CHUNK=chunk, STAGES=c.get("MERGE_STAGES", 3), FEW=few)
        margs = (part_o, part_m, part_l, pos, n_splits, live_share(n_splits, live_cap))
        prefetch = 1
    else:
        mk = dict(MERGE=False, HEADS=1, H_PAD=1, D=1, CHUNK=1, STAGES=1, FEW=0)
        margs = (x, x, x, x, 1, 1)
        prefetch = config.prefetch(c, K)
    _o_proj_residual_kernel[(n_blocks,)](
        attn, w_o, x, out_ptr, peer_ptr, N, K, w_o.stride(0), *margs, USE_PDL=use_pdl,
        FENCE=not config.interpreting(), **ep, BLOCK_N=c["BLOCK_N"],
        BLOCK_K=c["BLOCK_K"], PREFETCH=prefetch, num_warps=c["num_warps"], **mk, **kw)
