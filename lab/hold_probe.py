#!/usr/bin/env python3
"""Lab probe (GPU, Hopper or Ada): do weight tiles held in shared memory through an idle
stretch come back as time in the GEMV that follows?

The persistent layer's small phases (QKV, attention, its merge, O) leave HBM mostly idle
for about 19 us a layer, and Triton's pipeliner cannot carry a load across them. Gluon
can: this kernel, one program an SM, streams its share of a gate/up-sized weight matrix
through a ring of BUF shared-memory slots with `cp.async`. With HOLD the ring's first
BUF - 1 tiles are issued *before* an idle stretch of SPIN ns (a stand-in for the small
phases and their barriers, timed on `%globaltimer`), without HOLD after it. If the bytes
land while the program waits, HOLD saves (BUF - 1) tiles' bytes over the grid at the
read bandwidth; the GEMV's result is the same either way and is checked against
torch before any time is taken.

    python lab/hold_probe.py OUT.json          # GPU: check, then time each setting
    python lab/hold_probe.py --aot             # CPU: compile for sm_90 only (no run)
    python -m pytest lab/test_hold_probe.py    # the same compile, as a test

Measured (`results/h200/2026-11-30_bulk-prefetch-and-smem-hold/hold.json`): with 8-12
slots and a 10 us stretch, held tiles came back as 67-72% of their bytes' time (2.6-3.8 us
a layer), 50-60% with 2-4 slots; no difference without a stretch. Shared memory keeps
bytes requested while idle, where the L2 did not
(`results/h200/2026-11-30_o-merge-and-l2-prefetch/l2p_*.json`,
`results/h200/2026-11-30_bulk-prefetch-and-smem-hold/l2pb_*.json`); not enough alone to
beat the chain.
"""
from __future__ import annotations

import argparse
import json
import sys

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as cp

BN, BK, KT = 16, 512, 3          # a tile: 16 rows x 512 columns of bf16, 16 KB; K = 1536
RB = 8                           # row blocks a program: 24 tiles, 384 KB


@gluon.jit
def _now():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64,
                                     is_pure=False, pack=1)


@gluon.jit
def _issue(w_ptr, smem, t, n_tiles, row0, rows, cols, K,
           BN: gl.constexpr, BK: gl.constexpr, KT: gl.constexpr, BUF: gl.constexpr):
    """Tile t of this program (row block t // KT, K tile t % KT) into slot t % BUF, as
    one commit group (empty past the last tile, so the wait counts stay the same)."""
    r = row0 + (t // KT) * BN + rows
    c = (t % KT) * BK + cols                     # K = KT * BK: no column mask
    ok = gl.full([BN], t < n_tiles, gl.int1, rows.type.layout)
    cp.async_copy_global_to_shared(smem.index(t % BUF), w_ptr + r[:, None] * K + c[None, :],
                                   mask=ok[:, None])
    cp.commit_group()


@gluon.jit
def _held_gemv(w_ptr, x_ptr, out_ptr, K, spin_ns,
               BN: gl.constexpr, BK: gl.constexpr, KT: gl.constexpr, RB: gl.constexpr,
               BUF: gl.constexpr, HOLD: gl.constexpr, num_warps: gl.constexpr):
    pid = gl.program_id(0)
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    slots: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=1,
                                                  order=[1, 0])
    smem = gl.allocate_shared_memory(gl.bfloat16, [BUF, BN, BK], layout=slots)
    rows = gl.arange(0, BN, gl.SliceLayout(1, layout))
    cols = gl.arange(0, BK, gl.SliceLayout(0, layout))
    row0 = pid * RB * BN
    n_tiles = RB * KT
    if HOLD:                     # the ring's first tiles requested before the idle stretch
        for i in gl.static_range(BUF - 1):
            _issue(w_ptr, smem, i, n_tiles, row0, rows, cols, K, BN, BK, KT, BUF)
    t0 = _now()
    while _now() - t0 < spin_ns:   # the small phases: no bytes of this matrix needed
        pass
    if not HOLD:
        for i in gl.static_range(BUF - 1):
            _issue(w_ptr, smem, i, n_tiles, row0, rows, cols, K, BN, BK, KT, BUF)
    for rb in range(RB):
        acc = gl.zeros([BN], gl.float32, gl.SliceLayout(1, layout))
        for kt in gl.static_range(KT):
            t = rb * KT + kt
            _issue(w_ptr, smem, t + BUF - 1, n_tiles, row0, rows, cols, K, BN, BK, KT, BUF)
            cp.wait_group(BUF - 1)   # tile t has landed (each thread reads what it copied)
            w = smem.index(t % BUF).load(layout).to(gl.float32)
            x = gl.load(x_ptr + kt * BK + cols).to(gl.float32)
            acc += gl.sum(w * x[None, :], axis=1)
        gl.store(out_ptr + row0 + rb * BN + rows, acc)
    cp.wait_group(0)


def run_one(w, x, out, spin_ns, buf, hold, warps=4):
    P = w.shape[0] // (RB * BN)
    _held_gemv[(P,)](w, x, out, w.shape[1], spin_ns, BN=BN, BK=BK, KT=KT, RB=RB, BUF=buf,
                     HOLD=hold, num_warps=warps)


def aot() -> None:
    """Compile for sm_90 on any machine: the probe's syntax, layouts and copies hold."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    sig = {"w_ptr": "*bf16", "x_ptr": "*bf16", "out_ptr": "*fp32", "K": "i32",
           "spin_ns": "i64", "BN": "constexpr", "BK": "constexpr", "KT": "constexpr",
           "RB": "constexpr", "BUF": "constexpr", "HOLD": "constexpr",
           "num_warps": "constexpr"}
    # pointers 16-byte aligned and K a multiple of 16, as the GPU run's tensors are
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(4)}
    for buf, hold in ((4, 0), (8, 1)):
        k = triton.compile(GluonASTSource(_held_gemv, sig, constexprs=dict(
            BN=BN, BK=BK, KT=KT, RB=RB, BUF=buf, HOLD=hold, num_warps=4), attrs=attrs),
            target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
        ptx = k.asm["ptx"]
        assert "cp.async" in ptx and "%globaltimer" in ptx, "async copies and the clock"
        copies = ptx.count("cp.async.ca") + ptx.count("cp.async.cg")
        print(f"[hold_probe] sm_90 BUF {buf} HOLD {hold}: {copies} cp.async, "
              f"shared {k.metadata.shared} B")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--aot", action="store_true")
    ap.add_argument("--spins", default="0,10000")
    ap.add_argument("--bufs", default="2,4,8,12")
    ap.add_argument("--iters", type=int, default=50)
    a = ap.parse_args()
    if a.aot:
        aot()
        return
    import torch
    dev = "cuda"
    P = torch.cuda.get_device_properties(0).multi_processor_count
    K = KT * BK
    N = P * RB * BN
    g = torch.Generator(device=dev).manual_seed(0)
    w = (torch.randn(N, K, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    x = torch.randn(K, device=dev, generator=g).to(torch.bfloat16)
    ref = w.float() @ x.float()
    out = torch.empty(N, device=dev, dtype=torch.float32)
    mb = w.numel() * 2 / 1e6
    from onelaunch.measure.timing import graph_time as _graph_time
    from onelaunch.measure.timing import read_bandwidth
    read_tbps = read_bandwidth(dev)          # the floor's denominator, this process
    rows = []
    spins = [int(s) for s in a.spins.split(",")]
    bufs = [int(b) for b in a.bufs.split(",")]
    for spin in spins:
        for buf in bufs:
            for hold in (0, 1):
                out.zero_()
                run_one(w, x, out, spin, buf, hold)
                torch.cuda.synchronize()
                err = (out - ref).abs().max().item()
                ok = torch.allclose(out, ref, rtol=1e-3, atol=1e-3)
                row = {"spin_ns": spin, "buf": buf, "hold": hold,
                       "check": "pass" if ok else f"FAIL max err {err:.3g}",
                       "held_kb_per_sm": hold * (buf - 1) * BN * BK * 2 / 1024, "mb": mb}
                if ok:             # time only what was checked: 20 launches in one graph
                    row["us"] = _graph_time(
                        lambda: [run_one(w, x, out, spin, buf, hold) for _ in range(20)],
                        20, dev, a.iters)
                rows.append(row)
                print(json.dumps(row), flush=True)
    # what HOLD saved against what its bytes take at the copy's read rate
    for spin in spins:
        for buf in bufs:
            r0, r1 = [next(r for r in rows if r["spin_ns"] == spin and r["buf"] == buf
                           and r["hold"] == h) for h in (0, 1)]
            if "us" in r0 and "us" in r1:
                held_mb = (buf - 1) * BN * BK * 2 * P / 1e6
                r1["saved_us"] = r0["us"] - r1["us"]
                r1["held_mb"] = held_mb
                r1["bytes_us"] = held_mb / read_tbps
    res = {"gpu": torch.cuda.get_device_name(0), "programs": P, "read_tbps": read_tbps,
           "stream_mb": mb, "bytes_us": mb / read_tbps, "rows": rows}
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)
    for r in rows:
        if "saved_us" in r:
            print(f"spin {r['spin_ns']} ns, {r['buf']} slots: held {r['held_mb']:.1f} MB, "
                  f"saved {r['saved_us']:.2f} us of {r['bytes_us']:.2f}")
    bad = [r for r in rows if r["check"] != "pass"]
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
