#!/usr/bin/env python3
"""Lab probe (GPU, Hopper): can one persistent Gluon launch stream the 28 MLPs of
Qwen2.5-1.5B with counters instead of grid barriers at the speed of memory? The kernel is
``gluon_mlp.py``; this file is its host side (the per-SM schedule of the MLPs, the TMA
descriptors, ``MLPStream``, the torch reference with the kernel's rounding points, the
compile for sm_90) and the GPU check.

    m = MLPStream(w_gu, w_dn, g, P=132)       # w_gu [L, 2I, H], w_dn [L, H, I], g [L, H]
    m.x[0].copy_(x0); m.run(); m.check_stalls()   # x[L % 2] near reference(...)

    python lab/mlp_stream.py OUT.json [--stages 6,5] [--warps 4] [--modes full,no-waits]
    python lab/mlp_stream.py --aot [--stages 4] [--warps 4]    # any machine: sm_90 compile

Each setting is checked against the reference (two launches bit-identical, counters back
at zero) before it is timed: min / median / max of 50 replays of a graph of 10 launches,
against the floor of the same run. The diagnostic modes drop the counter waits or the
math to show what bounds the rest; their results are wrong on purpose, so they are timed
unchecked and labelled.

Measured (``results/h200/2026-12-01_megakernel-mlp-stream/mlp_stream_4x256_modes.json``
and the ``mlp_stream_v*.json`` runs beside it, on the H200): 0.70-0.71 ms, 1.29-1.31x the floor, equal to the chain's MLP kernels; streaming
alone 1.09-1.13x.
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import sys
from pathlib import Path

import torch
import triton

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]
from gluon_mlp import mlp_stream_kernel  # noqa: E402
from onelaunch.megakernel import isa  # noqa: E402
from onelaunch.megakernel.aot import compile_sm90  # noqa: E402
from onelaunch.megakernel.boxes import (KB, TK, TN, box_view, down_boxes,  # noqa: E402
                                        gate_up_boxes, smem_layout)
from onelaunch.megakernel.step import ERR, raise_on_stall  # noqa: E402
from onelaunch.measure.timing import read_bandwidth  # noqa: E402


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


# ---- the GPU check ----------------------------------------------------------------------
def kernel_module(path: str | None):
    """This kernel (its host side, this module), or an earlier version frozen in a file
    (``--kernel``), so a change is timed against what it replaces in the same run."""
    if not path:
        return sys.modules[__name__]
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def graph_us(run, iters: int, reps: int = 10) -> list[float]:
    """Microseconds a launch: ``reps`` launches captured in one graph, ``iters`` replays
    timed with events; sorted, so [0], [len // 2], [-1] are min, median and max."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            run()
    graph.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        graph.replay()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / reps)
    return sorted(ts)


def check(m, x0, ref) -> dict:
    """Two launches from x0: close to the reference, bit-identical, counters back to 0."""
    outs = []
    for _ in range(2):
        m.x[0].copy_(x0)
        m.run()
        torch.cuda.synchronize()
        m.check_stalls()
        outs.append(m.x[m.L % 2].float().clone())
    rel = ((outs[0] - ref).norm() / ref.norm()).item()
    row = dict(max_err=(outs[0] - ref).abs().max().item(), rel_err=rel,
               replay_identical=torch.equal(outs[0], outs[1]),
               ctr_zero=bool((m.ctr == 0).all().item()))
    ok = rel < 2e-2 and row["replay_identical"] and row["ctr_zero"]
    row["check"] = "pass" if ok else "FAIL"
    return row


# the diagnostics drop a part of the work to show what bounds the rest; their results are
# wrong on purpose (no counter waits, or tiles read but not multiplied), so they are
# timed without the check and labelled as such
MODES = {"full": dict(), "no-waits": dict(waits=False), "no-math": dict(math=False),
         "stream-only": dict(waits=False, math=False)}


def timeline(m, x0) -> dict:
    """One launch with the clock on: per op, the mean time an SM spends waiting on
    counters and working (us a step), and the launch's span."""
    m.x[0].copy_(x0)
    m.clk.zero_()
    m.run()
    torch.cuda.synchronize()
    clk, prog = m.clk.cpu(), m.prog.cpu()
    t0 = clk[..., 0][clk[..., 0] > 0].min()
    out = {}
    for op, name in ((isa.OP_GATE_UP, "gate_up"), (isa.OP_DOWN, "down")):
        sel = prog[:, :, isa.OP] == op                     # [P, N]
        c = clk[sel].double()                              # [n, 4]
        out[name] = {"wait_us": float((c[:, 1] - c[:, 0]).sum() / 1e3 / m.P),
                     "work_us": float((c[:, 2] - c[:, 1]).sum() / 1e3 / m.P)}
    live = clk[..., 2][clk[..., 2] > 0]
    out["span_us"] = float((live.max() - t0) / 1e3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python lab/mlp_stream.py")
    ap.add_argument("out", nargs="?")
    ap.add_argument("--aot", action="store_true",
                    help="compile for sm_90 (any machine, no GPU) and print what it holds")
    ap.add_argument("--stages", default="4")
    ap.add_argument("--warps", default="4")
    ap.add_argument("--modes", default="full,no-waits,no-math,stream-only")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--kernel", help="a file with an earlier host module to time instead")
    ap.add_argument("--tails", default="on", choices=["on", "off"],
                    help="off: whole boxes with zero tiles past K")
    ap.add_argument("--gu-whole", default="on", choices=["on", "off"],
                    help="off: gate/up rows as a box of 4 tiles and a tail box")
    a = ap.parse_args(argv)
    if a.aot:
        for w in (int(v) for v in a.warps.split(",")):
            for st in (int(v) for v in a.stages.split(",")):
                print(f"[gluon_mlp] sm_90 STAGES {st} warps {w}: {aot(stages=st, num_warps=w)}")
        return 0
    km = kernel_module(a.kernel)
    extra = {} if a.kernel else {"tails": a.tails == "on", "gu_whole": a.gu_whole == "on"}
    dev = "cuda"
    P = torch.cuda.get_device_properties(0).multi_processor_count
    L, H, I = a.layers, 1536, 8960                      # Qwen2.5-1.5B's MLP
    gen = torch.Generator(device=dev).manual_seed(0)
    w_gu = (torch.randn(L, 2 * I, H, device=dev, generator=gen) * 0.02).bfloat16()
    w_dn = (torch.randn(L, H, I, device=dev, generator=gen) * 0.02).bfloat16()
    g = (1 + 0.1 * torch.randn(L, H, device=dev, generator=gen)).bfloat16()
    x0 = torch.randn(H, device=dev, generator=gen).bfloat16()
    ref = km.reference(w_gu, w_dn, g, x0)
    nbytes = (w_gu.numel() + w_dn.numel() + g.numel()) * 2
    read_tbps = read_bandwidth(dev)
    floor_us = nbytes / read_tbps / 1e6
    rows = []
    for warps, stages, mode in itertools.product(
            [int(v) for v in a.warps.split(",")],
            [int(v) for v in a.stages.split(",")], a.modes.split(",")):
        row = {"kernel": a.kernel or "lab/gluon_mlp.py", **extra, "mode": mode,
               "stages": stages, "warps": warps,
               "ring_kb": stages * 2 * km.KB * km.TN * km.TK * 2 / 1024}
        try:
            m = km.MLPStream(w_gu, w_dn, g, P, stages=stages, num_warps=warps,
                             **MODES[mode], **extra)
            row.update(check(m, x0, ref) if mode == "full"
                       else {"check": "diagnostic (not checked)"})
            if row["check"] != "FAIL":
                ts = graph_us(m.run, a.iters)
                med = ts[len(ts) // 2]
                row.update(us_min=ts[0], us_med=med, us_max=ts[-1],
                           x_floor=med / floor_us, tbps=nbytes / (med * 1e-6) / 1e12)
                if mode == "full":
                    m.check_stalls()
                    mc = km.MLPStream(w_gu, w_dn, g, P, stages=stages, num_warps=warps,
                                      clock=True, **extra)
                    row["timeline"] = timeline(mc, x0)
        except Exception as ex:                    # noqa: BLE001 - reported, exit 1
            row["check"] = f"FAIL {type(ex).__name__}: {str(ex)[:300]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    res = {"gpu": torch.cuda.get_device_name(0), "programs": P, "layers": L,
           "read_tbps": read_tbps, "bytes": nbytes, "floor_us": floor_us, "rows": rows}
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)
    print(f"floor {floor_us:.1f} us for {nbytes / 1e6:.1f} MB at {read_tbps:.2f} TB/s")
    for r in rows:
        head = f"{r['mode']:12} stages {r['stages']:2} warps {r['warps']}:"
        if "us_med" in r:
            print(f"{head} {r['us_min']:.1f} / {r['us_med']:.1f} / {r['us_max']:.1f} us, "
                  f"{r['x_floor']:.3f}x floor, {r['tbps']:.2f} TB/s "
                  f"{json.dumps(r.get('timeline', ''))}")
        else:
            print(f"{head} {r['check']}")
    return 0 if all(not r["check"].startswith("FAIL") for r in rows) else 1



if __name__ == "__main__":
    sys.exit(main())
