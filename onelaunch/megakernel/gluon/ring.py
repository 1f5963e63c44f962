"""The megakernels' ring of weight tiles in shared memory: the loader's TMA fills (a
stage waits only for its consumer to free it), the same bytes viewed as the down
projection's boxes, and the dot products the compute partition takes from a stage.

A TMA box is [TN rows, kb K tiles, TK columns] of bf16 (``boxes.py`` on the host): each
row's kb x TK columns one contiguous run of memory. Stage s of a ring of STAGES is two
slots (2 s, 2 s + 1) and one pair of mbarriers: ``ready`` (the TMA's bytes arrived) and
``empty`` (the compute freed it); the t-th fill of a stream uses stage t % STAGES with
phase (t // STAGES) & 1.

``l2_prefetch``: a loader's asks of the L2 for weights the ring will take later
(``megakernel/l2stage.py`` says which), one bulk prefetch a lane, nothing waits for them.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma


@gluon.jit
def fill(desc, ring, ready, empty, t, r, kt0, n_halves: gl.constexpr, I,
         STAGES: gl.constexpr):
    """Stage t % STAGES <- a box of rows r.. x K tiles kt0.. (``desc``: [TN, KB, TK], each
    row's KB x TK columns contiguous in memory), one TMA copy a half (gate, then up at rows
    r + I: n_halves 2; down: 1), one barrier for the stage."""
    s = t % STAGES
    mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(s), n_halves * desc.block_type.nbytes)
    for half in gl.static_range(n_halves):
        tma.async_copy_global_to_shared(desc, [r + half * I, kt0, 0], ready.index(s),
                                        ring.index(2 * s + half))
    return t + 1


@gluon.jit
def fill_one(desc, slots, ready, empty, t, r, kt0, STAGES: gl.constexpr, R: gl.constexpr):
    """Stage t % STAGES <- one box of rows r.. x K tiles kt0.. (the down projection): into
    slot s * R of ``slots`` (R boxes a stage: 1 for a full box, more for the tail box)."""
    s = t % STAGES
    mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(s), desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [r, kt0, 0], ready.index(s), slots.index(s * R))
    return t + 1


@gluon.jit
def fill_pair(desc, ring, ready, empty, t, r, n_rows, r_end, STAGES: gl.constexpr):
    """Stage t % STAGES <- row blocks r and r + TN of ``desc`` (whole rows); a second block
    at or past ``r_end`` (the instruction's last row) is asked for past the tensor's
    ``n_rows``: zeros, no memory read, the same bytes on the barrier."""
    TN_: gl.constexpr = desc.block_type.shape[0]
    s = t % STAGES
    mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(s), 2 * desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [r, 0, 0], ready.index(s), ring.index(2 * s))
    r2 = gl.where(r + TN_ < r_end, r + TN_, n_rows)
    tma.async_copy_global_to_shared(desc, [r2, 0, 0], ready.index(s), ring.index(2 * s + 1))
    return t + 1


@gluon.jit
def l2_ranges(row_ptr):
    """One row of the L2 table (int64 [3, 32]: addresses, bytes (0: none), where to ask):
    lane j of the loader's warp holds range j; and the stage to ask at."""
    ll: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    f = gl.arange(0, 32, ll)
    return gl.load(row_ptr + f), gl.load(row_ptr + 32 + f).to(gl.int32), gl.load(row_ptr + 64)


@gluon.jit
def l2_prefetch(addr, n, POLICY: gl.constexpr):
    """Ask the L2 for ``n`` bytes at ``addr``, each lane its own range (``l2_ranges``): a
    bulk prefetch (a hint: no data into the SM, no completion to wait for), with the
    default policy (POLICY 1) or evict-last (2)."""
    if POLICY == 2:
        gl.inline_asm_elementwise(
            "{ .reg .pred p; .reg .b64 pol; setp.ne.s32 p, $2, 0;\n"
            "createpolicy.fractional.L2::evict_last.b64 pol, 1.0;\n"
            "@p cp.async.bulk.prefetch.L2.global.L2::cache_hint [$1], $2, pol;\n"
            "mov.b32 $0, 0; }", "=r,l,r", [addr, n], dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $2, 0;\n"
            "@p cp.async.bulk.prefetch.L2.global [$1], $2;\nmov.b32 $0, 0; }",
            "=r,l,r", [addr, n], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def down_views(ring, d_dn, d_dt, STAGES: gl.constexpr, NW: gl.constexpr):
    """The ring's bytes as the down projection's boxes: one [TN, KD, TK] box a stage and
    KD / TB tail boxes of [TN, TB, TK] a stage (the loader's views), and the same boxes
    as [TN, NW, K tiles / NW, TK], their K tiles over the compute warps."""
    TN_: gl.constexpr = d_dn.block_type.shape[0]
    KD: gl.constexpr = d_dn.block_type.shape[1]
    TK_: gl.constexpr = d_dn.block_type.shape[2]
    TB: gl.constexpr = d_dt.block_type.shape[1]
    ring_dn = ring._reinterpret(gl.bfloat16, [STAGES, TN_, KD, TK_], d_dn.layout)
    ring_dt = ring._reinterpret(gl.bfloat16, [STAGES * (KD // TB), TN_, TB, TK_], d_dt.layout)
    pl4: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=1,
                                                order=[3, 2, 1, 0])
    ring_dk = ring._reinterpret(gl.bfloat16, [STAGES, TN_, NW, KD // NW, TK_], pl4)
    ring_tk = ring._reinterpret(gl.bfloat16, [STAGES * (KD // TB), TN_, NW, TB // NW, TK_],
                                pl4)
    return ring_dn, ring_dt, ring_dk, ring_tk


@gluon.jit
def h_and_barriers(NF: gl.constexpr, KD: gl.constexpr, TAIL: gl.constexpr,
                   TK_: gl.constexpr, STAGES: gl.constexpr):
    """h of the down projection in shared memory (chunks of 4 K tiles), and the ring's
    ready and empty barriers, initialised."""
    vl: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=1,
                                               order=[1, 0])
    vec = gl.allocate_shared_memory(gl.bfloat16, [(NF * KD + TAIL) // 4, 4, TK_], vl)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    return vec, ready, empty


@gluon.jit
def dot_slice(ring, k, k0: gl.constexpr, n: gl.constexpr, v, acc, MATH: gl.constexpr,
              l3: gl.constexpr):
    """``_dot_box`` over K tiles [k0, k0 + n) of box k: the TMA brought the whole row
    (one run of memory a row), the math takes only the tiles inside K."""
    w = ring.index(k).slice(k0, n, dim=1).load(l3).to(gl.float32)
    if MATH:
        return acc + gl.sum(w * v[None, :, :], axis=1)
    return acc + gl.sum(w, axis=1)


@gluon.jit
def dot_box_k(ring, k, v, acc, MATH: gl.constexpr, l4: gl.constexpr):
    """acc[TN, NW, TK] += ring box k [TN, NW, kb / NW, TK] x v[NW, kb / NW, TK]: the K
    tiles split over the warps (each warp reads its share of v, not all of it), summed
    over each thread's tiles in registers; the warps' sums meet once a row block."""
    w = ring.index(k).load(l4).to(gl.float32)
    if MATH:
        return acc + gl.sum(w * v[None, :, :, :], axis=2)
    return acc + gl.sum(w, axis=2)                    # diagnostic: read the box only
