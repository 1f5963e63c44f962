"""Final RMSNorm + lm_head GEMV + greedy argmax, and the step's bookkeeping.

    logits = E @ (rmsnorm(x) * g)          E: [V, K] (tied: the embedding matrix)
    tok    = argmax(logits)                first index among equal maxima, like torch

Grid: one program per BLOCK_N vocabulary rows (151936 / 32 = 4748 for Qwen2.5-1.5B,
467 MB of weights: the single largest read of the step). Each program writes its logits
and its local (max, index); the last program to arrive (per-launch counter) reduces the
local maxima to the token, then does what the host would otherwise do between steps:
if the next position is past the prompt it stores the token into the sequence buffer
(during prefill the prompt's own next token stays), and advances the position. So the
next replay of the graph reads its input from the GPU, with no host round trip.

    logits    [V]                 fp32  (bf16-rounded values, as HF's bf16 model gives)
    part_val  [n_programs]        fp32  each program's max logit
    part_idx  [n_programs]        int32 ... and its index
    counter   [1]                 int32 arrivals, reset by the last program
    seq       [max_ctx]           int32 the token sequence; seq[pos + 1] = tok
    argmax    [max_ctx]           int32 argmax[pos + 1] = tok at every step, also inside
                                        the prompt (teacher-forced checks read it)
    pos       [1]                 int32 position of the token this step consumed; += 1

Tensor parallelism splits the vocabulary: rank r holds rows
[vocab_offset, vocab_offset + V_r) of E. With ``keys`` (fp32 [2 world]) the last program
writes only its (max logit, global index) into keys[2 rank], keys[2 rank + 1] and zeros
in every other slot (an all-reduce sums the ranks' buffers, then ``argmax_merge`` picks
the token and does the bookkeeping). With ``peer`` the last program exchanges that pair
with the other ranks itself (``peer.peer_sum``), merges (the largest value, the lowest
global index on a tie: the token one GPU picks) and does the bookkeeping: no other
launch.
"""
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from . import config
from ._common import (bf16_round, gemv_tiles, load_w_tiles, merge_keys, pdl_wait, rms_rstd,
                      step_bookkeeping, thread_fence)
from .peer import peer_sum


class Step(NamedTuple):
    """The step's bookkeeping buffers (int32), one tuple argument of the kernel."""
    seq: object          # [max_ctx] the token sequence
    argmax: object       # [max_ctx] the argmax at every position (``seq`` when not kept)
    pos: object          # [1] the position this step consumed
    prompt_len: object   # [1]


@triton.jit
def _lm_head_argmax_kernel(x_ptr, g_ptr, w_ptr, logits_ptr, part_val_ptr, part_idx_ptr,
                           counter_ptr, step, keys_ptr, peer_ptr, N, K, eps, stride_w_n,
                           n_programs, vocab_offset, rank, world, HAS_ARGMAX: tl.constexpr,
                           FENCE: tl.constexpr, USE_PDL: tl.constexpr,
                           KEYS: tl.constexpr, PEER: tl.constexpr, WORLD: tl.constexpr,
                           BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           BLOCK_R: tl.constexpr, PREFETCH: tl.constexpr,
                           BLOCK_W: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    w0, w1, w2, w3 = load_w_tiles(w_ptr, stride_w_n, offs_n, n_mask, 0, K, BLOCK_K,
                                  PREFETCH)
    pdl_wait(USE_PDL)
    rstd = rms_rstd(x_ptr, K, eps, BLOCK_K)
    y = gemv_tiles(w_ptr, stride_w_n, offs_n, n_mask, x_ptr, g_ptr, rstd, w0, w1, w2,
                   w3, 0, K, BLOCK_K, True, PREFETCH)
    y = bf16_round(y)
    tl.store(logits_ptr + offs_n, y, mask=n_mask)
    y = tl.where(n_mask, y, float("-inf"))
    best = tl.max(y, axis=0)
    best_idx = tl.min(tl.where(y == best, offs_n, 2147483647), axis=0)
    tl.store(part_val_ptr + pid, best)
    tl.store(part_idx_ptr + pid, best_idx)
    thread_fence(FENCE)                              # the partials are visible GPU-wide
    tl.debug_barrier()
    arrived = tl.atomic_add(counter_ptr, 1, sem="acq_rel")
    if arrived == n_programs - 1:
        r = tl.arange(0, BLOCK_R)
        run_val = tl.full([BLOCK_R], float("-inf"), tl.float32)
        run_idx = tl.full([BLOCK_R], 2147483647, tl.int32)
        for r0 in range(0, n_programs, BLOCK_R):
            rm = (r0 + r) < n_programs
            v = tl.load(part_val_ptr + r0 + r, mask=rm, other=float("-inf"),
                        volatile=True)
            i = tl.load(part_idx_ptr + r0 + r, mask=rm, other=2147483647, volatile=True)
            # programs come in index order, so on equal values the earlier entry wins
            take = v > run_val
            run_idx = tl.where(take, i, run_idx)
            run_val = tl.where(take, v, run_val)
        m = tl.max(run_val, axis=0)
        tok = tl.min(tl.where(run_val == m, run_idx, 2147483647), axis=0)
        if KEYS or PEER:
            # this rank's key pair at [2 rank, 2 rank + 1] of a [2 world] vector, zeros
            # elsewhere
            j = tl.arange(0, 2 * BLOCK_W)
            key = tl.where(j == 2 * rank, m,
                           tl.where(j == 2 * rank + 1,
                                    (tok + vocab_offset).to(tl.float32), 0.0))
            if PEER:   # summed over the ranks: every rank's pair; then one GPU's choice
                key = peer_sum(key, j, j < 2 * WORLD, 0, peer_ptr, WORLD, FENCE)
                # rank q's pair, gathered by a masked sum
                q = tl.arange(0, BLOCK_W)
                vals = tl.sum(tl.where(j[None, :] == 2 * q[:, None], key[None, :], 0.0),
                              axis=1)
                idxs = tl.sum(tl.where(j[None, :] == 2 * q[:, None] + 1, key[None, :],
                                       0.0), axis=1)
                tok = merge_keys(tl.where(q < WORLD, vals, float("-inf")),
                                 tl.where(q < WORLD, idxs, float("inf")))
                step_bookkeeping(tok, step.seq, step.argmax, step.pos, step.prompt_len,
                                 HAS_ARGMAX)
            else:
                tl.store(keys_ptr + j, key, mask=j < 2 * world)
        else:
            step_bookkeeping(tok, step.seq, step.argmax, step.pos, step.prompt_len,
                             HAS_ARGMAX)
        tl.store(counter_ptr, 0)


def lm_head_argmax(x, g, w, logits, part_val, part_idx, counter, seq, pos, prompt_len, eps,
                   use_pdl=False, cfg=None, argmax=None, keys=None, vocab_offset=0, rank=0, world=1,
                   peer=None):
    """One greedy step's tail. x: [K]; w: [V, K]; logits: fp32 [V]; part_*: [>= programs].
    TP (w holds vocabulary rows [vocab_offset, vocab_offset + V)): with ``keys`` fp32
    [2 world], write (max logit, global index) at [2 rank, 2 rank + 1], zeros elsewhere,
    and leave seq/argmax/pos alone; with ``peer`` (a site with n_max >= 2 world), merge
    over the ranks and do the bookkeeping (rank and world come from the site)."""
    N, K = w.shape
    c = cfg or config.get("lm_head_argmax", x.device, w.shape)
    n_prog = triton.cdiv(N, c["BLOCK_N"])
    assert part_val.numel() >= n_prog and part_idx.numel() >= n_prog
    assert keys is None or peer is None, "keys (unfused TP) or peer (fused TP), not both"
    if peer is not None:
        peer.check(2 * peer.world, 1)
        rank, world = peer.rank, peer.world
    if keys is not None:
        assert keys.dtype == torch.float32 and keys.numel() >= 2 * world and 0 <= rank < world
    assert vocab_offset + N < 2 ** 24, "indices travel as fp32"
    kw = {"launch_pdl": True} if use_pdl else {}
    _lm_head_argmax_kernel[(n_prog,)](
        x, g, w, logits, part_val, part_idx, counter,
        Step(seq, seq if argmax is None else argmax, pos, prompt_len),
        logits if keys is None else keys, logits if peer is None else peer.desc,
        N, K, eps, w.stride(0), n_prog, vocab_offset, rank, world,
        HAS_ARGMAX=argmax is not None, FENCE=not config.interpreting(), USE_PDL=use_pdl,
        KEYS=keys is not None, PEER=peer is not None, WORLD=world,
        BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"], BLOCK_R=1024,
        PREFETCH=config.prefetch(c, K), BLOCK_W=triton.next_power_of_2(world),
        num_warps=c["num_warps"], **kw)
    return n_prog


def programs_for(vocab: int, device, hidden: int | None = None) -> int:
    """Programs (and partial slots) the LM head launches for a [vocab, hidden] weight."""
    shape = None if hidden is None else (vocab, hidden)
    return triton.cdiv(vocab, config.get("lm_head_argmax", device, shape)["BLOCK_N"])
