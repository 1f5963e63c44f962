"""RoPE + KV-cache write + split-K attention partial, as one device function: the
persistent layer's attention phase with RoPE folded in (``layer_persistent``,
``FOLD_ROPE``), one barrier fewer a layer than RoPE in its own phase.

For the live share [start, end) of kv head ``kh`` (split ``split``; ``split_range``),
after the caller's wait, with the first tile of keys and values older than pos already
requested (k0, v0, tm0: ``load_kv_tile``):

1. the GROUP query heads of kv head kh are rotated from the un-rotated ``qkv`` with
   ``rope_kv_write``'s own helper (same products, same roundings), so q never goes through
   memory;
2. the program whose share holds ``pos`` (the new token) also rotates the new k of its
   kv head and writes k and v at ``pos``, as ``rope_kv_write`` does, and folds that token
   into its online softmax from registers, as the tile of one valid row that
   ``_attn_partial_kernel`` loads from slot pos (same values, same tl.dot): no program
   reads slot pos from memory here, so no ordering between programs is needed for it;
3. the split-K partial, as ``_attn_partial_kernel`` (same tiles in the same order, same
   online softmax, same partial buffers).

    qkv      [(Hq + 2Hkv) D]      bf16   q|k|v of this token, before RoPE
    k_cache  [Hkv, C, D]          bf16   one layer's cache (any strides over Hkv, C)
    v_cache  [Hkv, C, D]          bf16   same layout as k_cache
    cos, sin [C, D]               bf16   RoPE tables, rounded to the model dtype
    part_o   [Hq, n_splits, D]    fp32   this split's column written
    part_m   [Hq, n_splits]       fp32   "
    part_l   [Hq, n_splits]       fp32   "

Bit for bit ``rope_kv_write`` followed by ``attention_partial``. The same function ran
in a standalone one-kernel attention (RoPE, KV write, partial and merge in one launch,
``lab/attention_onekernel.py``), measured no faster than the separate kernels on the H200
(``results/h200/2026-11-29_launch-tuning/ladder_d5af865030f4.json``,
``results/h200/2026-11-30_o-merge-and-l2-prefetch/rope_check.json``) and moved to the lab.
"""
import triton
import triton.language as tl

from ._common import bf16_round
from .attention_splitk import NEW_T, split_partial, store_partials
from .rope_kv_write import _rope_pair


@triton.jit
def rope_partial(qkv_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, part_o_ptr, part_m_ptr,
                 part_l_ptr, pos, kh, split, start, end, k0, v0, tm0, stride_c_h, stride_c_t,
                 n_splits, scale, HQ, HKV, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                 D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
                 DOT_F32: tl.constexpr):
    """Steps 1-3 of the module docstring for the live share [start, end) of kv head ``kh`` (split
    ``split``), after the wait: the GROUP query heads rotated in registers, the new token
    (where the share holds it) rotated, written to the cache at pos and folded in from
    registers, then the split-K partial from the early tile (k0, v0, tm0) on."""
    HALF: tl.constexpr = D // 2
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    base = kh * stride_c_h
    length = pos + 1
    # ---- RoPE, as rope_kv_write: rotate_half as a gather with a sign -----------------
    partner = tl.where(d < HALF, d + HALF, d - HALF)
    sign = tl.where(d < HALF, -1.0, 1.0)
    cos_row = cos_ptr + pos * D
    sin_row = sin_ptr + pos * D
    holds_pos = end == length                        # this share holds the new token
    # the new token as a tile whose only valid row is row 0: what _attn_partial_kernel
    # loads from slot pos (zeros elsewhere), built from registers
    r = tl.arange(0, NEW_T)
    row0 = (r == 0)[:, None] & dm[None, :]
    kn = tl.zeros([NEW_T, BLOCK_D], tl.float32).to(k_cache_ptr.dtype.element_ty)
    vn = kn
    if holds_pos:
        y = _rope_pair(qkv_ptr + (HQ + kh) * D, cos_row, sin_row, d, partner, sign, dm,
                       qkv_ptr, 1.0, False)
        k_new = bf16_round(y)                        # the bf16 value rope_kv_write stores
        v_new = tl.load(qkv_ptr + (HQ + HKV + kh) * D + d, mask=dm, other=0.0)
        slot = base + pos * stride_c_t
        tl.store(k_cache_ptr + slot + d, k_new.to(k_cache_ptr.dtype.element_ty), mask=dm)
        tl.store(v_cache_ptr + slot + d, v_new, mask=dm)
        kn = tl.where(row0, k_new[None, :], 0.0).to(k_cache_ptr.dtype.element_ty)
        vn = tl.where(row0, v_new.to(tl.float32)[None, :], 0.0).to(v_cache_ptr.dtype.element_ty)
    tmn = (r == 0) & holds_pos
    # the GROUP query heads of this kv head, rotated in registers ([GROUP_PAD, BLOCK_D];
    # element-wise the same arithmetic as rope_kv_write's, so the same bits)
    g = tl.arange(0, GROUP_PAD)
    gm = g < GROUP
    heads = kh * GROUP + g
    qm = gm[:, None] & dm[None, :]
    q = _rope_pair(qkv_ptr + heads[:, None] * D, cos_row, sin_row, d[None, :],
                   partner[None, :], sign[None, :], qm, qkv_ptr, 1.0, False)
    q = bf16_round(q)                                # the bf16 value rope_kv_write stores
    if DOT_F32:
        q = q.to(tl.float32)
    else:
        q = q.to(k_cache_ptr.dtype.element_ty)       # exact: q is already a bf16 value
    # ---- split-K partial: the helpers _attn_partial_kernel uses ----------------------
    m_i, l_i, acc = split_partial(q, k_cache_ptr, v_cache_ptr, base, start, end, pos,
                                  stride_c_t, d, dm, scale, k0, v0, tm0, kn, vn, tmn,
                                  GROUP_PAD, BLOCK_D, BLOCK_T, DOT_F32)
    store_partials(part_o_ptr, part_m_ptr, part_l_ptr, heads, gm, split, n_splits, m_i, l_i,
                   acc, d, dm, D)
