"""The measurement commands: ``python -m onelaunch.bench`` (kernels, ladder, peers,
sweeps, tuning; :func:`bench_main`) and ``python -m onelaunch.profile`` (where each rung's
step time goes; :func:`profile_main`). Each reads its arguments, turns the model's name
into a spec, measures the bandwidth once, and hands both down.

Nothing reports a time for a result the oracle has not confirmed: a kernel, rung, peer,
context or launch configuration that fails its check gets ``None`` and the reason, and the
command exits 1 after printing every row.

    python -m onelaunch.bench --model qwen2.5-1.5b --ctx 512 --what kernels,ladder,sweep
    python -m onelaunch.profile --model qwen2.5-1.5b --ctx 512 --json out.json --png out.png
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from ..specs import get_spec
from ..weights import random_weights
from ..measure import agree
from ..measure.kernel_rows import kernel_rows, plan_op_rows
from ..peers.bench import bench_rows
from ..measure.profile import PROFILE_RUNGS, profile_rows
from ..measure.rungs import LADDER
from ..measure.sweeps import long_context_agreement, maxctx_rows, sweep_rows
from ..measure.timing import floor_ms, run_bandwidth
from ..measure.tune import config_sweep, plan_config_sweep, write_plan_table, write_table


def bench_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m onelaunch.bench")
    ap.add_argument("--model", default="qwen2.5-1.5b")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--what", default="kernels,ladder")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--json", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peers", default=None,
                    help="with --what peers: comma list of peers (default: every one in "
                         "peers.rungs.PEERS and, for a dense model, 'gpt-fast compiled'), "
                         "e.g. llama.cpp")
    ap.add_argument("--write-table", action="store_true",
                    help="with sweepcfg: write the fastest config of each op to kernels/tuned/<arch>.json")
    a = ap.parse_args(argv)
    dev = "cuda"
    spec = get_spec(a.model)
    w = random_weights(spec, a.seed, device=dev)
    bw = run_bandwidth(dev)
    print(f"read bandwidth {bw:.3f} TB/s; floor {floor_ms(spec, bw, a.ctx):.3f} ms/token "
          f"at ctx {a.ctx}")
    out = {"read_tbps": bw}
    what = a.what.split(",")
    failed = []
    if "sweepplan" in what:
        out["plan_sweep"] = plan_config_sweep(spec, w, dev, ctx=a.ctx, read_tbps=bw,
                                             seed=a.seed)
        if a.write_table:
            print("wrote", write_plan_table(out["plan_sweep"], spec.name))
    if "sweepcfg" in what:
        out["config_sweep"] = config_sweep(spec, w, dev, read_tbps=bw)
        failed += agree.failures(out["config_sweep"])
        if a.write_table:
            print("wrote", write_table(out["config_sweep"], bw, spec.name))
    longest = spec.max_ctx - 96                      # room for the timed steps
    ctxs = tuple(c for c in (128, 512, 1024, 2048, 4000, 8192, 16384, 32768) if c <= longest)
    if "peers" in what or "ladder" in what:
        # one run: the peers and the rungs on one prompt (--seed), one oracle run, one
        # bandwidth
        rows = bench_rows(spec, w, dev, ctx=a.ctx, iters=a.iters, seed=a.seed, read_tbps=bw,
                          peers="peers" in what and (tuple(a.peers.split(","))
                                                     if a.peers else True),
                          peer_tokens=32, peer_iters=50,
                          rungs=LADDER if "ladder" in what else ())
        if "peers" in what:
            out["peers"] = [r for r in rows if r.get("kind") != "ours"]
            for r in out["peers"]:
                print(json.dumps(r))
            failed += agree.failures(out["peers"])
        ladder = [r for r in rows if r.get("kind") == "ours"]
    for key, fn in (("kernels", lambda: [] if spec.is_moe else kernel_rows(spec, w, dev, ctx=a.ctx, read_tbps=bw)),
                    ("ops", lambda: plan_op_rows(spec, w, dev, ctx=a.ctx, read_tbps=bw, seed=a.seed)),
                    ("ladder", lambda: ladder),
                    ("sweep", lambda: sweep_rows(spec, w, dev, ctxs=ctxs, read_tbps=bw, seed=a.seed)),
                    # the same step in an engine for 1024 positions and the default
                    ("maxctx", lambda: maxctx_rows(spec, w, dev, ctx=a.ctx, max_ctxs=(1024, None),
                                                   iters=a.iters, read_tbps=bw, seed=a.seed)),
                    # the long contexts with the live splits capped at 256..32 programs, or not
                    ("splitcap", lambda: sweep_rows(
                        spec, w, dev, ctxs=tuple(c for c in ctxs if c >= 2048), read_tbps=bw,
                        live_caps=(None,) + tuple(-(-p // spec.kv_heads) for p in (256, 128, 64, 32)),
                        seed=a.seed))):
        if key in what:
            out[key] = fn()
            for r in out[key]:
                print(json.dumps(r))
            failed += agree.failures(out[key])
    if "long" in what:
        out["long"] = long_context_agreement(spec, w, dev, seed=a.seed,
                                             ctx=min(32768, 4000 if spec.is_moe else longest))
        print(json.dumps(out["long"]))
        if not out["long"]["ok"]:
            failed.append(out["long"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    if failed:
        print(f"FAILED: {len(failed)} row(s) failed their check (printed above, never timed)",
              file=sys.stderr)
        return 1
    return 0


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
    ap.add_argument("--json", default=None, help="write {meta, read_tbps, rows} here")
    ap.add_argument("--png", default=None, help="draw the figure here")
    ap.add_argument("--trace-dir", default=None, help="keep each rung's Chrome trace here")
    ap.add_argument("--cupti-warmup", action="store_true",
                    help="an empty profiler session before any graph capture (PyTorch's "
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
