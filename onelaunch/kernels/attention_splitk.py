"""Split-K flash-decode attention: a partial kernel and a reduce kernel.

Stage 1, ``_attention_partial_kernel``: one program per (kv head, split). The live
timeline [0, length) is cut into units of CHUNK positions, and the units are shared out
over the fixed grid of n_splits splits *at run time*, from ``pos``: each split takes
per = ceil(units / n_splits) consecutive units (``split_range``), so at a given length
the work does not depend on how many splits the grid has, only on the length, as long
as units <= n_splits (one unit each). Splits past the live length have an empty range:
they exit at once, without waiting on the previous kernel, and the reduce never reads
them. A split holds all GROUP query heads that share its KV head, so each K/V byte is
read once, not GROUP times. Over its range it runs an online softmax in BLOCK_T tiles
and writes, per query head h:

    part_m[h, s]    fp32  max score in the range
    part_l[h, s]    fp32  sum_t exp(s_t - part_m)
    part_o[h, s, :] fp32  sum_t exp(s_t - part_m) v_t           (unnormalised)

Off the chain: with programmatic dependent launch a program reads ``pos`` and requests
its first K/V tile *before* it waits on the previous kernel. Both are safe to read
early: keys and values at positions < pos were written by earlier steps (this step's
RoPE kernel writes only slot pos), and pos was written by the previous step's last
kernel, which has completed (a kernel starts only after every program of the one before
passed its own wait, so after the kernel before that finished). So the early tile masks
slot pos out, and only q and the newest token's key and value (slot pos) are read after
the wait; the split that holds pos folds that token in first, as a tile of one valid row
(the same tl.dot path as every tile, so the kernel that computes it from registers gets
the same bits), then its older tiles.

Stage 2, ``_attention_reduce_kernel``: one program per query head merges the live
splits:

    M   = max_s part_m[h, s]
    out = sum_s exp(part_m - M) part_o / sum_s exp(part_m - M) part_l

It too computes the number of live splits from pos before its wait.

Both launches have one fixed shape up to the engine's max context (the number of splits
is fixed by max_ctx), so the same recorded launch serves every step of a CUDA graph. A
tile never reads past its own range's end: the seed post's double-counting bug was a
tile wider than the chunk. Scores use tl.dot with the query group padded to 16 rows (the
smallest MMA). The idea is Dao et al.'s flash-decoding; the stage split follows vLLM's
triton_decode_attention.
Bytes: 2 * length * Hkv * D * 2 read per layer, plus Hq * n_live * (D + 2) * 4 of
partials written and read back.
"""
import triton
import triton.language as tl

from . import config
from ._common import bf16_round, pdl_wait

NEW_T = tl.constexpr(16)   # rows of the newest token's tile: the smallest tl.dot K (for p @ v)


@triton.jit
def split_range(pos, split, n_share, CHUNK: tl.constexpr):
    """[start, end) of split ``split``'s share of the live timeline [0, pos + 1): the
    live length counted in units of CHUNK, ceil(units / n_share) units a split, in order
    (``n_share``: the splits the live length may use, ``live_share``). Empty (start >= end)
    for the splits past the live length."""
    length = pos + 1
    units = (length + CHUNK - 1) // CHUNK
    per = (units + n_share - 1) // n_share                # units a split, >= 1
    start = split * per * CHUNK
    end = tl.minimum(start + per * CHUNK, length)
    return start, end


@triton.jit
def live_splits(pos, n_share, CHUNK: tl.constexpr):
    """How many splits hold a token at this pos (the first ones): what the reduce merges."""
    units = (pos + CHUNK) // CHUNK                        # ceil((pos + 1) / CHUNK)
    per = (units + n_share - 1) // n_share
    return (units + per - 1) // per


@triton.jit
def load_kv_tile(k_cache_ptr, v_cache_ptr, base, t0, t_end, stride_c_t, d, dm,
                 BLOCK_T: tl.constexpr):
    """Keys and values of positions [t0, t0 + BLOCK_T) below t_end ([BLOCK_T, BLOCK_D],
    zeros elsewhere: no memory traffic for masked rows), and the row mask."""
    t = t0 + tl.arange(0, BLOCK_T)
    tm = t < t_end
    offs = base + t[:, None] * stride_c_t + d[None, :]
    kv_mask = tm[:, None] & dm[None, :]
    k = tl.load(k_cache_ptr + offs, mask=kv_mask, other=0.0)
    v = tl.load(v_cache_ptr + offs, mask=kv_mask, other=0.0)
    return k, v, tm


@triton.jit
def softmax_tile(q, k, v, tm, m_i, l_i, acc, scale, DOT_F32: tl.constexpr):
    """One online-softmax step over a K/V tile (rows where ``tm`` is False count for
    nothing). Needs a finite running max or at least one valid row (else
    exp(-inf + inf))."""
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
    return m_new, l_i, acc


@triton.jit
def _attention_partial_kernel(q_ptr, k_cache_ptr, v_cache_ptr, part_o_ptr,
                              part_m_ptr, part_l_ptr, pos_ptr, stride_c_h, stride_c_t,
                              n_splits, n_share, scale, GROUP: tl.constexpr,
                              GROUP_PAD: tl.constexpr, D: tl.constexpr,
                              BLOCK_D: tl.constexpr, CHUNK: tl.constexpr,
                              BLOCK_T: tl.constexpr, DOT_F32: tl.constexpr,
                              USE_PDL: tl.constexpr):
    kh = tl.program_id(0)                            # the kv head
    split = tl.program_id(1)                         # which share of its timeline
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    base = kh * stride_c_h
    # ---- before the wait: pos (the previous step's) and the first tile older than pos
    pos = tl.load(pos_ptr)
    start, end = split_range(pos, split, n_share, CHUNK)
    if start < end:                                  # else: past the live length, exit
        k0, v0, tm0 = load_kv_tile(k_cache_ptr, v_cache_ptr, base, start,
                                   tl.minimum(end, pos), stride_c_t, d, dm, BLOCK_T)
        pdl_wait(USE_PDL)
        # ---- after it: q and slot pos, both written by the previous kernel ----------
        g = tl.arange(0, GROUP_PAD)                  # the query heads of this kv head
        gm = g < GROUP
        heads = kh * GROUP + g
        q = tl.load(q_ptr + heads[:, None] * D + d[None, :],
                    mask=gm[:, None] & dm[None, :], other=0.0)   # [GROUP_PAD, BLOCK_D]
        if DOT_F32:
            q = q.to(tl.float32)
        # the newest token: a tile whose only valid row is slot pos (no rows elsewhere)
        kn, vn, tmn = load_kv_tile(k_cache_ptr, v_cache_ptr, base, pos,
                                   tl.where(end == pos + 1, pos + 1, pos), stride_c_t,
                                   d, dm, NEW_T)
        m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)  # running max score
        l_i = tl.zeros([GROUP_PAD], tl.float32)                 # sum of exp(s - m_i)
        acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)        # sum of exp(s - m_i) v
        if end == pos + 1:                           # this split holds the newest token
            m_i, l_i, acc = softmax_tile(q, kn, vn, tmn, m_i, l_i, acc, scale, DOT_F32)
        m_i, l_i, acc = softmax_tile(q, k0, v0, tm0, m_i, l_i, acc, scale, DOT_F32)
        older = tl.minimum(end, pos)                 # the split's keys before pos
        for t0 in range(start + BLOCK_T, older, BLOCK_T):   # a tile at a time
            k, v, tm = load_kv_tile(k_cache_ptr, v_cache_ptr, base, t0, older,
                                    stride_c_t, d, dm, BLOCK_T)
            m_i, l_i, acc = softmax_tile(q, k, v, tm, m_i, l_i, acc, scale, DOT_F32)
        row = heads * n_splits + split               # the partial: (m, l, acc) per head
        tl.store(part_m_ptr + row, m_i, mask=gm)
        tl.store(part_l_ptr + row, l_i, mask=gm)
        tl.store(part_o_ptr + row[:, None] * D + d[None, :], acc,
                 mask=gm[:, None] & dm[None, :])


# ---- the partial kernel's work in pieces, for the persistent layer (``layer_persistent``:
# ``partial_early`` before its barrier, ``partial_rest`` after) and for RoPE folded into
# attention (``rope_attention_partial``: ``split_partial``, ``store_partials``). Same loads
# and online-softmax steps in the same order as ``_attention_partial_kernel``, so the same
# bits: tests/test_persistent.py compares them bit for bit.

@triton.jit
def partial_tiles(q, k_cache_ptr, v_cache_ptr, base, start, end, stride_c_t, d, dm, scale,
                  m_i, l_i, acc, BLOCK_T: tl.constexpr, DOT_F32: tl.constexpr):
    """The online softmax over positions [start, end) of one kv head's timeline, in
    BLOCK_T tiles, for the GROUP_PAD query rows in ``q`` ([GROUP_PAD, BLOCK_D], bf16, or
    fp32 with DOT_F32), continuing from the state (m_i, l_i, acc). Returns (m, l, acc): the
    max score, sum of exp(s - m), and unnormalised sum of exp(s - m) v, per row."""
    for t0 in range(start, end, BLOCK_T):
        k, v, tm = load_kv_tile(k_cache_ptr, v_cache_ptr, base, t0, end, stride_c_t, d, dm, BLOCK_T)
        m_i, l_i, acc = softmax_tile(q, k, v, tm, m_i, l_i, acc, scale, DOT_F32)
    return m_i, l_i, acc


@triton.jit
def split_partial(q, k_cache_ptr, v_cache_ptr, base, start, end, pos, stride_c_t, d, dm,
                  scale, k0, v0, tm0, kn, vn, tmn, GROUP_PAD: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr, DOT_F32: tl.constexpr):
    """One split's partial: the newest token first if this split holds it (``kn``,
    ``vn``, ``tmn``: a tile of NEW_T rows whose only valid row is slot pos), then the
    early tile ``k0, v0, tm0`` (positions [start, start + BLOCK_T) below pos, loaded
    before the PDL wait), then the rest of [start, min(end, pos)). The newest token
    first keeps the running max finite when the early tile is empty (pos == start)."""
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    if end == pos + 1:                               # this split holds the new token
        m_i, l_i, acc = softmax_tile(q, kn, vn, tmn, m_i, l_i, acc, scale, DOT_F32)
    m_i, l_i, acc = softmax_tile(q, k0, v0, tm0, m_i, l_i, acc, scale, DOT_F32)
    return partial_tiles(q, k_cache_ptr, v_cache_ptr, base, start + BLOCK_T,
                         tl.minimum(end, pos), stride_c_t, d, dm, scale, m_i, l_i, acc,
                         BLOCK_T, DOT_F32)


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
               BLOCK_M: tl.constexpr, VOLATILE: tl.constexpr):
    """Query head h's output from its first n_valid split partials (fp32 [BLOCK_D]):
    pass 1 the global max M (all maxima in one load of BLOCK_M >= n_splits values: one
    round trip), pass 2 sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s in blocks of
    BLOCK_S splits. VOLATILE: read past L1 (partials written by other programs of the
    same launch)."""
    sa = tl.arange(0, BLOCK_M)
    M = tl.max(tl.load(part_m_ptr + h * n_splits + sa, mask=sa < n_valid,
                       other=float("-inf"), volatile=VOLATILE), axis=0)
    s = tl.arange(0, BLOCK_S)
    den = tl.zeros([BLOCK_S], tl.float32)
    acc = tl.zeros([BLOCK_S, BLOCK_D], tl.float32)
    for s0 in range(0, n_valid, BLOCK_S):
        sm = (s0 + s) < n_valid
        row = h * n_splits + s0 + s
        m_s = tl.load(part_m_ptr + row, mask=sm, other=float("-inf"), volatile=VOLATILE)
        w = tl.where(sm, tl.exp(m_s - M), 0.0)
        den += w * tl.load(part_l_ptr + row, mask=sm, other=0.0, volatile=VOLATILE)
        o = tl.load(part_o_ptr + row[:, None] * D + d[None, :],
                    mask=sm[:, None] & dm[None, :], other=0.0, volatile=VOLATILE)
        acc += w[:, None] * o
    return tl.sum(acc, axis=0) / tl.sum(den, axis=0)


@triton.jit
def partial_early(k_cache_ptr, v_cache_ptr, pos, kh, start, end, stride_c_h, stride_c_t,
                  D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr):
    """What a split of kv head ``kh`` with range [start, end) (``split_range``) may read
    before its wait: its first tile of keys and values older than pos (all masked, no
    traffic, when the range is empty)."""
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    return load_kv_tile(k_cache_ptr, v_cache_ptr,
                        kh * stride_c_h, start, tl.minimum(end, pos), stride_c_t, d, dm,
                        BLOCK_T)


@triton.jit
def partial_rest(q_ptr, k_cache_ptr, v_cache_ptr, part_o_ptr, part_m_ptr, part_l_ptr,
                 pos, kh, split, start, end, k0, v0, tm0, stride_c_h, stride_c_t,
                 n_splits, scale, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
                 D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_T: tl.constexpr,
                 DOT_F32: tl.constexpr):
    """After the wait (a live split only): q and slot pos, both written by the previous
    kernel (or phase), then the split's partial, stored."""
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    base = kh * stride_c_h
    g = tl.arange(0, GROUP_PAD)
    gm = g < GROUP
    heads = kh * GROUP + g
    q = tl.load(q_ptr + heads[:, None] * D + d[None, :], mask=gm[:, None] & dm[None, :],
                other=0.0)
    if DOT_F32:
        q = q.to(tl.float32)
    # the newest token as a tile of NEW_T rows whose only valid row is slot pos (all
    # rows masked, so no traffic, in the splits that do not hold it)
    new_end = tl.where(end == pos + 1, pos + 1, pos)
    kn, vn, tmn = load_kv_tile(k_cache_ptr, v_cache_ptr, base, pos, new_end, stride_c_t,
                               d, dm, NEW_T)
    m_i, l_i, acc = split_partial(q, k_cache_ptr, v_cache_ptr, base, start, end, pos,
                                  stride_c_t, d, dm, scale, k0, v0, tm0, kn, vn, tmn,
                                  GROUP_PAD, BLOCK_D, BLOCK_T, DOT_F32)
    store_partials(part_o_ptr, part_m_ptr, part_l_ptr, heads, gm, split, n_splits, m_i,
                   l_i, acc, d, dm, D)


@triton.jit
def reduce_head(part_o_ptr, part_m_ptr, part_l_ptr, out_ptr, h, n_splits, n_valid,
                D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
                BLOCK_M: tl.constexpr, VOLATILE: tl.constexpr):
    """Query head h's output from its n_valid live splits, rounded to bf16 and
    stored."""
    d = tl.arange(0, BLOCK_D)
    dm = d < D
    out = merge_head(part_o_ptr, part_m_ptr, part_l_ptr, h, n_splits, n_valid, d, dm, D,
                     BLOCK_D, BLOCK_S, BLOCK_M, VOLATILE)
    tl.store(out_ptr + h * D + d, bf16_round(out).to(out_ptr.dtype.element_ty), mask=dm)


@triton.jit
def _attention_reduce_kernel(part_o_ptr, part_m_ptr, part_l_ptr, out_ptr, pos_ptr,
                             n_splits, n_share, D: tl.constexpr, BLOCK_D: tl.constexpr,
                             CHUNK: tl.constexpr, BLOCK_S: tl.constexpr,
                             BLOCK_M: tl.constexpr, USE_PDL: tl.constexpr):
    h = tl.program_id(0)
    # before the wait: pos is old
    n_valid = live_splits(tl.load(pos_ptr), n_share, CHUNK)
    pdl_wait(USE_PDL)
    reduce_head(part_o_ptr, part_m_ptr, part_l_ptr, out_ptr, h, n_splits, n_valid, D,
                BLOCK_D, BLOCK_S, BLOCK_M, False)


BLOCK_S = 32      # splits merged per block by the reduce (and by any last-arrival merge)
SPLIT_UNIT = 64   # positions a split's share is counted in (the engine's chunk)
MAX_SPLITS = 256  # the most splits a grid has per kv head
LIVE_PROGRAMS = 128  # live partial programs at most, over all kv heads (default_live_cap)


def block_m(n_splits: int) -> int:
    """The merge's first pass loads every split's max at once: a power of two >= n_splits."""
    return max(BLOCK_S, triton.next_power_of_2(n_splits))


def n_splits_for(max_ctx: int, chunk: int) -> int:
    """The fixed grid's splits per kv head: one per chunk of the maximum context, but at
    most MAX_SPLITS (then each split's share at the maximum context is a power-of-two
    number of chunks). The live length is shared out over them at run time, so a split
    past the live length costs only its exit."""
    c = chunk
    while triton.cdiv(max_ctx, c) > MAX_SPLITS:
        c *= 2
    return triton.cdiv(max_ctx, c)


def chunk_for(max_ctx: int) -> int:
    """The unit a split's share of the live length is counted in: SPLIT_UNIT positions
    whatever max_ctx is, so at a given length engines of any size share the work the
    same way (one unit a split while units <= n_splits). Short contexts still spread
    over several programs; ``n_splits_for`` bounds the partials at long ones."""
    return SPLIT_UNIT


def live_share(n_splits: int, live_cap: int | None) -> int:
    """The splits a kv head's live length is shared over: the grid's n_splits, at most
    ``live_cap``. Past units = live_cap the splits grow longer instead of more numerous:
    every live split writes a partial the reduce reads back, and each program pays its
    fixed cost per tile, so beyond what fills the GPU more splits cost more than they
    hide (``default_live_cap``). None: no cap."""
    return n_splits if live_cap is None else max(1, min(n_splits, int(live_cap)))


def default_live_cap(kv_heads: int) -> int:
    """Live splits a kv head at most: LIVE_PROGRAMS partial programs over all kv heads.
    Measured on the H200 (``bench --what splitcap``, caps of 256 to 32 programs and none):
    128 programs was the fastest or within 1% of it at every context from 2048 to 32768
    for both models; with no cap Qwen took 1.87x the floor at 8192 against 1.72x."""
    return max(1, -(-LIVE_PROGRAMS // kv_heads))


def live_splits_host(length: int, chunk: int, n_share: int) -> int:
    """``live_splits`` on the host: the splits that hold a token at this length, with the
    live length shared over ``n_share`` splits (``live_share``)."""
    units = -(-length // chunk)
    per = -(-units // n_share)
    return -(-units // per)


def attention_partial(q, k_cache, v_cache, pos, part_o, part_m, part_l, heads, kv_heads, head_dim,
                      chunk, cfg, use_pdl=False, live_cap=None):
    """Stage 1. q: [Hq D]; k_cache, v_cache: one layer's [Hkv, C, D];
    part_*: [Hq, n_splits(, D)] fp32; grid (Hkv, n_splits); ``live_cap``: see live_share."""
    n_splits = part_m.shape[1]
    group = heads // kv_heads
    block_t = min(cfg["BLOCK_T"], chunk)
    assert chunk % block_t == 0, "a tile must not straddle two chunks"
    kw = {"launch_pdl": True} if use_pdl else {}
    _attention_partial_kernel[(kv_heads, n_splits)](
        q, k_cache, v_cache, part_o, part_m, part_l, pos, k_cache.stride(0), k_cache.stride(1),
        n_splits, live_share(n_splits, live_cap), head_dim ** -0.5, GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)),
        D=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), CHUNK=chunk,
        BLOCK_T=block_t, DOT_F32=config.interpreting(), USE_PDL=use_pdl,
        num_warps=cfg["num_warps"], **kw)


def attention_reduce(part_o, part_m, part_l, out, pos, head_dim, chunk, use_pdl=False,
                     num_warps=4, live_cap=None):
    """Stage 2: merge the live splits of each query head into out [Hq D]; grid (Hq,).
    (``num_warps``: the persistent layer's reference runs the merge at its warps.)"""
    heads, n_splits = part_m.shape
    kw = {"launch_pdl": True} if use_pdl else {}
    _attention_reduce_kernel[(heads,)](
        part_o, part_m, part_l, out, pos, n_splits, live_share(n_splits, live_cap), D=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim), CHUNK=chunk, BLOCK_S=BLOCK_S,
        BLOCK_M=block_m(n_splits), USE_PDL=use_pdl, num_warps=num_warps, **kw)


def attention_splitk(q, k_cache, v_cache, out, pos, part_o, part_m, part_l, heads, kv_heads,
                     head_dim, chunk, cfg, use_pdl=False, live_cap=None):
    """Both stages. q, out: [Hq D]; k_cache, v_cache: one layer's [Hkv, C, D];
    part_*: [Hq, n_splits(, D)]."""
    attention_partial(q, k_cache, v_cache, pos, part_o, part_m, part_l, heads, kv_heads, head_dim,
                      chunk, cfg, use_pdl, live_cap)
    attention_reduce(part_o, part_m, part_l, out, pos, head_dim, chunk, use_pdl, live_cap=live_cap)
