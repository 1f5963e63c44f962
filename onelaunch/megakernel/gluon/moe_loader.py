"""The MoE step's loader (``moe.py``): every weight stage of an SM's list in the compute's
order, as ``loads.stream`` models it.

The GEMV pairs (QKV, O, router, LM head) take a stage a pair of row blocks; an expert's
gate and up rows a stage a row block; R = 2 KB / KE slots' experts' down rows (all of I,
one [TN, KE, TK] box each) a stage. An expert's tiles are addressed by the router's ids,
so before an expert instruction's first stage the loader waits on its LWAIT counter
(bounded, once per counter, a stall recorded in the loader's err row, after the computes'
rows). Before that wait, the first of a run of loader-waiting instructions with a HOIST
streams into the HOLD held stages (after the ring's STAGES) the first GEMV-pair stages of
what follows the run up to the next loader wait: rows that depend on nothing the router
picks. The compute takes them in the same order (``moe._take``).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma

from .. import isa
from .ops import field
from .sync import now, store_mine, wait_counter


@gluon.jit
def _pair_at(desc, ring, ready, empty, s, ph, r, n_rows, r_end):
    """Stage s (its ``ph``-th use's phase) <- row blocks r and r + TN of ``desc`` (whole
    rows); a second block at or past ``r_end`` is asked for past ``n_rows``: zeros."""
    TN_: gl.constexpr = desc.block_type.shape[0]
    mbarrier.wait(empty.index(s), ph ^ 1)
    mbarrier.expect(ready.index(s), 2 * desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [r, 0, 0], ready.index(s), ring.index(2 * s))
    r2 = gl.where(r + TN_ < r_end, r + TN_, n_rows)
    tma.async_copy_global_to_shared(desc, [r2, 0, 0], ready.index(s), ring.index(2 * s + 1))


@gluon.jit
def _pair_of(op, layer, row0, rb, rows, d_qkv, d_o, d_rt, d_lm, ring, ready, empty, s, ph,
             L, H, QKV, E, V):
    """Stage s <- the GEMV pair at rows row0 + rb of instruction (op, layer, row0, rows):
    QKV, O, router or LM-head rows."""
    if op == isa.OP_RMS_QKV:
        r = layer * QKV + row0
        _pair_at(d_qkv, ring, ready, empty, s, ph, r + rb, L * QKV, r + rows)
    elif op == isa.OP_O_PROJ:
        r = layer * H + row0
        _pair_at(d_o, ring, ready, empty, s, ph, r + rb, L * H, r + rows)
    elif op == isa.OP_ROUTER:
        r = layer * E + row0
        _pair_at(d_rt, ring, ready, empty, s, ph, r + rb, L * E, r + rows)
    elif op == isa.OP_LM_HEAD:
        _pair_at(d_lm, ring, ready, empty, s, ph, row0 + rb, V, row0 + rows)


@gluon.jit
def _is_pair(op):
    """The GEMV pairs: a stage a pair of row blocks over all of K."""
    return ((op == isa.OP_RMS_QKV) | (op == isa.OP_O_PROJ) | (op == isa.OP_ROUTER)
            | (op == isa.OP_LM_HEAD))


@gluon.jit
def _hoist(base, i, n_instr, f, hph, d_qkv, d_o, d_rt, d_lm, ring, ready, empty, L, H, QKV,
           E, V, STAGES: gl.constexpr, HOLD: gl.constexpr, WIDTH: gl.constexpr):
    """Held stages 0.. <- the first HOLD GEMV-pair stages after this run of
    loader-waiting instructions (from instruction i on), up to the next loader wait.
    Returns the held stages' phases (bit h: held stage h's uses, mod 2)."""
    TN_: gl.constexpr = d_qkv.block_type.shape[0]
    n = 0
    j = i + 1
    past = 0                                          # past the run
    while (j < n_instr) & (n < HOLD):
        h2 = gl.load(base + j * WIDTH + f)
        if field(h2, f, isa.LWAIT) >= 0:
            if past != 0:                             # the next run: stop
                n = HOLD
        else:
            past = 1
            op = field(h2, f, isa.OP)
            if _is_pair(op):
                layer = field(h2, f, isa.LAYER)
                row0 = field(h2, f, isa.ROW0)
                rows = field(h2, f, isa.ROWS)
                for rb in range(0, gl.minimum(rows, (HOLD - n) * 2 * TN_), 2 * TN_):
                    _pair_of(op, layer, row0, rb, rows, d_qkv, d_o, d_rt, d_lm, ring, ready,
                             empty, STAGES + n, (hph >> n) & 1, L, H, QKV, E, V)
                    hph = hph ^ (1 << n)
                    n += 1
        j += 1
    return hph


@gluon.jit
def _expert_id(ids_ptr, layer, j, E, TOPK: gl.constexpr):
    """Slot j's expert in this layer (read after the router's counter), kept in [0, E)
    (after a timed-out wait it may be anything: the TMA then still reads a real row)."""
    e = gl.load(ids_ptr + layer * TOPK + j, cache_modifier=".cg")
    return gl.minimum(gl.maximum(e, 0), E - 1)


@gluon.jit
def _loader(prog_ptr, n_instr, d_qkv, d_o, d_rt, d_egu, d_edn, d_lm, ring, ring_e, ready,
            empty, ids_ptr, ctr_ptr, err_ptr, clk_ptr, timeout_ns, L, H, I, QKV, E, V,
            C: gl.constexpr):
    """Every weight stage of this SM's list in the compute's order (``loads.stream``):
    the GEMV pairs (QKV, O, router, LM head), an expert's gate and up rows a row block,
    R slots' experts' down rows (all of I) a (row block, R slots); before an expert
    instruction's first stage its LWAIT counter (once per counter), after streaming the
    hoist."""
    TOPK: gl.constexpr = C.TOPK
    STAGES: gl.constexpr = C.STAGES
    HOLD: gl.constexpr = C.HOLD
    WIDTH: gl.constexpr = C.WIDTH
    CLOCK: gl.constexpr = C.CLOCK
    POLL: gl.constexpr = C.POLL
    TN_: gl.constexpr = d_qkv.block_type.shape[0]
    KB_: gl.constexpr = d_qkv.block_type.shape[1]
    KEB: gl.constexpr = d_edn.block_type.shape[1]
    R: gl.constexpr = 2 * KB_ // KEB                  # expert-down boxes a stage
    pid = gl.program_id(0)
    base = prog_ptr + pid * n_instr * WIDTH
    err = err_ptr + (gl.num_programs(0) + pid) * 4    # the loaders' rows after the computes'
    hl: gl.constexpr = gl.BlockedLayout([1], [32], [1], [0])
    f = gl.arange(0, 32, hl)                          # a header over the warp's lanes
    nxt = gl.load(base + f)
    t = 0
    pend = 0                                          # held stages still to come
    hph = 0
    prev_lw = -1
    last_w = -1
    failed = 0
    for i in range(n_instr):
        hdr = nxt
        nxt = gl.load(base + (i + 1) * WIDTH + f, mask=(i + 1 < n_instr) & (f < 32), other=0)
        op = field(hdr, f, isa.OP)
        layer = field(hdr, f, isa.LAYER)
        row0 = field(hdr, f, isa.ROW0)
        rows = field(hdr, f, isa.ROWS)
        lw = field(hdr, f, isa.LWAIT)
        if (lw >= 0) & (prev_lw < 0):                 # the first of a run: its hoist
            pend = 0
            if HOLD > 0:
                if field(hdr, f, isa.HOIST) > 0:
                    pend = HOLD
                    hph = _hoist(base, i, n_instr, f, hph, d_qkv, d_o, d_rt, d_lm, ring,
                                 ready, empty, L, H, QKV, E, V, STAGES, HOLD, WIDTH)
        if (lw >= 0) & (lw != last_w):                # the router's counter, then its ids
            was = failed
            failed = wait_counter(ctr_ptr + lw, field(hdr, f, isa.LTARGET), timeout_ns, failed, err,
                                  i, POLL)
            if (was == 0) & (failed != 0):
                store_mine(err + 1, lw)
            last_w = lw
        prev_lw = lw
        if _is_pair(op):
            for rb in range(0, rows, 2 * TN_):
                if pend > 0:                          # held: streamed before the wait
                    pend -= 1
                else:
                    _pair_of(op, layer, row0, rb, rows, d_qkv, d_o, d_rt, d_lm, ring, ready,
                             empty, t % STAGES, (t // STAGES) & 1, L, H, QKV, E, V)
                    t += 1
        elif op == isa.OP_EXPERT_GATE_UP:         # gate rows, up rows
            for rb in range(0, rows, TN_):
                rr = row0 + rb
                j = rr // I
                e = _expert_id(ids_ptr, layer, j, E, TOPK)
                r = (layer * E + e) * 2 * I + rr - j * I
                s = t % STAGES
                mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), 2 * d_egu.block_type.nbytes)
                tma.async_copy_global_to_shared(d_egu, [r, 0, 0], ready.index(s),
                                                ring.index(2 * s))
                tma.async_copy_global_to_shared(d_egu, [r + I, 0, 0], ready.index(s),
                                                ring.index(2 * s + 1))
                t += 1
        elif op == isa.OP_EXPERT_DOWN:            # a row block's slots,
            j0 = field(hdr, f, isa.K0) // I               # R of them a stage
            ns = field(hdr, f, isa.KLEN) // I
            for rb in range(0, rows, TN_):
                for jg in range(0, ns, R):            # a box past the group's slots is
                    s = t % STAGES                    # asked for past the tensor: zeros
                    mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
                    mbarrier.expect(ready.index(s), R * d_edn.block_type.nbytes)
                    for b in gl.static_range(R):
                        j = jg + b
                        e = _expert_id(ids_ptr, layer, gl.minimum(j0 + j, TOPK - 1), E, TOPK)
                        r = gl.where(j < ns, (layer * E + e) * H + row0 + rb, L * E * H)
                        tma.async_copy_global_to_shared(d_edn, [r, 0, 0], ready.index(s),
                                                        ring_e.index(s * R + b))
                    t += 1
        if CLOCK & (_is_pair(op) | (op == isa.OP_EXPERT_GATE_UP)
                    | (op == isa.OP_EXPERT_DOWN)):
            gl.store(clk_ptr + (pid * n_instr + i) * 4 + 3, now())
