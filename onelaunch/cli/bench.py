"""``onelaunch bench``: every rung of the ladder (and the peers), checked against the
oracle, then timed against the floor of the same run; ``--tp N``: every all-reduce rung
against one GPU."""
from __future__ import annotations

import json
import sys

import torch

from ..measure.timing import run_ctx
from ..prompt import UsageError
from ..specs import get_spec
from .args import (_add_engine_device, _add_tp, _device, _int_at_least, _kernels_on, _seed,
                   _tp_fits)


def _fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def print_ladder(rows: list[dict], out=sys.stdout) -> None:
    """One line per rung: ms/token and the ratio to the floor of the same run, or why
    there is no time. A rung whose oracle check failed never shows one."""
    from ..report.results import row_passes
    print(f"{'model':14} {'rung':16} {'ctx':>6} {'ms/token':>9} {'x floor':>8} {'agree':>7}  check",
          file=out)
    for r in rows:
        ok = row_passes(r)
        ms = r.get("ms_per_token") if ok else None
        x = (ms / r["floor_ms"]) if ok and r.get("floor_ms") else None
        agree = r.get("agree") or ("none" if r.get("unchecked") else "ref")
        if ok and r.get("unchecked"):        # llama.cpp: its own timing, no check possible
            check = "no oracle check possible"
        elif ok:
            check = "pass" if r.get("agree") is None or r.get("agree").split("/")[0] == \
                r.get("agree").split("/")[1] else "near ties only"
        else:
            check = "REFUSED: " + (r.get("refused") or "oracle check failed")
        print(f"{r['model']:14} {r['rung']:16} {r['ctx']:>6} {_fmt(ms):>9} {_fmt(x, '.2f'):>8} "
              f"{agree:>7}  {check}", file=out)


def cmd_bench(args) -> int:
    device = _device(args.device)
    spec = get_spec(args.model)
    _kernels_on(device)
    from ..measure import agree
    from ..peers.bench import bench_rows
    from ..measure.rungs import BENCH
    from ..measure.timing import run_bandwidth
    from ..weights import random_weights
    if device == "cpu" and spec.name not in ("tiny-qwen2", "tiny-olmoe"):
        raise UsageError("on the CPU the kernels run in Triton's interpreter: use --model "
                         "tiny-qwen2 or tiny-olmoe")
    room = spec.max_ctx - run_ctx(0, args.tokens, args.iters)   # the engine holds ctx + these
    if room < 1:
        raise UsageError(f"--tokens {args.tokens} + --iters {args.iters} leave no context in "
                         f"{spec.name}'s {spec.max_ctx} tokens: use fewer --iters or --tokens")
    if not 1 <= args.ctx <= room:
        raise UsageError(f"--ctx must be between 1 and {room}")
    if args.tp > 1:
        return _bench_tp(args, spec, device)
    bw = run_bandwidth(device)                               # one bandwidth for the run
    w = random_weights(spec, args.seed, device=device)      # one set, shared by every rung
    # the peers and the rungs on one prompt (--seed), judged against one oracle run
    rows = bench_rows(spec, w, device, ctx=args.ctx, tokens=args.tokens, iters=args.iters,
                      seed=args.seed, read_tbps=bw, peers=args.peers, rungs=BENCH)
    head = (f"{spec.name}, batch 1, ctx {args.ctx}, on {torch.cuda.get_device_name() if device == 'cuda' else 'CPU'}"
            + (f"; read bandwidth {bw:.2f} TB/s, floor {spec.floor_ms(bw, args.ctx):.3f} ms/token"
               if bw else "; CPU smoke run (Triton interpreter): times are not speeds"))
    print(head)
    print_ladder(rows, out=sys.stdout)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"read_tbps": bw, "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")
    refused = agree.failures(rows)
    if refused:   # the table above shows them; the run fails
        print(f"FAILED: {len(refused)} rung(s) refused by the oracle check: "
              + ", ".join(r["rung"] for r in refused), file=sys.stderr)
        return 1
    return 0


def _bench_tp(args, spec, device) -> int:
    """bench --tp N: the one-GPU step and every all-reduce rung, measured in one run."""
    from .. import tp
    from ..measure import tp as tp_jobs
    from ..report import results
    rungs = tuple(r.strip() for r in args.tp_rungs.split(",") if r.strip())
    if device == "cpu":
        rungs = tp.CPU_RUNGS
    bad = [r for r in rungs if r not in tp.RUNGS + tp.CPU_RUNGS]
    if bad:
        raise UsageError(f"unknown --tp-rungs {','.join(bad)}: use {','.join(tp.RUNGS)}")
    _tp_fits(spec, args.tp, rungs, device)
    try:
        rows = tp.launch(tp_jobs.bench_job, world=args.tp, device=device, uses=rungs,
                         timeout_s=args.timeout, model=spec.name, ctx=args.ctx,
                         tokens=args.tokens, iters=args.iters, rungs=rungs, seed=args.seed)[0]
    except tp.TPError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 1
    print(tp_jobs.format_rows(rows))
    if device == "cuda":
        p = results.write("tp", rows, device, {"model": spec.name, "ctx": args.ctx, "tp": args.tp},
                          merge_keys=("model", "tp", "rung", "ctx"),
                          gpu=f"{results.gpu_slug(device)}x{args.tp}")
        print(f"wrote {p}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    refused = [r for r in rows if r.get("ok") is False]
    if refused:
        print(f"FAILED: refused by the oracle check: {', '.join(r['rung'] for r in refused)}",
              file=sys.stderr)
        return 1
    return 0


def _add_bench(sub):
    p = sub.add_parser("bench", help="every rung of the ladder, checked against the oracle",
                       description="Measure the read bandwidth, then each rung (ms/token, the "
                       "ratio to the floor of this run, greedy agreement with the oracle). A rung "
                       "whose oracle check fails gets no time, and the command then exits 1.")
    p.add_argument("--model", required=True, help="qwen2.5-1.5b or olmoe-1b-7b (GPU); "
                   "tiny-qwen2 or tiny-olmoe (CPU)")
    p.add_argument("--ctx", type=int, default=512, help="context of the timed steps (default 512)")
    p.add_argument("--tokens", type=_int_at_least(1), default=12,
                   help="greedy tokens checked (default 12)")
    p.add_argument("--iters", type=_int_at_least(1), default=100,
                   help="timed steps per rung (default 100)")
    p.add_argument("--seed", type=_seed, default=0)
    _add_engine_device(p)
    p.add_argument("--no-peers", dest="peers", action="store_false",
                   help="skip the peer rungs (HF generate, the eager and compiled oracle, "
                   "llama.cpp where ci/llama_build.sh built it, and for a dense model the "
                   "gpt-fast-style compiled step)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    _add_tp(p, many=True)
    p.set_defaults(func=cmd_bench)
