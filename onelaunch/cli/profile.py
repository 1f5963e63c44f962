"""``python -m onelaunch.profile``: where each rung's step time goes, per op, from the
GPU's kernel record (:func:`profile_main`). It reads its arguments, turns the model's name
into a spec, measures the bandwidth once, and hands both down. A rung that fails its
oracle check gets no profile, and the command exits 1 after printing every row.

    python -m onelaunch.profile --model qwen2.5-1.5b --ctx 512 --json out.json --png out.png
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from ..measure.profile import PROFILE_RUNGS, profile_rows
from ..measure.timing import run_bandwidth
from ..specs import get_spec
from ..weights import random_weights
from .args import _output_file


def profile_main(argv=None) -> int:
    import matplotlib
    matplotlib.use("Agg")                   # the command draws to files, headless
    ap = argparse.ArgumentParser(prog="python -m onelaunch.profile",
                                 description="Where each rung's step time goes, per op, from "
                                             "the GPU's kernel record (needs a CUDA GPU).")
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--rungs", default=",".join(PROFILE_RUNGS),
                    help="comma list of rungs (measure.rungs.RUNGS)")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, type=_output_file,
                    help="write {meta, read_tbps, rows} here")
    ap.add_argument("--png", default=None, type=_output_file, help="draw the figure here")
    ap.add_argument("--trace-dir", default=None, help="keep each rung's Chrome trace here")
    ap.add_argument("--cupti-warmup", action="store_true",
                    help="an empty profiler recording before any graph capture (PyTorch's "
                         "workaround; try it if the first run records no kernels or crashes)")
    ap.add_argument("--results", action="store_true",
                    help="also merge the rows into results/<gpu>/profile.json")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: the step profile needs a CUDA GPU (torch.profiler records the kernels "
              "through CUPTI); none is visible", file=sys.stderr)
        return 2
    from ..report import results
    from ..report.profile_figures import DPI, caption, draw_profile
    dev = "cuda"
    spec = get_spec(a.model)
    rungs = tuple(r.strip() for r in a.rungs.split(",") if r.strip())
    if a.trace_dir:
        os.makedirs(a.trace_dir, exist_ok=True)
    w = random_weights(spec, a.seed, device=dev)
    bw = run_bandwidth(dev)
    print(f"{spec.name}, ctx {a.ctx}, on {torch.cuda.get_device_name()}: read bandwidth "
          f"{bw:.3f} TB/s", flush=True)
    rows = profile_rows(spec, w, dev, ctx=a.ctx, rungs=rungs, replays=a.replays,
                        read_tbps=bw, seed=a.seed, trace_dir=a.trace_dir, echo=True,
                        cupti_warmup=a.cupti_warmup)
    commit, gpu = results.git_commit(), results.gpu_name(dev)
    for r in rows:
        r.setdefault("commit", commit)
        r.setdefault("device", gpu)
        if results.run_id():
            r.setdefault("run", results.run_id())
    params = {"model": spec.name, "ctx": a.ctx, "replays": a.replays, "rungs": list(rungs),
              "seed": a.seed, "cupti_warmup": a.cupti_warmup}
    for g in dict.fromkeys(r["rung"] for r in rows):
        mine = [r for r in rows if r["rung"] == g]
        if mine[0].get("refused") or mine[0].get("error"):
            why = mine[0].get("refused") or mine[0].get("error")
            print(f"{g:>16}: {'REFUSED' if mine[0].get('refused') else 'ERROR'} ({why[:300]})")
            continue
        m = mine[0]
        print(f"{g:>16}: span {m['span_ms']:.4f} ms ({m['span_x_floor']:.2f}x floor "
              f"{m['floor_ms']:.4f}), step {m['step_ms']:.4f} ms timed unprofiled"
              + (f"; {m['note']}" if m.get("note") else ""))
        for r in mine:
            print(f"{'':>18}{r['op']:<22} {r['ms']:.4f} ms = bytes {r['bytes_ms']:.4f} "
                  f"+ beyond {r['beyond_ms']:+.4f}  ({r['launches']} launches)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": results.meta(dev, params), "read_tbps": bw, "rows": rows}, f,
                      indent=1)
        print(f"wrote {a.json}")
    if a.results:
        p = results.write("profile", rows, dev, params, merge_keys=("model", "rung", "op", "ctx"))
        print(f"wrote {p}")
    if a.png and any(r.get("ms") is not None for r in rows):
        fig = draw_profile(rows, spec.name)
        fig.savefig(a.png, dpi=DPI)
        print(f"wrote {a.png}")
        print(caption(rows, spec.name))
    errors = [r for r in rows if r.get("error")]
    refused = [r for r in rows if r.get("refused")]
    if errors:
        print(f"FAILED: no profile for {', '.join(r['rung'] for r in errors)} "
              f"({errors[0]['error'][:200]})", file=sys.stderr)
        return 3
    if refused:
        print(f"FAILED: refused by the oracle check: "
              f"{', '.join(r['rung'] for r in refused)}", file=sys.stderr)
        return 1
    return 0
