#!/usr/bin/env python3
"""Lab probe (GPU, Hopper): can one persistent Gluon launch stream the 28 MLPs of
Qwen2.5-1.5B with counters instead of grid barriers at the speed of memory? (issue 25,
step b; the kernel is ``onelaunch/megakernel/gluon_mlp.py``, its host side
``mlp_stream.py``.)

Each setting is checked against a torch reference with the kernel's rounding points (two
launches bit-identical, counters back at zero) before it is timed: min / median / max of
50 replays of a graph of 10 launches, against the floor of the same run. The diagnostic
modes drop the counter waits or the math to show what bounds the rest; their results are
wrong on purpose, so they are timed unchecked and labelled.

    python lab/mlp_stream.py OUT.json [--stages 6,5] [--warps 4] [--modes full,no-waits]

Measured (NOTES.md entry 23, `results/h200/2026-12-01_megakernel-mlp-stream/mlp_stream_*.json`): 0.70-0.71 ms,
1.29-1.31x the floor, equal to the chain's MLP kernels; streaming alone 1.09-1.13x.
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from onelaunch.megakernel import isa, mlp_stream  # noqa: E402
from onelaunch.measure.timing import read_bandwidth  # noqa: E402


def kernel_module(path: str | None):
    """The package's kernel (its host side, ``mlp_stream``), or an earlier version frozen
    in a file (``--kernel``), so a change is timed against what it replaces in the same
    run."""
    if not path:
        return mlp_stream
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
    ap.add_argument("--stages", default="4")
    ap.add_argument("--warps", default="4")
    ap.add_argument("--modes", default="full,no-waits,no-math,stream-only")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--kernel", help="a file with an earlier gluon_mlp to time instead")
    ap.add_argument("--tails", default="on", choices=["on", "off"],
                    help="off: whole boxes with zero tiles past K (version 8's boxes)")
    ap.add_argument("--gu-whole", default="on", choices=["on", "off"],
                    help="off: gate/up rows as a box of 4 tiles and a tail box (version 10)")
    a = ap.parse_args(argv)
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
        row = {"kernel": a.kernel or "onelaunch/megakernel/gluon_mlp.py", **extra, "mode": mode,
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
