"""Lab prototype (GPU, Hopper): the 28 layers' MLPs of a dense model in one persistent
Gluon launch, coupled by counters instead of grid barriers; the one-launch step
(``onelaunch/megakernel/gluon/``) grew from it and shares its waits, ring and dots.

    x_{l+1} = x_l + W_down_l @ (silu(W_gate_l @ xn) * (W_up_l @ xn)),  xn = rmsnorm(x_l) * g_l

One CTA an SM walks its own instruction list (``isa`` format; ``mlp_schedule`` in
``mlp_stream.py``). Two partitions share a ring of ``STAGES`` shared-memory tiles of
[TN, TK] weights:

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

Waits are bounded (``sync.py``): a stalled CTA records where, runs on without waiting and
still consumes every tile, so its loader finishes; the host raises with the stalled SM
named. The host side (the schedule, descriptors, ``MLPStream``, the torch reference, the
compile and the GPU check) is ``mlp_stream.py``.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from onelaunch.megakernel import isa
from onelaunch.megakernel.gluon.ring import (dot_box_k, dot_slice, down_views, fill, fill_one,
                                             h_and_barriers)
from onelaunch.megakernel.gluon.sync import (now, reset_on_exit, stage_free, stage_ready,
                                             wait_counter)


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
        op = gl.load(base + i * WIDTH + isa.OP)
        layer = gl.load(base + i * WIDTH + isa.LAYER)
        row0 = gl.load(base + i * WIDTH + isa.ROW0)
        rows = gl.load(base + i * WIDTH + isa.ROWS)
        if op == isa.OP_GATE_UP:                  # gate and up rows, one stage
            for rb in range(rows // TN_):
                r = layer * 2 * I + row0 + rb * TN_
                if (GT > 0) & (not GU_WHOLE):
                    t = _fill_gu(wgu_desc, wgt_desc, ring_gm, ring_gt, ready, empty, t, r, I,
                                 STAGES, KB_)
                else:
                    t = fill(wgu_desc, ring, ready, empty, t, r, 0, 2, I, STAGES)
        elif op == isa.OP_DOWN:
            for rb in range(rows // TN_):
                r = layer * H + row0 + rb * TN_
                for j in range(NF):
                    t = fill_one(wdn_desc, ring_dn, ready, empty, t, r, j * KD, STAGES, 1)
                if TAIL > 0:
                    t = fill_one(wdt_desc, ring_dt, ready, empty, t, r, NF * KD, STAGES,
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
        op = gl.load(base + i * WIDTH + isa.OP)
        layer = gl.load(base + i * WIDTH + isa.LAYER)
        row0 = gl.load(base + i * WIDTH + isa.ROW0)
        rows = gl.load(base + i * WIDTH + isa.ROWS)
        wait = gl.load(base + i * WIDTH + isa.WAIT0)
        target = gl.load(base + i * WIDTH + isa.TARGET0)
        bump = gl.load(base + i * WIDTH + isa.BUMP)
        if CLOCK:
            gl.store(clk + i * 4, now())
        if (wait >= 0) & WAITS:
            if failed == 0:
                gl.store(err + 1, wait)
            failed = wait_counter(ctr_ptr + wait, target, timeout_ns, failed, err, i)
        if CLOCK:
            gl.store(clk + i * 4 + 1, now())
        x_in = x_ptr + (layer % 2) * H
        if op == isa.OP_GATE_UP:                  # H <= KG + GT tiles
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
                s = stage_ready(ready, t, STAGES)
                if GU_WHOLE:                          # one box of KB_ tiles a row, sliced
                    acc_g = dot_slice(ring_gm, 2 * s, 0, KG, xn, zero, MATH, l3)
                    acc_u = dot_slice(ring_gm, 2 * s + 1, 0, KG, xn, zero, MATH, l3)
                    if GT > 0:
                        acc_g = dot_slice(ring_gm, 2 * s, KG, GT, xnt, acc_g, MATH, l3)
                        acc_u = dot_slice(ring_gm, 2 * s + 1, KG, GT, xnt, acc_u, MATH, l3)
                else:
                    acc_g = _dot_box(ring_gm, 2 * s * (KB_ // KG), xn, zero, MATH, l3)
                    acc_u = _dot_box(ring_gm, (2 * s + 1) * (KB_ // KG), xn, zero, MATH, l3)
                if (GT > 0) & (not GU_WHOLE):         # the K tiles past the main box
                    acc_g = _dot_box(ring_gt, 2 * s * (KB_ // GT) + KG // GT, xnt, acc_g,
                                     MATH, l3)
                    acc_u = _dot_box(ring_gt, (2 * s + 1) * (KB_ // GT) + KG // GT, xnt,
                                     acc_u, MATH, l3)
                stage_free(empty, s)
                t += 1
                g = gl.sum(acc_g, axis=1)
                u = gl.sum(acc_u, axis=1)
                hv = g / (1.0 + gl.exp(-g)) * u
                gl.store(h_ptr + row0 + rb * TN_ + rows_, hv.to(gl.bfloat16))
        elif op == isa.OP_DOWN:
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
                    s = stage_ready(ready, t, STAGES)
                    hj = v_full.index(j).load(vl4).to(gl.float32)
                    acc = dot_box_k(ring_dk, s, hj, acc, MATH, l4)
                    stage_free(empty, s)
                    t += 1
                if TAIL > 0:                          # the K tiles left, in a smaller box
                    v_tail = vec._reinterpret(gl.bfloat16, [KTV // TAIL, NW, TAIL // NW, TK_],
                                              pl3)
                    s = stage_ready(ready, t, STAGES)
                    ht = v_tail.index(NF * KD // TAIL).load(vl4).to(gl.float32)
                    acc = dot_box_k(ring_tk, s * (KD // TAIL), ht, acc, MATH, l4)
                    stage_free(empty, s)
                    t += 1
                y = gl.sum(gl.sum(acc, axis=2), axis=1).to(gl.bfloat16).to(gl.float32)
                gl.store(x_out + r, (xr + y).to(gl.bfloat16))
        if bump >= 0:                                 # every thread's stores, then release
            gl.thread_barrier()
            gl.atomic_add(ctr_ptr + bump, 1, sem="release", scope="gpu")
        if CLOCK:
            gl.store(clk + i * 4 + 2, now())


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
    # the same bytes as the down projection's boxes (the loader's and the compute's views)
    ring_dn, ring_dt, ring_dk, ring_tk = down_views(ring, wdn_desc, wdt_desc, STAGES,
                                                    num_warps)
    KD: gl.constexpr = wdn_desc.block_type.shape[1]
    vec, ready, empty = h_and_barriers(NF, KD, TAIL, TK_, STAGES)
    gl.warp_specialize([
        (_compute, (prog_ptr, n_instr, ring_gm, ring_gt, ring_dk, ring_tk, ready, empty, vec,
                    x_ptr, g_ptr, h_ptr, ctr_ptr, err_ptr, clk_ptr, I, H, eps, timeout_ns,
                    KG, GT, GU_WHOLE, NF, KD, TAIL, STAGES, WIDTH, TN_, KB_, TK_, WAITS, MATH,
                    CLOCK, num_warps)),
        (_loader, (prog_ptr, n_instr, wgu_desc, wgt_desc, wdn_desc, wdt_desc, ring, ring_gm,
                   ring_gt, ring_dn, ring_dt, ready, empty, I, H, GT, GU_WHOLE, NF, TAIL,
                   STAGES, KB_, WIDTH))], [1], [48])
    reset_on_exit(ctr_ptr, n_ctr, CTR_BLOCK, num_warps)
