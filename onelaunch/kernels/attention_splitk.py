"""Split-K flash-decode attention: a partial kernel and a reduce kernel.

Stage 1, ``_attn_partial_kernel``: one program per (kv head, split). Split s owns the
chunk [s*CHUNK, (s+1)*CHUNK) of the KV timeline and all GROUP query heads that share its
KV head, so each K/V byte is read once, not GROUP times. Over its chunk it runs an online
softmax in BLOCK_T tiles and writes, per query head h:

    part_m[h, s]    fp32  max score in the chunk
    part_l[h, s]    fp32  sum_t exp(s_t - part_m)
    part_o[h, s, :] fp32  sum_t exp(s_t - part_m) v_t           (unnormalised)

Stage 2, ``_attn_reduce_kernel``: one program per query head merges the valid splits:

    M   = max_s part_m[h, s]
    out = sum_s exp(part_m - M) part_o / sum_s exp(part_m - M) part_l

Both launches have one fixed shape up to the engine's max context: the number of splits is
fixed by max_ctx, and a chunk that starts at or past the current length (read from a
device tensor) does nothing and is skipped by the reduce, so the same recorded launch
serves every step of a CUDA graph. A tile never reads past its own chunk's end: the
seed post's double-counting bug was a tile wider than the chunk. Scores use tl.dot with
the query group padded to 16 rows (the smallest MMA). The idea is Dao et al.'s
flash-decoding; the stage split follows vLLM's triton_decode_attention.
Bytes: 2 * length * Hkv * D * 2 read per layer, plus Hq * n_valid * (D + 2) * 4 of partials
written and read back.
"""
import triton
import triton.language as tl

from . import config
from ._common import bf16_round, pdl_wait


@triton.jit
def partial_tiles(q, k_cache_ptr, v_cache_ptr, base, start, end, stride_c_t, d, dm, scale,
                  GROUP_PAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
                  DOT_F32: tl.constexpr):
    """The online softmax of one chunk [start, end) of one kv head's timeline, for the
    GROUP_PAD query rows in ``q`` ([GROUP_PAD, BLOCK_D], bf16, or fp32 with DOT_F32).
    Returns (m, l, acc): the max score, sum of exp(s - m), and unnormalised sum of
    exp(s - m) v, per row. Shared by every kernel that computes split-K partials."""
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    for t0 in range(start, end, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        tm = t < end
        offs = base + t[:, None] * stride_c_t + d[None, :]
        kv_mask = tm[:, None] & dm[None, :]
        k = tl.load(k_cache_ptr + offs, mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + offs, mask=kv_mask, other=0.0)
        if DOT_F32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * scale                         # [GROUP_PAD, BLOCK_T]
        s = tl.where(tm[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)      # [GROUP_PAD, BLOCK_D]
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def store_partials(part_o_ptr, part_m_ptr, part_l_ptr, heads, gm, split, n_splits, m_i, l_i, acc,
                   d, dm, D: tl.constexpr):
    row = heads * n_splits + split
    tl.store(part_m_ptr + row, m_i, mask=gm)
    tl.store(part_l_ptr + row, l_i, mask=gm)
    tl.store(part_o_ptr + row[:, None] * D + d[None, :], acc, mask=gm[:, None] & dm[None, :])


@triton.jit
def merge_head(part_o_ptr, part_m_ptr, part_l_ptr, h, n_splits, n_valid, d, dm,
               D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
               VOLATILE: tl.constexpr):
    """Query head h's output from its first n_valid split partials (fp32 [BLOCK_D]):
    pass 1 the global max M, pass 2 sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s.
    VOLATILE: read past L1 (partials written by other programs of the same launch)."""
    s = tl.arange(0, BLOCK_S)
    mx = tl.full([BLOCK_S], float("-inf"), tl.float32)
    for s0 in range(0, n_valid, BLOCK_S):
        sm = (s0 + s) < n_valid
        mx = tl.maximum(mx, tl.load(part_m_ptr + h * n_splits + s0 + s, mask=sm,
                                    other=float("-inf"), volatile=VOLATILE))
    M = tl.max(mx, axis=0)
    den = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BLOCK_S, BLOCK_D], tl.float32)
    for s0 in range(0, n_valid, BLOCK_S):
        sm = (s0 + s) < n_valid
        row = h * n_splits + s0 + s
        m_s = tl.load(part_m_ptr + row, mask=sm, other=float("-inf"), volatile=VOLATILE)
        w = tl.where(sm, tl.exp(m_s - M), 0.0)
        den += w * tl.load(part_l_ptr + row, mask=sm, other=0.0, volatile=VOLATILE)
        o = tl.load(part_o_ptr + row[:, None] * D + d[None, :], mask=sm[:, None] & dm[None, :],
                    other=0.0, volatile=VOLATILE)
        acc += w[:, None] * o
    return tl.sum(acc, axis=0) / tl.sum(den, axis=0)


@triton.jit
def _attn_partial_kernel(q_ptr, k_cache_ptr, v_cache_ptr, part_o_ptr, part_m_ptr, part_l_ptr,
                         pos_ptr, stride_c_h, stride_c_t, n_splits, scale,
                         GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr,
                         BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, BLOCK_T: tl.constexpr,
                         DOT_F32: tl.constexpr, USE_PDL: tl.constexpr):
    kh = tl.program_id(0)
    split = tl.program_id(1)
    pdl_wait(USE_PDL)
    length = tl.load(pos_ptr) + 1
    start = split * CHUNK
    if start < length:
        end = tl.minimum(start + CHUNK, length)          # never past this chunk
        g = tl.arange(0, GROUP_PAD)
        gm = g < GROUP
        heads = kh * GROUP + g
        d = tl.arange(0, BLOCK_D)
        dm = d < D
        q = tl.load(q_ptr + heads[:, None] * D + d[None, :], mask=gm[:, None] & dm[None, :], other=0.0)
        if DOT_F32:
            q = q.to(tl.float32)
        m_i, l_i, acc = partial_tiles(q, k_cache_ptr, v_cache_ptr, kh * stride_c_h, start, end,
                                      stride_c_t, d, dm, scale, GROUP_PAD, BLOCK_D, BLOCK_T, DOT_F32)
        store_partials(part_o_ptr, part_m_ptr, part_l_ptr, heads, gm, split, n_splits, m_i, l_i,
                       acc, d, dm, D)


@triton.jit
def _attn_reduce_kernel(part_o_ptr, part_m_ptr, part_l_ptr, out_ptr, pos_ptr, n_splits,
                        D: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK: tl.constexpr,
                        BLOCK_S: tl.constexpr, USE_PDL: tl.constexpr):
    h = tl.program_id(0)
    pdl_wait(USE_PDL)
    length = tl.load(pos_ptr) + 1
    n_valid = (length + CHUNK - 1) // CHUNK                # splits that hold any token
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    out = merge_head(part_o_ptr, part_m_ptr, part_l_ptr, h, n_splits, n_valid, d, dm, D, BLOCK_D,
                     BLOCK_S, False)
    tl.store(out_ptr + h * D + d, bf16_round(out).to(out_ptr.dtype.element_ty), mask=dm)


BLOCK_S = 32    # splits merged per block by the reduce (and by any last-arrival merge)


def n_splits_for(max_ctx: int, chunk: int) -> int:
    return triton.cdiv(max_ctx, chunk)


def chunk_for(max_ctx: int) -> int:
    """The chunk length: small enough that short contexts still spread over several
    programs, large enough that the partials stay a small fraction of the KV bytes."""
    c = 64
    while triton.cdiv(max_ctx, c) > 256:
        c *= 2
    return c


def attention_partial(q, k_cache, v_cache, pos, part_o, part_m, part_l, heads, kv_heads, head_dim,
                      chunk, cfg, use_pdl=False):
    """Stage 1. q: [Hq D]; k_cache, v_cache: one layer's [Hkv, C, D];
    part_*: [Hq, n_splits(, D)] fp32; grid (Hkv, n_splits)."""
    n_splits = part_m.shape[1]
    group = heads // kv_heads
    block_t = min(cfg["BLOCK_T"], chunk)
    assert chunk % block_t == 0, "a tile must not straddle two chunks"
    kw = {"launch_pdl": True} if use_pdl else {}
    _attn_partial_kernel[(kv_heads, n_splits)](
        q, k_cache, v_cache, part_o, part_m, part_l, pos, k_cache.stride(0), k_cache.stride(1),
        n_splits, head_dim ** -0.5, GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)),
        D=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), CHUNK=chunk,
        BLOCK_T=block_t, DOT_F32=config.interpreting(), USE_PDL=use_pdl,
        num_warps=cfg["num_warps"], **kw)


def attention_reduce(part_o, part_m, part_l, out, pos, head_dim, chunk, use_pdl=False):
    """Stage 2: merge the valid splits of each query head into out [Hq D]; grid (Hq,)."""
    heads, n_splits = part_m.shape
    kw = {"launch_pdl": True} if use_pdl else {}
    _attn_reduce_kernel[(heads,)](
        part_o, part_m, part_l, out, pos, n_splits, D=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim), CHUNK=chunk, BLOCK_S=BLOCK_S,
        USE_PDL=use_pdl, num_warps=4, **kw)


def attention_splitk(q, k_cache, v_cache, out, pos, part_o, part_m, part_l, heads, kv_heads,
                     head_dim, chunk, cfg, use_pdl=False):
    """Both stages. q, out: [Hq D]; k_cache, v_cache: one layer's [Hkv, C, D];
    part_*: [Hq, n_splits(, D)]."""
    attention_partial(q, k_cache, v_cache, pos, part_o, part_m, part_l, heads, kv_heads, head_dim,
                      chunk, cfg, use_pdl)
    attention_reduce(part_o, part_m, part_l, out, pos, head_dim, chunk, use_pdl)
