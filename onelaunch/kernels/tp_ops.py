"""Small kernels that only tensor parallelism needs (unfused TP, and its one-shot rung).

    residual_add(s, x)          x = bf16(x + bf16(s))    s: the all-reduced fp32 partials
    allreduce_residual(p, x)    the same, the partials summed over the ranks in this launch
                                (peer stores, ``peer.peer_sum``): one kernel per reduction
    argmax_merge(keys, ...)     the token from every rank's (max logit, global index), then
                                lm_head_argmax's bookkeeping
    qk_sumsq(qkv, ss)           ss = (sum q^2, sum k^2) of this rank's q and k slices: the
                                statistic of OLMoE's q/k RMSNorm, summed over the ranks
                                before ``rope_kv_write(..., ss=ss)`` (with ``peer``: here)

Each is latency, not bytes: a few KB, one to a few programs.
"""
import torch
import triton
import triton.language as tl

from . import config
from ._common import finish_rows, merge_keys, pdl_wait, step_bookkeeping, sum_sq
from .peer import peer_sum


@triton.jit
def _residual_add_kernel(s_ptr, x_ptr, peer_ptr, N, USE_PDL: tl.constexpr, PEER: tl.constexpr,
                         WORLD: tl.constexpr, FENCE: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    pdl_wait(USE_PDL)
    s = tl.load(s_ptr + offs, mask=m, other=0.0)
    finish_rows(s, x_ptr, x_ptr, offs, m, pid, peer_ptr, False, PEER, WORLD, FENCE)


def residual_add(s, x, use_pdl=False):
    """x = bf16(x + bf16(s)), in place. s: fp32 [N] (the ranks' partials, summed); x: [N]."""
    N = x.numel()
    assert s.dtype == torch.float32 and s.numel() >= N
    block = 1024
    kw = {"launch_pdl": True} if use_pdl else {}
    _residual_add_kernel[(triton.cdiv(N, block),)](
        s, x, x, N, USE_PDL=use_pdl, PEER=False, WORLD=1, FENCE=False, BLOCK=block, num_warps=4, **kw)


def allreduce_residual(partial, x, site, use_pdl=False, block=None):
    """x = bf16(x + bf16(sum over ranks of partial)), in place, on every rank: partial
    fp32 [N] (this rank's), the sum in rank order (the same bits everywhere). One
    launch; ``block`` values per program (default: all of N, up to 4096, in one
    program), so ``site`` needs n_max >= N and tiles_max >= ceil(N / block)."""
    N = x.numel()
    assert partial.dtype == torch.float32 and partial.numel() >= N
    block = block or min(4096, triton.next_power_of_2(N))
    tiles = triton.cdiv(N, block)
    site.check(N, tiles)
    kw = {"launch_pdl": True} if use_pdl else {}
    _residual_add_kernel[(tiles,)](
        partial, x, site.desc, N, USE_PDL=use_pdl, PEER=True, WORLD=site.world,
        FENCE=not config.interpreting(), BLOCK=block, num_warps=4, **kw)


@triton.jit
def _argmax_merge_kernel(keys_ptr, seq_ptr, argmax_ptr, pos_ptr, prompt_len_ptr, world,
                         HAS_ARGMAX: tl.constexpr, USE_PDL: tl.constexpr, BLOCK_W: tl.constexpr):
    pdl_wait(USE_PDL)
    r = tl.arange(0, BLOCK_W)
    m = r < world
    vals = tl.load(keys_ptr + 2 * r, mask=m, other=float("-inf"))
    idxs = tl.load(keys_ptr + 2 * r + 1, mask=m, other=float("inf"))
    step_bookkeeping(merge_keys(vals, idxs), seq_ptr, argmax_ptr, pos_ptr, prompt_len_ptr, HAS_ARGMAX)


def argmax_merge(keys, seq, pos, prompt_len, world, use_pdl=False, argmax=None):
    """The step's token from keys fp32 [2 world] (rank r's max logit at 2r, its global index
    at 2r + 1; the largest value wins, the lowest index on a tie), then what
    lm_head_argmax's last program does with it: argmax[pos + 1] = tok (if given),
    seq[pos + 1] = tok once past the prompt, pos += 1. One program."""
    assert keys.dtype == torch.float32 and keys.numel() >= 2 * world
    kw = {"launch_pdl": True} if use_pdl else {}
    _argmax_merge_kernel[(1,)](
        keys, seq, seq if argmax is None else argmax, pos, prompt_len, world,
        HAS_ARGMAX=argmax is not None, USE_PDL=use_pdl,
        BLOCK_W=max(2, triton.next_power_of_2(world)), num_warps=1, **kw)


@triton.jit
def _qk_sumsq_kernel(qkv_ptr, ss_ptr, peer_ptr, q_size, kv_size, USE_PDL: tl.constexpr,
                     PEER: tl.constexpr, WORLD: tl.constexpr, FENCE: tl.constexpr,
                     BLOCK_R: tl.constexpr):
    pdl_wait(USE_PDL)
    sq = sum_sq(qkv_ptr, q_size, BLOCK_R)                 # as rope_kv_write's QK_NORM sums
    sk = sum_sq(qkv_ptr + q_size, kv_size, BLOCK_R)
    j = tl.arange(0, 2)
    y = tl.where(j == 0, sq, sk)
    if PEER:
        y = peer_sum(y, j, j < 2, 0, peer_ptr, WORLD, FENCE)
    tl.store(ss_ptr + j, y)


def qk_sumsq(qkv, ss, q_size, kv_size, use_pdl=False, peer=None):
    """ss fp32 [2] = (sum of qkv[0:q_size]^2, sum of qkv[q_size:q_size + kv_size]^2), in fp32,
    summed as rope_kv_write sums for its q/k norm (BLOCK_R lanes, min(1024, next power of 2
    of q_size): at one rank, the same bits). With ``peer`` (n_max >= 2) summed over the
    ranks, in rank order: ss then holds the whole model's statistic on every rank."""
    assert ss.dtype == torch.float32 and ss.numel() >= 2
    if peer is not None:
        peer.check(2, 1)
    kw = {"launch_pdl": True} if use_pdl else {}
    _qk_sumsq_kernel[(1,)](
        qkv, ss, qkv if peer is None else peer.desc, q_size, kv_size, USE_PDL=use_pdl,
        PEER=peer is not None, WORLD=1 if peer is None else peer.world,
        FENCE=not config.interpreting(), BLOCK_R=min(1024, triton.next_power_of_2(q_size)),
        num_warps=4, **kw)
