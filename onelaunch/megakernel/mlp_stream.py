"""The host side of the megakernel's MLP stream (``gluon_mlp.py`` is its device code):
the per-SM schedule of the 28 MLPs, the TMA boxes and their descriptors, ``MLPStream``
(weights, counters, buffers, one launch), the torch reference with the kernel's rounding
points, and a compile for sm_90 that needs no GPU.

    m = MLPStream(w_gu, w_dn, g, P=132)       # w_gu [L, 2I, H], w_dn [L, H, I], g [L, H]
    m.x[0].copy_(x0); m.run(); m.check_stalls()   # x[L % 2] near reference(...)

    python lab/mlp_stream.py OUT.json                   # GPU: check, then time (NOTES 23)
    python -m onelaunch.megakernel.mlp_stream --aot     # any machine: compile for sm_90
"""
from __future__ import annotations

import argparse
import sys

import torch
import triton
from triton.experimental.gluon import language as gl

from . import isa
from .gluon_mlp import mlp_stream_kernel

TN, TK = 4, 256            # a weight tile: 4 rows x 256 columns of bf16, 2 KB
KB = 8                     # K tiles a TMA box: [KB, TN, TK], 16 KB; past K it reads zeros
ERR = 4                    # err[pid] = (instruction + 1, counter, value seen, target)


def smem_layout():
    """A TMA box of [TN rows, KB K tiles, TK columns], unswizzled: a lane's 8 columns are
    16 contiguous bytes and a warp reads 512-byte runs, without bank conflicts."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)


def down_boxes(kt: int, kd: int, tail: bool = True, warps: int = 1) -> tuple[int, int]:
    """The down projection's K tiles as NF full boxes of ``kd`` tiles and a tail box of
    TAIL tiles (what is left, rounded up to a power of two; 0 if nothing is left): 35
    tiles (Qwen's 8960) in boxes of 16 are 2 boxes and a tail of 4, one zero tile
    multiplied where whole boxes (``tail=False``: 3 boxes, version 8) multiply 13."""
    nf, rest = divmod(kt, kd)
    if not tail:
        return nf + (rest > 0), 0
    if not rest:
        return nf, 0
    # the tail's K tiles are split over the ``warps`` compute warps too
    return nf, min(max(triton.next_power_of_2(rest), warps), kd)


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


# ---- host -----------------------------------------------------------------------------
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
        self.nf, self.tail = down_boxes(self.kt_dn, 2 * KB, tails, num_warps)
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
        raise_on_stall(self.err)


def raise_on_stall(err: torch.Tensor, names=None) -> None:
    """Raise in one line if a kernel's ``err`` ([P, 4]: instruction + 1, counter, value
    seen, target) records a wait that timed out: the first stalled SM, its instruction
    and counter (``names``: the counters' names), and how many SMs stalled."""
    e = err.cpu()
    bad = (e[:, 0] > 0).nonzero().flatten().tolist()
    if bad:
        p = bad[0]
        i, c, v, t = e[p].tolist()
        name = f"{names[c]}: " if names is not None and 0 <= c < len(names) else ""
        raise RuntimeError(f"megakernel stalled: SM {p} instruction {i - 1} waited on "
                           f"counter {c} ({name}saw {v}, needs {t}); {len(bad)} SMs stalled")


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


def aot(stages=4, num_warps=4, H=1536, I=8960) -> dict:
    """Compile for sm_90 on any machine (no GPU): the layouts, TMA and barriers hold
    (Qwen's intermediate size by default: two full down boxes and a tail of 4 tiles)."""
    lay = smem_layout()
    nf, tail = down_boxes(I // TK, 2 * KB, warps=num_warps)
    kg, gt = gate_up_boxes(H // TK, KB)
    sig = {"prog_ptr": "*i32", "n_instr": "i32",
           "wgu_desc": f"tensordesc<bf16[{TN},{KB},{TK}],{lay!r}>",
           "wgt_desc": f"tensordesc<bf16[{TN},{gt or kg},{TK}],{lay!r}>",
           "wdn_desc": f"tensordesc<bf16[{TN},{2 * KB},{TK}],{lay!r}>",
           "wdt_desc": f"tensordesc<bf16[{TN},{tail or 2 * KB},{TK}],{lay!r}>",
           "x_ptr": "*bf16", "g_ptr": "*bf16", "h_ptr": "*bf16", "ctr_ptr": "*i32",
           "err_ptr": "*i32", "clk_ptr": "*i64", "I": "i32", "H": "i32", "eps": "fp32",
           "timeout_ns": "i64",
           "n_ctr": "i32", "KB_": "constexpr", "KG": "constexpr", "GT": "constexpr",
           "GU_WHOLE": "constexpr", "NF": "constexpr",
           "TAIL": "constexpr",
           "STAGES": "constexpr", "WIDTH": "constexpr", "CTR_BLOCK": "constexpr",
           "WAITS": "constexpr", "MATH": "constexpr", "CLOCK": "constexpr",
           "num_warps": "constexpr"}
    consts = dict(KB_=KB, KG=kg, GT=gt, GU_WHOLE=1, NF=nf, TAIL=tail, STAGES=stages,
                  WIDTH=isa.WIDTH, WAITS=1, MATH=1,
                  CLOCK=1,
                  CTR_BLOCK=64, num_warps=num_warps)
    return compile_sm90(mlp_stream_kernel, sig, consts, (0, 6, 7, 8, 9, 10, 11), num_warps)


def compile_sm90(kernel, sig: dict, consts: dict, aligned, num_warps: int) -> dict:
    """``kernel`` compiled for sm_90 on any machine (arguments ``aligned``: pointers 16-byte
    aligned); raises unless its PTX has TMA copies, mbarriers and the clock. Returns its
    shared memory, TMA copies, every thread's own acquire loads (``POLL`` 1's polls), PTX
    lines and ``code``: a hash of the PTX's code (``ptx_code_hash``)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    k = triton.compile(GluonASTSource(kernel, sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))
    ptx = k.asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx, "TMA loads"
    assert "mbarrier" in ptx and "%globaltimer" in ptx
    return {"shared": k.metadata.shared, "tma": ptx.count("cp.async.bulk.tensor"),
            "acquire": ptx.count("ld.acquire.gpu.global"), "ptx_lines": ptx.count("\n"),
            "code": ptx_code_hash(ptx)}


def ptx_code_hash(ptx: str) -> str:
    """16 hex digits of the SHA-256 of the PTX's code: without its source files and line
    numbers (``.file``, ``.loc``) and debug sections, so moving or re-commenting the
    source leaves it, and any change to the generated code changes it."""
    import hashlib
    keep = []
    for line in ptx.split("\n"):
        s = line.strip()
        if s.startswith(".section") and ".debug" in s:
            break
        if not s.startswith((".file", ".loc")):
            keep.append(line)
    return hashlib.sha256("\n".join(keep).encode()).hexdigest()[:16]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m onelaunch.megakernel.mlp_stream",
                                 description="compile the MLP stream for sm_90 (no GPU)")
    ap.add_argument("--aot", action="store_true", required=True)
    ap.add_argument("--stages", default="4")
    ap.add_argument("--warps", default="4")
    a = ap.parse_args(argv)
    for w in (int(v) for v in a.warps.split(",")):
        for s in (int(v) for v in a.stages.split(",")):
            print(f"[gluon_mlp] sm_90 STAGES {s} warps {w}: {aot(stages=s, num_warps=w)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
