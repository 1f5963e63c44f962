"""Lab variant (refuted; GPU or Triton's interpreter): is one launch for RoPE + KV-cache
write + split-K flash-decode attention + its reduction faster than the three launches it
replaces? Not imported by the package; its device function ``rope_partial`` (steps 1-3
below) is, as the persistent layer's attention phase with RoPE folded in
(``onelaunch/kernels/rope_attention_partial.py``).

    python -m pytest lab/test_attention_onekernel.py   # bit for bit against the chain
                                                       # (interpreted on a CPU)

Measured (`results/h200/2026-11-29_launch-tuning/ladder_d5af865030f4.json`,
`results/h200/2026-11-30_o-merge-and-l2-prefetch/rope_check.json`): as the engine's "+
RoPE in attention" rung (``fuse_reduce=False``, 170 launches a step against 198), 1.196
against 1.185 ms at ctx 512 at d5af865030f4, and no difference beyond the noise at ctx 512
and 2048 on 2026-11-30: 28 launches fewer a step bought nothing measurable. The fully
fused version (merge by last arrival) is slower still where GROUP is large (the table
below). The engine's ``fuse_rope`` flag and the rung were removed with this file's move.

RoPE + KV-cache write + split-K flash-decode attention + its reduction, in one launch.

Replaces ``rope_kv_write`` followed by ``attention_splitk`` (its partial and reduce
kernels): three launches per layer become one (two with ``fuse_reduce=False``), with
bit for bit the same results.

    q[h]             = rope(qkv[q part, head h], pos)            kept in registers
    k_cache[kh, pos] = rope(qkv[k part, head kh], pos)
    v_cache[kh, pos] = qkv[v part, head kh]
    per split s:  part_m[h, s], part_l[h, s], part_o[h, s, :]    (online softmax, as
                  ``_attention_partial_kernel``: max, sum of exp, unnormalised sum of exp * v)
    out[h]           = sum_s exp(part_m - M) part_o / sum_s exp(part_m - M) part_l,
                       M = max_s part_m                          (as ``_attention_reduce_kernel``)

Grid (Hkv, n_splits), the partial kernel's: program (kh, s) owns split s's share
[start, end) of kv head kh's live timeline (``split_range``: the live length in units of
CHUNK, shared out over the fixed grid at run time from pos) and the GROUP query heads that
share it. A program whose share is empty (past the live length) exits at once.

0. Before its PDL wait, each program reads pos and requests its first tile of keys and
   values older than pos (written by earlier steps; see ``attention_splitk``).
1. Every program with a share rotates its GROUP query heads from the un-rotated ``qkv``
   with ``rope_kv_write``'s own helper (same products, same roundings), so q never goes
   through memory: the q buffer's write and read-back disappear.
2. The program whose share holds ``pos`` (the new token) also rotates the new k of its kv
   head and writes k and v at ``pos``, as ``rope_kv_write`` does, and folds that token
   into its online softmax from registers, as the tile of one valid row that
   ``_attention_partial_kernel`` loads from slot pos (same values, same tl.dot): no program
   reads slot pos from memory here, so no barrier and no ordering between programs is
   needed for it.
3. The split-K partial, as ``_attention_partial_kernel`` (same tiles in the same order, same
   online softmax, same partial buffers).
4. The reduction, by last arrival (the threadfence-reduction pattern, as in
   ``down_residual``): each program that holds a token writes its partials, fences, and
   bumps its kv head's counter. All programs read the same pos, so all know how many
   splits hold a token (``live_splits``); one past the length writes nothing and need
   not arrive. The last of them to arrive merges the live splits of each of the
   GROUP query heads with the reduce kernel's own helper (``merge_head``: the maxima in
   one load, then BLOCK_S = 32 splits a block), writes ``out`` and resets the counter.

With ``fuse_reduce=False`` the launcher skips step 4 and launches the split-K reduce
kernel instead: two launches, RoPE still fused into the partial.

Buffers (all on the device; the launch shape never changes, so a CUDA graph replays it):

    qkv      [(Hq + 2Hkv) D]      bf16   q|k|v of this token, before RoPE
    k_cache  [Hkv, C, D]          bf16   one layer's cache (any strides over Hkv, C)
    v_cache  [Hkv, C, D]          bf16   same layout as k_cache
    cos, sin [C, D]               bf16   RoPE tables, rounded to the model dtype
    pos      [1]                  int32  the new token's position; length = pos + 1
    part_o   [Hq, n_splits, D]    fp32   overwritten for the valid splits
    part_m   [Hq, n_splits]       fp32   "
    part_l   [Hq, n_splits]       fp32   "
    counter  [Hkv]                int32  zero between calls, left zero
    out      [Hq D]               bf16   attention output

Bytes: the KV read, 2 * length * Hkv * D * 2 per layer, as before, plus
Hq * n_live * (D + 2) * 4 of partials written and read back through L2 and about
(Hq + 2Hkv) D * 2 of qkv; the q vector no longer makes a round trip through memory.

Why: at batch 1 the RoPE kernel moves about 4 KB and the reduce kernel a few KB, so each
is all fixed cost, about 1-1.5 us a launch on an H200 even with PDL; fusing saves one
launch (RoPE) or two (RoPE and the reduce) per layer. What the merge costs in return:
it runs in the one program that arrives last, after everything else, and walks its GROUP
heads one after another, each one or two dependent L2 round trips (about 0.5 us each
there). Measured on the H200 (CUDA graph of 200 calls, us a call, three launches /
one kernel / fuse_reduce=False, PDL on):
    qwen2.5-1.5b (GROUP 6), length 256:    8.6 / 13.2 / 8.1;   32768:  18.3 / 38.9 / 17.0
    olmoe-1b-7b  (GROUP 1), length 64:     5.8 /  5.0 / 5.3;    4096:  17.8 / 17.8 / 16.5
So the single launch pays only where GROUP is small and the context short; with grouped
queries, two launches (``fuse_reduce=False``) are the faster choice at every length.
Bit-identity of the merge with the reduce kernel on a GPU also needs the same num_warps
(4, the reduce kernel's): its sums over splits follow the register layout, and at 8 warps
one length of the two-pass merge differed in the last bits (still deterministic).

The split-K stage is Dao et al.'s flash-decoding; the in-kernel merge is the last-block
("threadfence") reduction of the CUDA samples, which keeps the merge order fixed
(deterministic), unlike atomic accumulation.
"""
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from onelaunch.kernels import config  # noqa: E402
from onelaunch.kernels._common import bf16_round, pdl_wait, thread_fence  # noqa: E402
from onelaunch.kernels.attention_splitk import (BLOCK_S, attention_reduce,  # noqa: E402
                                                block_m, live_share, live_splits,
                                                load_kv_tile, merge_head, split_range)
from onelaunch.kernels.rope_attention_partial import rope_partial  # noqa: E402


@triton.jit
def _attn_onekernel_kernel(qkv_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, pos_ptr, out_ptr,
                           part_o_ptr, part_m_ptr, part_l_ptr, counter_ptr,
                           stride_c_h, stride_c_t, n_splits, n_share, scale, HQ, HKV,
                           GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr,
                           BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_T: tl.constexpr,
                           BLOCK_S: tl.constexpr, BLOCK_M: tl.constexpr, DOT_F32: tl.constexpr,
                           LAST_ARRIVAL: tl.constexpr, FENCE: tl.constexpr,
                           USE_PDL: tl.constexpr):
    kh = tl.program_id(0)
    split = tl.program_id(1)
    # ---- before the wait: pos (the previous step's) and the first tile older than pos ----
    pos = tl.load(pos_ptr)
    start, end = split_range(pos, split, n_share, CHUNK)
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    if start < end:                                      # else: past the live length, exit
        base = kh * stride_c_h
        k0, v0, tm0 = load_kv_tile(k_cache_ptr, v_cache_ptr, base, start, tl.minimum(end, pos),
                                   stride_c_t, d, dm, BLOCK_T)
        pdl_wait(USE_PDL)
        rope_partial(qkv_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, part_o_ptr,
                     part_m_ptr, part_l_ptr, pos, kh, split, start, end, k0, v0, tm0,
                     stride_c_h, stride_c_t, n_splits, scale, HQ, HKV, GROUP, GROUP_PAD, D,
                     BLOCK_D, BLOCK_T, DOT_F32)
        if LAST_ARRIVAL:
            # ---- the last of the live programs of kv head kh merges its GROUP heads ------
            # Every program reads the same pos, so all agree on how many splits are live; a
            # program past the length wrote nothing and does not arrive.
            n_valid = live_splits(pos, n_share, CHUNK)
            thread_fence(FENCE)                          # this thread's partials are visible
            tl.debug_barrier()                           # ... and every thread's
            arrived = tl.atomic_add(counter_ptr + kh, 1, sem="acq_rel")
            if arrived == n_valid - 1:
                for i in range(GROUP):                   # the reduce kernel's merge, per head
                    h = kh * GROUP + i
                    o_h = merge_head(part_o_ptr, part_m_ptr, part_l_ptr, h, n_splits, n_valid,
                                     d, dm, D, BLOCK_D, BLOCK_S, BLOCK_M, True)
                    tl.store(out_ptr + h * D + d, bf16_round(o_h).to(out_ptr.dtype.element_ty),
                             mask=dm)
                tl.store(counter_ptr + kh, 0)            # zero for the next call


def attention_onekernel(qkv, k_cache, v_cache, cos, sin, out, pos, part_o, part_m, part_l, counter,
                        heads, kv_heads, head_dim, chunk, cfg, use_pdl=0, fuse_reduce=True,
                        launch_reduce=True, live_cap=None):
    """rope_kv_write + attention_splitk in one launch. qkv: [(Hq+2Hkv) D] before RoPE;
    k_cache, v_cache: one layer's [Hkv, C, D] (k, v at pos written here); cos, sin: [C, D];
    out: [Hq D]; pos: int32 [1] on the device; part_*: [Hq, n_splits(, D)] fp32;
    counter: int32 [>= Hkv] zeros (left zero; unused without fuse_reduce); cfg: the
    "attn_split" entry. use_pdl: passed to pdl_wait. fuse_reduce=False: merge with
    the split-K reduce kernel, a second launch, instead of by last arrival (with
    launch_reduce=False the caller launches it: ``attention_reduce``). live_cap: the
    live splits a kv head at most (``attention_splitk.live_share``)."""
    n_splits = part_m.shape[1]
    group = heads // kv_heads
    block_t = min(cfg["BLOCK_T"], chunk)
    assert chunk % block_t == 0, "a tile must not straddle two chunks"
    assert head_dim % 2 == 0, "RoPE pairs element d with d + D/2"
    assert counter.dtype == torch.int32 and counter.numel() >= kv_heads, "counter too small"
    assert n_splits >= 1, "at least one split"
    kw = {"launch_pdl": True} if use_pdl else {}
    _attn_onekernel_kernel[(kv_heads, n_splits)](
        qkv, k_cache, v_cache, cos, sin, pos, out, part_o, part_m, part_l, counter,
        k_cache.stride(0), k_cache.stride(1), n_splits, live_share(n_splits, live_cap),
        head_dim ** -0.5, heads, kv_heads,
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), D=head_dim,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)), CHUNK=chunk, BLOCK_T=block_t,
        BLOCK_S=BLOCK_S, BLOCK_M=block_m(n_splits), DOT_F32=config.interpreting(),
        LAST_ARRIVAL=fuse_reduce, FENCE=not config.interpreting(), USE_PDL=use_pdl,
        num_warps=cfg["num_warps"], **kw)
    if not fuse_reduce and launch_reduce:                # two launches: the reduce kernel
        attention_reduce(part_o, part_m, part_l, out, pos, head_dim, chunk, use_pdl, live_cap=live_cap)

