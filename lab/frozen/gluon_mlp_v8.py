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

from onelaunch.megakernel import isa

TN, TK = 4, 256            # a weight tile: 4 rows x 256 columns of bf16, 2 KB
KB = 8                     # K tiles a TMA box: [KB, TN, TK], 16 KB; past K it reads zeros
ERR = 4                    # err[pid] = (instruction + 1, counter, value seen, target)


def smem_layout():
    """A TMA box of [TN rows, KB K tiles, TK columns], unswizzled: a lane's 8 columns are
    16 contiguous bytes and a warp reads 512-byte runs, without bank conflicts."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)


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
def _fill_one(desc, slots, ready, empty, t, r, kt0, STAGES: gl.constexpr):
    """Stage t % STAGES <- one box of rows r.. x K tiles kt0.. (the down projection)."""
    s = t % STAGES
    mbarrier.wait(empty.index(s), ((t // STAGES) & 1) ^ 1)
    mbarrier.expect(ready.index(s), desc.block_type.nbytes)
    tma.async_copy_global_to_shared(desc, [r, kt0, 0], ready.index(s), slots.index(s))
    return t + 1


@gluon.jit
def _loader(prog_ptr, n_instr, wgu_desc, wdn_desc, ring, ring_dn, ready, empty, I, H,
            KT_VEC: gl.constexpr, STAGES: gl.constexpr, WIDTH: gl.constexpr):
    """Every weight box of this SM's list, in the order the compute partition eats them;
    the only wait is for a free stage. A stage is one row block's gate and up rows over
    all of K (two boxes), or one box of 2 KB K tiles of its down rows."""
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
                t = _fill(wgu_desc, ring, ready, empty, t, r, 0, 2, I, STAGES)
        elif op == 7:                                 # OP_DOWN
            for rb in range(rows // TN_):
                r = layer * H + row0 + rb * TN_
                for j in range(KT_VEC // KD):
                    t = _fill_one(wdn_desc, ring_dn, ready, empty, t, r, j * KD, STAGES)


@gluon.jit
def _dot_box(ring, k, v, acc, MATH: gl.constexpr, l3: gl.constexpr):
    """acc[TN, TK] += ring box k [TN, kb, TK] x v[kb, TK], summed over its K tiles in each
    thread's registers."""
    w = ring.index(k).load(l3).to(gl.float32)
    if MATH:
        return acc + gl.sum(w * v[None, :, :], axis=1)
    return acc + gl.sum(w, axis=1)                    # diagnostic: read the box only


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
def _compute(prog_ptr, n_instr, ring, ring_dn, ready, empty, vec, x_ptr, g_ptr, h_ptr, ctr_ptr,
             err_ptr, clk_ptr, I, H, eps, timeout_ns, KT_VEC: gl.constexpr,
             STAGES: gl.constexpr, WIDTH: gl.constexpr, TN_: gl.constexpr,
             KB_: gl.constexpr, TK_: gl.constexpr, WAITS: gl.constexpr, MATH: gl.constexpr,
             CLOCK: gl.constexpr, num_warps: gl.constexpr):
    # a box [TN, kb, TK]: rows over the warps, K tiles in each thread's registers (summed
    # there), columns over a warp's lanes, 8 a lane (16-byte shared loads)
    l3: gl.constexpr = gl.BlockedLayout([1, 1, 8], [1, 1, 32], [num_warps, 1, 1], [2, 1, 0])
    vl: gl.constexpr = gl.SliceLayout(0, l3)             # [kb, TK]: a box's vector part
    al: gl.constexpr = gl.SliceLayout(1, l3)             # [TN, TK]: the accumulator
    rl: gl.constexpr = gl.SliceLayout(1, al)             # [TN]: a row block's results
    KD: gl.constexpr = 2 * KB_                           # K tiles of a down box
    pid = gl.program_id(0)
    base = prog_ptr + pid * n_instr * WIDTH
    err = err_ptr + pid * 4
    clk = clk_ptr + pid * n_instr * 4                 # [P, N, 4] globaltimer stamps
    kk = gl.arange(0, KB_, gl.SliceLayout(1, vl))
    cc = gl.arange(0, TK_, gl.SliceLayout(0, vl))
    offs = kk[:, None] * TK_ + cc[None, :]               # [KB, TK] offsets of a vector box
    rows_ = gl.arange(0, TN_, rl)
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
        if op == 6:                                   # OP_GATE_UP (H <= KB x TK)
            m = offs < H
            xv = gl.load(x_in + offs, mask=m, other=0.0, cache_modifier=".cg").to(gl.float32)
            rstd = 1.0 / gl.sqrt(gl.sum(gl.sum(xv * xv, axis=1), axis=0) / H + eps)
            gv = gl.load(g_ptr + layer * H + offs, mask=m, other=0.0).to(gl.float32)
            xn = (xv * rstd * gv).to(gl.bfloat16).to(gl.float32)     # bf16(x * rstd * g)
            for rb in range(rows // TN_):
                zero = gl.zeros([TN_, TK_], gl.float32, al)
                s = _stage_ready(ready, t, STAGES)
                acc_g = _dot_box(ring, 2 * s, xn, zero, MATH, l3)
                acc_u = _dot_box(ring, 2 * s + 1, xn, zero, MATH, l3)
                _stage_free(empty, s)
                t += 1
                g = gl.sum(acc_g, axis=1)
                u = gl.sum(acc_u, axis=1)
                hv = g / (1.0 + gl.exp(-g)) * u
                gl.store(h_ptr + row0 + rb * TN_ + rows_, hv.to(gl.bfloat16))
        elif op == 7:                                 # OP_DOWN
            for jj in gl.static_range(KT_VEC // KB_):  # h into shared memory, zeros past
                hv = gl.load(h_ptr + jj * KB_ * TK_ + offs,  # I: unrolled, the loads overlap
                             mask=jj * KB_ * TK_ + offs < I, other=0.0, cache_modifier=".cg")
                vec.index(jj).store(hv)
            gl.thread_barrier()
            x_out = x_ptr + ((layer + 1) % 2) * H
            vec_dn = vec._reinterpret(gl.bfloat16, [KT_VEC // KD, KD, TK_], vec.layout)
            for rb in range(rows // TN_):
                r = row0 + rb * TN_ + rows_
                xr = gl.load(x_in + r, cache_modifier=".cg").to(gl.float32)   # early
                acc = gl.zeros([TN_, TK_], gl.float32, al)
                for j in range(KT_VEC // KD):
                    s = _stage_ready(ready, t, STAGES)
                    acc = _dot_box(ring_dn, s, vec_dn.index(j).load(vl).to(gl.float32), acc,
                                   MATH, l3)
                    _stage_free(empty, s)
                    t += 1
                y = gl.sum(acc, axis=1).to(gl.bfloat16).to(gl.float32)
                gl.store(x_out + r, (xr + y).to(gl.bfloat16))
        if bump >= 0:                                 # every thread's stores, then release
            gl.thread_barrier()
            gl.atomic_add(ctr_ptr + bump, 1, sem="release", scope="gpu")
        if CLOCK:
            gl.store(clk + i * 4 + 2, _now())


@gluon.jit
def mlp_stream_kernel(prog_ptr, n_instr, wgu_desc, wdn_desc, x_ptr, g_ptr, h_ptr, ctr_ptr,
                      err_ptr, clk_ptr, I, H, eps, timeout_ns, n_ctr,
                      KT_VEC: gl.constexpr, STAGES: gl.constexpr, WIDTH: gl.constexpr,
                      CTR_BLOCK: gl.constexpr, WAITS: gl.constexpr, MATH: gl.constexpr,
                      CLOCK: gl.constexpr, num_warps: gl.constexpr):
    TN_: gl.constexpr = wgu_desc.block_type.shape[0]
    KB_: gl.constexpr = wgu_desc.block_type.shape[1]
    TK_: gl.constexpr = wgu_desc.block_type.shape[2]
    # two boxes a stage (gate and up; down uses the first)
    ring = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, TN_, KB_, TK_], wgu_desc.layout)
    # the same bytes as one [TN, 2 KB, TK] box a stage, for the down projection
    ring_dn = ring._reinterpret(gl.bfloat16, [STAGES, TN_, 2 * KB_, TK_], wdn_desc.layout)
    vl: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=1, order=[1, 0])
    vec = gl.allocate_shared_memory(gl.bfloat16, [KT_VEC // KB_, KB_, TK_], vl)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    gl.warp_specialize([
        (_compute, (prog_ptr, n_instr, ring, ring_dn, ready, empty, vec, x_ptr, g_ptr, h_ptr,
                    ctr_ptr, err_ptr, clk_ptr, I, H, eps, timeout_ns, KT_VEC, STAGES,
                    WIDTH, TN_, KB_, TK_, WAITS, MATH, CLOCK, num_warps)),
        (_loader, (prog_ptr, n_instr, wgu_desc, wdn_desc, ring, ring_dn, ready, empty, I, H,
                   KT_VEC, STAGES, WIDTH))], [1], [48])
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

    def __init__(self, w_gu, w_dn, g, P, stages=6, num_warps=4, timeout_ns=200_000_000,
                 waits=True, math=True, clock=False):
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
        self.d_gu = TensorDescriptor.from_tensor(box_view(w_gu.view(L * two_i, H)),
                                                 [TN, KB, TK], lay)
        self.d_dn = TensorDescriptor.from_tensor(box_view(w_dn.view(L * H, self.I)),
                                                 [TN, 2 * KB, TK], lay)
        assert self.kt_gu <= KB, "gate/up: all of K in one box"
        self.P, self.stages, self.num_warps, self.timeout_ns = P, stages, num_warps, timeout_ns
        self.waits, self.math = waits, math        # False only in the diagnostics
        self.clock = clock
        # per instruction: start, counter wait over, end (globaltimer ns)
        self.clk = torch.zeros(P, self.n_instr, 4, dtype=torch.int64, device=dev)

    def run(self):
        mlp_stream_kernel[(self.P,)](
            self.prog, self.n_instr, self.d_gu, self.d_dn, self.x, self.g, self.h, self.ctr,
            self.err, self.clk, self.I, self.H, 1e-6, self.timeout_ns, self.n_ctr,
            KT_VEC=triton.cdiv(self.kt_dn, 2 * KB) * 2 * KB, STAGES=self.stages, WIDTH=isa.WIDTH,
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


def aot(stages=6, num_warps=4) -> dict:
    """Compile for sm_90 on any machine (no GPU): the layouts, TMA and barriers hold."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    lay = smem_layout()
    sig = {"prog_ptr": "*i32", "n_instr": "i32",
           "wgu_desc": f"tensordesc<bf16[{TN},{KB},{TK}],{lay!r}>",
           "wdn_desc": f"tensordesc<bf16[{TN},{2 * KB},{TK}],{lay!r}>",
           "x_ptr": "*bf16", "g_ptr": "*bf16", "h_ptr": "*bf16", "ctr_ptr": "*i32",
           "err_ptr": "*i32", "clk_ptr": "*i64", "I": "i32", "H": "i32", "eps": "fp32", "timeout_ns": "i64",
           "n_ctr": "i32", "KT_VEC": "constexpr",
           "STAGES": "constexpr", "WIDTH": "constexpr", "CTR_BLOCK": "constexpr",
           "WAITS": "constexpr", "MATH": "constexpr", "CLOCK": "constexpr",
           "num_warps": "constexpr"}
    consts = dict(KT_VEC=48, STAGES=stages, WIDTH=isa.WIDTH, WAITS=1, MATH=1,
                  CLOCK=1,
                  CTR_BLOCK=64, num_warps=num_warps)
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 4, 5, 6, 7, 8, 9)}
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
