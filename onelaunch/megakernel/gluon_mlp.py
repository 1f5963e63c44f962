"""Step (b) of the megakernel (issue 25): the 28 layers' MLPs of a dense model in one
persistent Gluon launch, coupled by counters instead of grid barriers.

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

No wait is unbounded: a counter wait that outlasts ``timeout_ns`` records (instruction,
counter, value seen, target) in ``err[pid]`` and the CTA runs on without waiting, still
consuming every tile so its loader finishes; the host raises with the stalled SM named.

This file is the device code; the host side (the schedule, the TMA boxes and
descriptors, ``MLPStream``, the torch reference and the compile) is ``mlp_stream.py``.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma


# ---- device helpers --------------------------------------------------------------------
@gluon.jit
def _now():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64,
                                     is_pure=False, pack=1)


@gluon.jit
def _load_acquire(ptr):
    """ctr at ``ptr`` by this thread's own load with acquire semantics at GPU scope (no
    broadcast to the CTA, so no barrier a poll)."""
    return gl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr],
                                     dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _store_mine(ptr, v):
    """Store v at ``ptr`` from this thread (a scalar ``gl.store`` stores from one thread
    only): a stall found by any one thread is recorded."""
    return gl.inline_asm_elementwise("st.global.b32 [$1], $2;\nmov.b32 $0, 0;", "=r,l,r",
                                     [ptr, v], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _poll(ctr_ptr, POLL: gl.constexpr):
    if POLL == 1:
        v = _load_acquire(ctr_ptr)
    else:
        v = gl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu")
    return v


@gluon.jit
def _wait_counter(ctr_ptr, target, timeout_ns, failed, err_ptr, instr, POLL: gl.constexpr = 0):
    """Spin until ctr >= target (acquire, GPU scope), at most ``timeout_ns``; on timeout
    record the stall in err and return failed = 1 (later waits are skipped). ``POLL``
    0: one thread's acquire load (``atomic_add`` of 0 lowers to it) broadcast to the CTA
    through shared memory, two barriers a poll; 1: every thread's own acquire load, no
    barrier, so threads leave at their own tries and each that times out records the
    stall itself (``_store_mine``)."""
    v = _poll(ctr_ptr, POLL)
    t0 = _now()
    while (v < target) & (failed == 0):
        if _now() - t0 > timeout_ns:
            _store_mine(err_ptr + 0, instr + 1)
            _store_mine(err_ptr + 2, v)
            _store_mine(err_ptr + 3, target)
            failed = 1
        v = _poll(ctr_ptr, POLL)
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
def _down_views(ring, d_dn, d_dt, STAGES: gl.constexpr, NW: gl.constexpr):
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
def _h_and_barriers(NF: gl.constexpr, KD: gl.constexpr, TAIL: gl.constexpr,
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
def _reset_on_exit(ctr_ptr, n_ctr, CTR_BLOCK: gl.constexpr, num_warps: gl.constexpr):
    """The last CTA out sets the counters (and the exit count, ``ctr[n_ctr]``) back to
    zero for the next launch."""
    gl.thread_barrier()
    n_ctas = gl.num_programs(0)
    old = gl.atomic_add(ctr_ptr + n_ctr, 1, sem="acq_rel", scope="gpu")
    if old == n_ctas - 1:
        zl: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        offs = gl.arange(0, CTR_BLOCK, zl)
        gl.store(ctr_ptr + offs, gl.zeros([CTR_BLOCK], gl.int32, zl), mask=offs <= n_ctr)


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
    ring_dn, ring_dt, ring_dk, ring_tk = _down_views(ring, wdn_desc, wdt_desc, STAGES,
                                                     num_warps)
    KD: gl.constexpr = wdn_desc.block_type.shape[1]
    vec, ready, empty = _h_and_barriers(NF, KD, TAIL, TK_, STAGES)
    gl.warp_specialize([
        (_compute, (prog_ptr, n_instr, ring_gm, ring_gt, ring_dk, ring_tk, ready, empty, vec,
                    x_ptr, g_ptr, h_ptr, ctr_ptr, err_ptr, clk_ptr, I, H, eps, timeout_ns,
                    KG, GT, GU_WHOLE, NF, KD, TAIL, STAGES, WIDTH, TN_, KB_, TK_, WAITS, MATH,
                    CLOCK, num_warps)),
        (_loader, (prog_ptr, n_instr, wgu_desc, wgt_desc, wdn_desc, wdt_desc, ring, ring_gm,
                   ring_gt, ring_dn, ring_dt, ready, empty, I, H, GT, GU_WHOLE, NF, TAIL,
                   STAGES, KB_, WIDTH))], [1], [48])
    _reset_on_exit(ctr_ptr, n_ctr, CTR_BLOCK, num_warps)
