"""Step (b) of the megakernel (issue 25): the 28 layers' MLPs of a dense model in one
persistent Gluon launch, coupled by counters instead of grid barriers.

    x_{l+1} = x_l + W_down_l @ (silu(W_gate_l @ xn) * (W_up_l @ xn)),  xn = rmsnorm(x_l) * g_l

One CTA an SM walks its own instruction list (``isa`` format; ``mlp_schedule`` below).
Two partitions share a ring of ``STAGES`` shared-memory tiles of [TN, TK] weights:

- the **loader** (one warp) walks the same list and asks the TMA engine for every weight
  tile in order, waiting only for a free stage, never for data: while the compute
  partition waits for the rest of the grid, the ring fills with the next op's weights;
- the **compute** partition (``num_warps`` warps) waits on a counter for the activations
  it reads (acquire), consumes the tiles, stores its rows and bumps its counter (release).

Counters: ``GU(l) = 2 l`` counts the layer's finished gate/up instructions, ``DN(l) = 2 l
+ 1`` its finished down instructions; ``EXIT = 2 L`` counts CTAs that left, and the last
one out sets every counter back to zero, so graph replays need no host work. x ping-pongs
between two buffers by layer parity (the down projection of layer l reads x[l % 2] and
writes x[(l + 1) % 2]; every reader of a buffer precedes its next writer through the
counters), h is one buffer (gate/up of layer l + 1 waits for every down of layer l).

No wait is unbounded: a counter wait that outlasts ``timeout_ns`` records (instruction,
counter, value seen, target) in ``err[pid]`` and the CTA runs on without waiting, still
consuming every tile so its loader finishes; the host raises with the stalled SM named.

    python lab/mlp_stream.py OUT.json                   # GPU: check, then time (NOTES 23)
    python -m onelaunch.megakernel.gluon_mlp --aot      # any machine: compile for sm_90
"""
from __future__ import annotations

import argparse
import sys

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from . import isa

TN, TK = 4, 256            # a weight tile: 4 rows x 256 columns of bf16, 2 KB
KB = 8                     # K tiles a TMA box: [KB, TN, TK], 16 KB; past K it reads zeros
ERR = 4                    # err[pid] = (instruction + 1, counter, value seen, target)


def smem_layout():
    """A TMA box of [TN rows, KB K tiles, TK columns], unswizzled: a lane's 8 columns are
    16 contiguous bytes and a warp reads 512-byte runs, without bank conflicts."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)


def down_boxes(kt: int, kd: int, tail: bool = True) -> tuple[int, int]:
    """The down projection's K tiles as NF full boxes of ``kd`` tiles and a tail box of
    TAIL tiles (what is left, rounded up to a power of two; 0 if nothing is left): 35
    tiles (Qwen's 8960) in boxes of 16 are 2 boxes and a tail of 4, one zero tile
    multiplied where whole boxes (``tail=False``: 3 boxes, version 8) multiply 13."""
    nf, rest = divmod(kt, kd)
    if not tail:
        return nf + (rest > 0), 0
    return nf, (triton.next_power_of_2(rest) if rest else 0)


def gate_up_boxes(kt: int, kb: int, tail: bool = True) -> tuple[int, int]:
    """Gate/up's K tiles (all of K in one stage) as a box of KG tiles and a tail box of GT:
    Qwen's 6 tiles are 4 + 2, where one box of ``kb`` = 8 (``tail=False``, version 8)
    multiplies two zero tiles a row."""
    assert kt <= kb, "gate/up: all of K in one stage"
    kg = 1 << (kt.bit_length() - 1)             # the largest power of two <= kt
    if not tail:
        return kb, 0
    return kg, (triton.next_power_of_2(kt - kg) if kg < kt else 0)


def box_view(w2d: torch.Tensor) -> torch.Tensor:
    """[rows, K] as [rows, K / TK, TK]: a box of [TN, KB, TK] brings TN rows over KB K
    tiles in one TMA copy, each row's KB x TK columns one contiguous run of memory."""
    rows, K = w2d.shape
    return w2d.view(rows, K // TK, TK)


# ---- the schedule ----------------------------------------------------------------------
def split_rows(n_blocks: int, parts: int) -> list[tuple[int, int]]:
    """``n_blocks`` row blocks cut into ``parts`` contiguous runs (first, count), sizes
    differing by at most one (empty runs dropped)."""
    q, r = divmod(n_blocks, parts)
    out, b = [], 0
    for p in range(parts):
        n = q + (p < r)
        if n:
            out.append((b, n))
        b += n
    return out


def mlp_schedule(layers: int, hidden: int, inter: int, P: int) -> torch.Tensor:
    """int32 [P, N, isa.WIDTH]: for each layer one gate/up and one down instruction per SM
    (contiguous runs of TN-row blocks). The down runs are handed out from the last SM
    backwards, so an SM that got one gate/up block more gets its down share later."""
    gu = split_rows(inter // TN, P)                 # h rows, in blocks
    dn = split_rows(hidden // TN, P)                # x rows
    lists = [[] for _ in range(P)]
    for l in range(layers):
        wait_x = (2 * (l - 1) + 1, len(dn)) if l else (isa.NONE, 0)
        for p, (b, n) in enumerate(gu):
            lists[p].append((isa.OP_GATE_UP, l, b * TN, n * TN, *wait_x, 2 * l))
        for j, (b, n) in enumerate(dn):
            lists[P - 1 - j].append((isa.OP_DOWN, l, b * TN, n * TN, 2 * l, len(gu), 2 * l + 1))
    N = max(len(x) for x in lists) + 1
    prog = torch.zeros(P, N, isa.WIDTH, dtype=torch.int32)
    prog[:, :, [isa.WAIT0, isa.WAIT1, isa.BUMP, isa.LWAIT]] = isa.NONE
    for p, lst in enumerate(lists):
        for i, (op, l, r0, rows, w, t, bump) in enumerate(lst):
            prog[p, i, [isa.OP, isa.LAYER, isa.ROW0, isa.ROWS, isa.WAIT0, isa.TARGET0,
                        isa.BUMP]] = torch.tensor([op, l, r0, rows, w, t, bump],
                                                  dtype=torch.int32)
    return prog


# ---- device helpers --------------------------------------------------------------------
@gluon.jit
def _now():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64,
                                     is_pure=False, pack=1)


@gluon.jit
def _wait_counter(ctr_ptr, target, timeout_ns, failed, err_ptr, instr):
    """Spin until ctr >= target (acquire, GPU scope), at most ``timeout_ns``; on timeout
    record the stall in err and return failed = 1 (later waits are skipped)."""
    v = gl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu")
    t0 = _now()
    while (v < target) & (failed == 0):
        if _now() - t0 > timeout_ns:
            gl.store(err_ptr + 0, instr + 1)
            gl.store(err_ptr + 2, v)
            gl.store(err_ptr + 3, target)
            failed = 1
        v = gl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu")
    return failed


@gluon.jit
def _fill(desc, ring, ready, empty, t, r, kt0, n_halves: gl.constexpr, I,
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
def _fill_gu(dm, dt, ring_gm, ring_gt, ready, empty, t, r, I, STAGES: gl.constexpr,
             KB_: gl.constexpr):
    """Stage t % STAGES <- gate rows r.. and up rows r + I.. over all of K as a box of KG
    K tiles and a tail box of the GT left (``dm``, ``dt``): four TMA copies, one barrier;
    gate fills the stage's first slot of KB_ tiles, up its second."""
    KG: gl.constexpr = dm.block_type.shape[1]
    GT: gl.constexpr = dt.block_type.shape[1]
    s = t % STAGES
    mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(s), 2 * (dm.block_type.nbytes + dt.block_type.nbytes))
    for half in gl.static_range(2):
        slot = 2 * s + half
        tma.async_copy_global_to_shared(dm, [r + half * I, 0, 0], ready.index(s),
                                        ring_gm.index(slot * (KB_ // KG)))
        tma.async_copy_global_to_shared(dt, [r + half * I, KG, 0], ready.index(s),
                                        ring_gt.index(slot * (KB_ // GT) + KG // GT))
    return t + 1


@gluon.jit
def _fill_one(desc, slots, ready, empty, t, r, kt0, STAGES: gl.constexpr, R: gl.constexpr):
    """Stage t % STAGES <- one box of rows r.. x K tiles kt0.. (the down projection): into
    slot s * R of ``slots`` (R boxes a stage: 1 for a full box, more for the tail box)."""
    s = t % STAGES
    mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(s), desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [r, kt0, 0], ready.index(s), slots.index(s * R))
    return t + 1


@gluon.jit
def _loader(prog_ptr, n_instr, wgu_desc, wgt_desc, wdn_desc, wdt_desc, ring, ring_gm, ring_gt,
            ring_dn, ring_dt, ready, empty, I, H, GT: gl.constexpr, GU_WHOLE: gl.constexpr,
            NF: gl.constexpr,
            TAIL: gl.constexpr, STAGES: gl.constexpr, KB_: gl.constexpr,
            WIDTH: gl.constexpr):
    """Every weight box of this SM's list, in the order the compute partition eats them;
    the only wait is for a free stage. A stage is one row block's gate and up rows over
    all of K (two boxes), or one box of 2 KB K tiles of its down rows (NF of them, then
    the TAIL K tiles left, rounded up to a power of two, in a smaller box)."""
    TN_: gl.constexpr = wgu_desc.block_type.shape[0]
    KD: gl.constexpr = wdn_desc.block_type.shape[1]
    base = prog_ptr + gl.program_id(0) * n_instr * WIDTH
    t = 0
    for i in range(n_instr):
        op = gl.load(base + i * WIDTH + 0)
        layer = gl.load(base + i * WIDTH + 1)
        row0 = gl.load(base + i * WIDTH + 2)
        rows = gl.load(base + i * WIDTH + 3)
        if op == 6:                                   # OP_GATE_UP: gate and up rows, one stage
            for rb in range(rows // TN_):
                r = layer * 2 * I + row0 + rb * TN_
                if (GT > 0) & (not GU_WHOLE):
                    t = _fill_gu(wgu_desc, wgt_desc, ring_gm, ring_gt, ready, empty, t, r, I,
                                 STAGES, KB_)
                else:
                    t = _fill(wgu_desc, ring, ready, empty, t, r, 0, 2, I, STAGES)
        elif op == 7:                                 # OP_DOWN
            for rb in range(rows // TN_):
                r = layer * H + row0 + rb * TN_
                for j in range(NF):
                    t = _fill_one(wdn_desc, ring_dn, ready, empty, t, r, j * KD, STAGES, 1)
                if TAIL > 0:
                    t = _fill_one(wdt_desc, ring_dt, ready, empty, t, r, NF * KD, STAGES,
                                  KD // TAIL)


@gluon.jit
def _dot_box(ring, k, v, acc, MATH: gl.constexpr, l3: gl.constexpr):
    """acc[TN, TK] += ring box k [TN, kb, TK] x v[kb, TK], summed over its K tiles in each
    thread's registers."""
    w = ring.index(k).load(l3).to(gl.float32)
    if MATH:
        return acc + gl.sum(w * v[None, :, :], axis=1)
    return acc + gl.sum(w, axis=1)                    # diagnostic: read the box only


@gluon.jit
def _dot_slice(ring, k, k0: gl.constexpr, n: gl.constexpr, v, acc, MATH: gl.constexpr,
               l3: gl.constexpr):
    """``_dot_box`` over K tiles [k0, k0 + n) of box k: the TMA brought the whole row
    (one run of memory a row), the math takes only the tiles inside K."""
    w = ring.index(k).slice(k0, n, dim=1).load(l3).to(gl.float32)
    if MATH:
        return acc + gl.sum(w * v[None, :, :], axis=1)
    return acc + gl.sum(w, axis=1)


@gluon.jit
def _dot_box_k(ring, k, v, acc, MATH: gl.constexpr, l4: gl.constexpr):
    """acc[TN, NW, TK] += ring box k [TN, NW, kb / NW, TK] x v[NW, kb / NW, TK]: the K
    tiles split over the warps (each warp reads its share of v, not all of it), summed
    over each thread's tiles in registers; the warps' sums meet once a row block."""
    w = ring.index(k).load(l4).to(gl.float32)
    if MATH:
        return acc + gl.sum(w * v[None, :, :, :], axis=2)
    return acc + gl.sum(w, axis=2)                    # diagnostic: read the box only


@gluon.jit
def _stage_ready(ready, t, STAGES: gl.constexpr):
    s = t % STAGES
    mbarrier.wait(ready.index(s), (t // STAGES) & 1)
    return s


@gluon.jit
def _stage_free(empty, s):
    fence_async_shared()
    mbarrier.arrive(empty.index(s), count=1)


@gluon.jit
def _compute(prog_ptr, n_instr, ring_gm, ring_gt, ring_dk, ring_tk, ready, empty, vec, x_ptr,
             g_ptr, h_ptr, ctr_ptr, err_ptr, clk_ptr, I, H, eps, timeout_ns,
             KG: gl.constexpr, GT: gl.constexpr, GU_WHOLE: gl.constexpr, NF: gl.constexpr,
             KD: gl.constexpr, TAIL: gl.constexpr, STAGES: gl.constexpr, WIDTH: gl.constexpr,
             TN_: gl.constexpr, KB_: gl.constexpr, TK_: gl.constexpr, WAITS: gl.constexpr,
             MATH: gl.constexpr, CLOCK: gl.constexpr, num_warps: gl.constexpr):
    # a box [TN, kb, TK]: rows over the warps, K tiles in each thread's registers (summed
    # there), columns over a warp's lanes, 8 a lane (16-byte shared loads)
    l3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 1, 32], [num_warps, 1, 1], [2, 1, 0])
    vl: gl.constexpr = gl.SliceLayout(0, l3)             # [kb, TK]: a box's vector part
    al: gl.constexpr = gl.SliceLayout(1, l3)             # [TN, TK]: the accumulator
    rl: gl.constexpr = gl.SliceLayout(1, al)             # [TN]: a row block's results
    KTV: gl.constexpr = NF * KD + TAIL                   # K tiles of h in shared memory
    pid = gl.program_id(0)
    base = prog_ptr + pid * n_instr * WIDTH
    err = err_ptr + pid * 4
    clk = clk_ptr + pid * n_instr * 4                 # [P, N, 4] globaltimer stamps
    kk = gl.arange(0, KG, gl.SliceLayout(1, vl))
    cc = gl.arange(0, TK_, gl.SliceLayout(0, vl))
    offs = kk[:, None] * TK_ + cc[None, :]               # [KG, TK]: x against a gate box
    if GT > 0:                                           # [GT, TK]: x against its tail
        offs_t = (KG + gl.arange(0, GT, gl.SliceLayout(1, vl)))[:, None] * TK_ + cc[None, :]
    k4 = gl.arange(0, 4, gl.SliceLayout(1, vl))
    offs4 = k4[:, None] * TK_ + cc[None, :]              # [4, TK]: h staged 4 tiles a time
    rows_ = gl.arange(0, TN_, rl)
    # the down projection: a box [TN, NW, KD / NW, TK], its K tiles over the warps
    NW: gl.constexpr = num_warps
    l4: gl.constexpr = gl.BlockedLayout([1, 1, 1, 8], [1, 1, 1, 32], [1, NW, 1, 1],
                                        [3, 2, 1, 0])
    vl4: gl.constexpr = gl.SliceLayout(0, l4)            # [NW, kb / NW, TK]: h's part
    a4: gl.constexpr = gl.SliceLayout(2, l4)             # [TN, NW, TK]: the accumulator
    rows_d = gl.arange(0, TN_, gl.SliceLayout(1, gl.SliceLayout(2, a4)))
    pl3: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=1,
                                                order=[2, 1, 0])
    v_full = vec._reinterpret(gl.bfloat16, [NF, NW, KD // NW, TK_], pl3)
    t = 0
    failed = 0
    for i in range(n_instr):
        op = gl.load(base + i * WIDTH + 0)
        layer = gl.load(base + i * WIDTH + 1)
        row0 = gl.load(base + i * WIDTH + 2)
        rows = gl.load(base + i * WIDTH + 3)
        wait = gl.load(base + i * WIDTH + 6)
        target = gl.load(base + i * WIDTH + 7)
        bump = gl.load(base + i * WIDTH + 10)
        if CLOCK:
            gl.store(clk + i * 4, _now())
        if (wait >= 0) & WAITS:
            if failed == 0:
                gl.store(err + 1, wait)
            failed = _wait_counter(ctr_ptr + wait, target, timeout_ns, failed, err, i)
        if CLOCK:
            gl.store(clk + i * 4 + 1, _now())
        x_in = x_ptr + (layer % 2) * H
        if op == 6:                                   # OP_GATE_UP (H <= KG + GT tiles)
            m = offs < H
            xv = gl.load(x_in + offs, mask=m, other=0.0, cache_modifier=".cg").to(gl.float32)
            ss = gl.sum(gl.sum(xv * xv, axis=1), axis=0)
            if GT > 0:
                mt = offs_t < H
                xt = gl.load(x_in + offs_t, mask=mt, other=0.0,
                             cache_modifier=".cg").to(gl.float32)
                ss += gl.sum(gl.sum(xt * xt, axis=1), axis=0)
            rstd = 1.0 / gl.sqrt(ss / H + eps)
            gv = gl.load(g_ptr + layer * H + offs, mask=m, other=0.0).to(gl.float32)
            xn = (xv * rstd * gv).to(gl.bfloat16).to(gl.float32)     # bf16(x * rstd * g)
            if GT > 0:
                gt = gl.load(g_ptr + layer * H + offs_t, mask=mt, other=0.0).to(gl.float32)
                xnt = (xt * rstd * gt).to(gl.bfloat16).to(gl.float32)
            for rb in range(rows // TN_):
                zero = gl.zeros([TN_, TK_], gl.float32, al)
                s = _stage_ready(ready, t, STAGES)
                if GU_WHOLE:                          # one box of KB_ tiles a row, sliced
                    acc_g = _dot_slice(ring_gm, 2 * s, 0, KG, xn, zero, MATH, l3)
                    acc_u = _dot_slice(ring_gm, 2 * s + 1, 0, KG, xn, zero, MATH, l3)
                    if GT > 0:
                        acc_g = _dot_slice(ring_gm, 2 * s, KG, GT, xnt, acc_g, MATH, l3)
                        acc_u = _dot_slice(ring_gm, 2 * s + 1, KG, GT, xnt, acc_u, MATH, l3)
                else:
                    acc_g = _dot_box(ring_gm, 2 * s * (KB_ // KG), xn, zero, MATH, l3)
                    acc_u = _dot_box(ring_gm, (2 * s + 1) * (KB_ // KG), xn, zero, MATH, l3)
                if (GT > 0) & (not GU_WHOLE):         # the K tiles past the main box
                    acc_g = _dot_box(ring_gt, 2 * s * (KB_ // GT) + KG // GT, xnt, acc_g,
                                     MATH, l3)
                    acc_u = _dot_box(ring_gt, (2 * s + 1) * (KB_ // GT) + KG // GT, xnt,
                                     acc_u, MATH, l3)
                _stage_free(empty, s)
                t += 1
                g = gl.sum(acc_g, axis=1)
                u = gl.sum(acc_u, axis=1)
                hv = g / (1.0 + gl.exp(-g)) * u
                gl.store(h_ptr + row0 + rb * TN_ + rows_, hv.to(gl.bfloat16))
        elif op == 7:                                 # OP_DOWN
            # h into shared memory, zeros past I; unrolled, so the loads overlap
            for c in gl.static_range(KTV // 4):
                hv = gl.load(h_ptr + c * 4 * TK_ + offs4, mask=c * 4 * TK_ + offs4 < I,
                             other=0.0, cache_modifier=".cg")
                vec.index(c).store(hv)
            gl.thread_barrier()
            x_out = x_ptr + ((layer + 1) % 2) * H
            for rb in range(rows // TN_):
                r = row0 + rb * TN_ + rows_d
                xr = gl.load(x_in + r, cache_modifier=".cg").to(gl.float32)   # early
                acc = gl.zeros([TN_, NW, TK_], gl.float32, a4)
                for j in range(NF):
                    s = _stage_ready(ready, t, STAGES)
                    hj = v_full.index(j).load(vl4).to(gl.float32)
                    acc = _dot_box_k(ring_dk, s, hj, acc, MATH, l4)
                    _stage_free(empty, s)
                    t += 1
                if TAIL > 0:                          # the K tiles left, in a smaller box
                    v_tail = vec._reinterpret(gl.bfloat16, [KTV // TAIL, NW, TAIL // NW, TK_],
                                              pl3)
                    s = _stage_ready(ready, t, STAGES)
                    ht = v_tail.index(NF * KD // TAIL).load(vl4).to(gl.float32)
                    acc = _dot_box_k(ring_tk, s * (KD // TAIL), ht, acc, MATH, l4)
                    _stage_free(empty, s)
                    t += 1
                y = gl.sum(gl.sum(acc, axis=2), axis=1).to(gl.bfloat16).to(gl.float32)
                gl.store(x_out + r, (xr + y).to(gl.bfloat16))
        if bump >= 0:                                 # every thread's stores, then release
            gl.thread_barrier()
            gl.atomic_add(ctr_ptr + bump, 1, sem="release", scope="gpu")
        if CLOCK:
            gl.store(clk + i * 4 + 2, _now())


@gluon.jit
def mlp_stream_kernel(prog_ptr, n_instr, wgu_desc, wgt_desc, wdn_desc, wdt_desc, x_ptr, g_ptr,
                      h_ptr, ctr_ptr, err_ptr, clk_ptr, I, H, eps, timeout_ns, n_ctr,
                      KB_: gl.constexpr, KG: gl.constexpr, GT: gl.constexpr,
                      GU_WHOLE: gl.constexpr, NF: gl.constexpr,
                      TAIL: gl.constexpr, STAGES: gl.constexpr,
                      WIDTH: gl.constexpr,
                      CTR_BLOCK: gl.constexpr, WAITS: gl.constexpr, MATH: gl.constexpr,
                      CLOCK: gl.constexpr, num_warps: gl.constexpr):
    TN_: gl.constexpr = wgu_desc.block_type.shape[0]
    TK_: gl.constexpr = wgu_desc.block_type.shape[2]
    # a stage is two slots of [TN, KB_, TK]: gate and up (each a KG box and its GT tail,
    # or one box of KG = KB_), or one down box over both
    ring = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, TN_, KB_, TK_], wgu_desc.layout)
    if GU_WHOLE:           # a gate/up box is a whole slot (KB_ tiles), sliced by the math
        ring_gm = ring
    else:
        ring_gm = ring._reinterpret(gl.bfloat16, [2 * STAGES * (KB_ // KG), TN_, KG, TK_],
                                    wgu_desc.layout)
    TG: gl.constexpr = wgt_desc.block_type.shape[1]
    ring_gt = ring._reinterpret(gl.bfloat16, [2 * STAGES * (KB_ // TG), TN_, TG, TK_],
                                wgt_desc.layout)
    # the same bytes as one [TN, KD = 2 KB, TK] box a stage, for the down projection, and
    # as KD / TAIL boxes of [TN, TAIL, TK] a stage for its tail (the first of them used)
    KD: gl.constexpr = wdn_desc.block_type.shape[1]
    ring_dn = ring._reinterpret(gl.bfloat16, [STAGES, TN_, KD, TK_], wdn_desc.layout)
    TB: gl.constexpr = wdt_desc.block_type.shape[1]
    ring_dt = ring._reinterpret(gl.bfloat16, [STAGES * (KD // TB), TN_, TB, TK_],
                                wdt_desc.layout)
    # the compute partition's view of the same down boxes: [TN, NW, K tiles / NW, TK]
    NW: gl.constexpr = num_warps
    pl4: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=1,
                                                order=[3, 2, 1, 0])
    ring_dk = ring._reinterpret(gl.bfloat16, [STAGES, TN_, NW, KD // NW, TK_], pl4)
    ring_tk = ring._reinterpret(gl.bfloat16, [STAGES * (KD // TB), TN_, NW, TB // NW, TK_],
                                pl4)
    # h of the down projection, in chunks of 4 K tiles
    vl: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=1,
                                               order=[1, 0])
    vec = gl.allocate_shared_memory(gl.bfloat16, [(NF * KD + TAIL) // 4, 4, TK_], vl)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize([
        (_compute, (prog_ptr, n_instr, ring_gm, ring_gt, ring_dk, ring_tk, ready, empty, vec,
                    x_ptr, g_ptr, h_ptr, ctr_ptr, err_ptr, clk_ptr, I, H, eps, timeout_ns,
                    KG, GT, GU_WHOLE, NF, KD, TAIL, STAGES, WIDTH, TN_, KB_, TK_, WAITS, MATH,
                    CLOCK, num_warps)),
        (_loader, (prog_ptr, n_instr, wgu_desc, wgt_desc, wdn_desc, wdt_desc, ring, ring_gm,
                   ring_gt, ring_dn, ring_dt, ready, empty, I, H, GT, GU_WHOLE, NF, TAIL,
                   STAGES, KB_, WIDTH))], [1], [48])
    # the last CTA out sets the counters back to zero for the next launch
    gl.thread_barrier()
    n_ctas = gl.num_programs(0)
    old = gl.atomic_add(ctr_ptr + n_ctr, 1, sem="acq_rel", scope="gpu")
    if old == n_ctas - 1:
        zl: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        offs = gl.arange(0, CTR_BLOCK, zl)
        gl.store(ctr_ptr + offs, gl.zeros([CTR_BLOCK], gl.int32, zl), mask=offs <= n_ctr)


# ---- host ------------------------------------------------------------------------------
class MLPStream:
    """The stacked weights of ``layers`` dense MLPs, their schedule, counters and buffers;
    ``run()`` is one launch (x[0] in, x[layers % 2] out)."""

    def __init__(self, w_gu, w_dn, g, P, stages=4, num_warps=4, timeout_ns=200_000_000,
                 waits=True, math=True, clock=False, tails=True, gu_whole=True):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
        L, two_i, H = w_gu.shape
        self.L, self.I, self.H = L, two_i // 2, H
        assert H % TK == 0 and self.I % TK == 0, "whole K tiles"
        self.w_gu, self.w_dn, self.g = w_gu, w_dn, g
        dev = w_gu.device
        self.prog = mlp_schedule(L, H, self.I, P).to(dev)
        self.n_instr = self.prog.shape[1]
        self.n_ctr = 2 * L
        self.ctr = torch.zeros(self.n_ctr + 1, dtype=torch.int32, device=dev)
        self.err = torch.zeros(P, ERR, dtype=torch.int32, device=dev)
        self.x = torch.zeros(2, H, dtype=torch.bfloat16, device=dev)
        self.h = torch.zeros(self.I, dtype=torch.bfloat16, device=dev)
        lay = smem_layout()
        self.kt_gu, self.kt_dn = H // TK, self.I // TK
        self.kg, self.gt = gate_up_boxes(H // TK, KB, tails)
        gu = box_view(w_gu.view(L * two_i, H))
        # gu_whole: gate/up rows brought whole (one run of memory a row, one TMA copy a
        # half, the math slicing off the tiles past K); else a box of KG and one of GT
        self.gu_whole = gu_whole
        self.d_gu = TensorDescriptor.from_tensor(gu, [TN, KB if gu_whole else self.kg, TK],
                                                 lay)
        self.d_gt = TensorDescriptor.from_tensor(gu, [TN, self.gt or self.kg, TK], lay)
        self.nf, self.tail = down_boxes(self.kt_dn, 2 * KB, tails)
        if self.tail:                      # the tail's K tiles split over the warps too
            self.tail = min(max(self.tail, num_warps), 2 * KB)
        dn = box_view(w_dn.view(L * H, self.I))
        self.d_dn = TensorDescriptor.from_tensor(dn, [TN, 2 * KB, TK], lay)
        self.d_dt = TensorDescriptor.from_tensor(dn, [TN, self.tail or 2 * KB, TK], lay)
        self.P, self.stages, self.num_warps, self.timeout_ns = P, stages, num_warps, timeout_ns
        self.waits, self.math = waits, math        # False only in the diagnostics
        self.clock = clock
        # per instruction: start, counter wait over, end (globaltimer ns)
        self.clk = torch.zeros(P, self.n_instr, 4, dtype=torch.int64, device=dev)

    def run(self):
        mlp_stream_kernel[(self.P,)](
            self.prog, self.n_instr, self.d_gu, self.d_gt, self.d_dn, self.d_dt, self.x, self.g,
            self.h, self.ctr, self.err, self.clk, self.I, self.H, 1e-6, self.timeout_ns,
            self.n_ctr, KB_=KB, KG=self.kg, GT=self.gt, GU_WHOLE=self.gu_whole, NF=self.nf,
            TAIL=self.tail, STAGES=self.stages,
            WIDTH=isa.WIDTH,
            WAITS=self.waits, MATH=self.math, CLOCK=self.clock,
            CTR_BLOCK=triton.next_power_of_2(self.n_ctr + 1), num_warps=self.num_warps)

    def check_stalls(self):
        """Raise, naming the SM and counter, if any wait timed out."""
        e = self.err.cpu()
        bad = (e[:, 0] > 0).nonzero().flatten().tolist()
        if bad:
            p = bad[0]
            i, c, v, t = e[p].tolist()
            raise RuntimeError(f"megakernel stalled: SM {p} instruction {i - 1} waited on "
                               f"counter {c} (saw {v}, needs {t}); {len(bad)} SMs stalled")


def reference(w_gu, w_dn, g, x0, eps=1e-6):
    """The same MLP stack in torch, with the kernel's rounding points."""
    x = x0.float()
    I = w_gu.shape[1] // 2
    for l in range(w_gu.shape[0]):
        xn = (x * torch.rsqrt(x.pow(2).mean() + eps) * g[l].float()).bfloat16().float()
        gu = w_gu[l].float() @ xn
        h = (torch.nn.functional.silu(gu[:I]) * gu[I:]).bfloat16().float()
        y = (w_dn[l].float() @ h).bfloat16().float()
        x = (x + y).bfloat16().float()
    return x


def aot(stages=6, num_warps=4, H=1536, I=8960) -> dict:
    """Compile for sm_90 on any machine (no GPU): the layouts, TMA and barriers hold
    (Qwen's intermediate size by default: two full down boxes and a tail of 4 tiles)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    lay = smem_layout()
    nf, tail = down_boxes(I // TK, 2 * KB)
    kg, gt = gate_up_boxes(H // TK, KB)
    sig = {"prog_ptr": "*i32", "n_instr": "i32",
           "wgu_desc": f"tensordesc<bf16[{TN},{KB},{TK}],{lay!r}>",
           "wgt_desc": f"tensordesc<bf16[{TN},{gt or kg},{TK}],{lay!r}>",
           "wdn_desc": f"tensordesc<bf16[{TN},{2 * KB},{TK}],{lay!r}>",
           "wdt_desc": f"tensordesc<bf16[{TN},{tail or 2 * KB},{TK}],{lay!r}>",
           "x_ptr": "*bf16", "g_ptr": "*bf16", "h_ptr": "*bf16", "ctr_ptr": "*i32",
           "err_ptr": "*i32", "clk_ptr": "*i64", "I": "i32", "H": "i32", "eps": "fp32", "timeout_ns": "i64",
           "n_ctr": "i32", "KB_": "constexpr", "KG": "constexpr", "GT": "constexpr",
           "GU_WHOLE": "constexpr", "NF": "constexpr",
           "TAIL": "constexpr",
           "STAGES": "constexpr", "WIDTH": "constexpr", "CTR_BLOCK": "constexpr",
           "WAITS": "constexpr", "MATH": "constexpr", "CLOCK": "constexpr",
           "num_warps": "constexpr"}
    consts = dict(KB_=KB, KG=kg, GT=gt, GU_WHOLE=1, NF=nf, TAIL=tail, STAGES=stages, WIDTH=isa.WIDTH, WAITS=1, MATH=1,
                  CLOCK=1,
                  CTR_BLOCK=64, num_warps=num_warps)
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 6, 7, 8, 9, 10, 11)}
    k = triton.compile(GluonASTSource(mlp_stream_kernel, sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))
    ptx = k.asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx, "TMA loads"
    assert "mbarrier" in ptx and "%globaltimer" in ptx
    return {"shared": k.metadata.shared, "regs": getattr(k, "n_regs", None),
            "tma": ptx.count("cp.async.bulk.tensor"), "ptx_lines": ptx.count("\n")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m onelaunch.megakernel.gluon_mlp",
                                 description="compile the MLP stream for sm_90 (no GPU)")
    ap.add_argument("--aot", action="store_true", required=True)
    ap.add_argument("--stages", default="6")
    ap.add_argument("--warps", default="4")
    a = ap.parse_args(argv)
    for w in (int(v) for v in a.warps.split(",")):
        for s in (int(v) for v in a.stages.split(",")):
            print(f"[gluon_mlp] sm_90 STAGES {s} warps {w}: {aot(stages=s, num_warps=w)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
