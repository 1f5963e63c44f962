"""``onelaunch bench``: what ``--what`` names, each row checked against the oracle before
it is timed, against the floor of the same run (one bandwidth, one prompt, one oracle run);
``--tp N``: every all-reduce rung against one GPU.

    python -m onelaunch bench --model qwen2.5-1.5b --ctx 512                # the table
    python -m onelaunch bench --model olmoe-1b-7b --what ops,sweep,long     # per op, ...

The peers and the ladder are printed as one table; every other measurement as one JSON
line a row. A row that fails its check gets no time, and the command then exits 1 after
printing every row.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from ..measure.timing import run_ctx
from ..prompt import UsageError
from ..specs import get_spec
from .args import (_add_engine_device, _add_tp, _device, _int_at_least, _kernels_on,
                   _output_file, _seed, _tp_fits)

# --what: each measurement, in the order a run makes them
WHAT = {
    "sweepplan": "launch configurations tried in the whole step, op by op, keyed by weight "
                 "shape (--write-table: kernels/tuned/<arch>.json)",
    "sweepcfg": "launch configurations of each GEMV kernel (--write-table: "
                "kernels/tuned/<arch>.json)",
    "peers": "what a user would run instead (HF, the oracle eager and compiled, gpt-fast's "
             "step, llama.cpp where ci/llama_build.sh built it)",
    "ladder": "every rung of our engine, and the one-launch step where it runs (dense, "
              "Hopper)",
    "kernels": "each fused kernel alone against its reference (dense models)",
    "ops": "each op of the plan, timed alone",
    "sweep": "the step over contexts from 128 to the model's longest",
    "maxctx": "the same step in an engine of 1024 positions and of the model's",
    "splitcap": "the long contexts with the live split-K programs capped at 256..32",
    "long": "greedy agreement at the longest context",
}
DEFAULT_WHAT = ("peers", "ladder")


def _what(text: str) -> tuple[str, ...]:
    """``--what ops,sweep`` -> ("ops", "sweep"): every item a known measurement."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item; write e.g. "
                                         "--what ladder,sweep")
    bad = [t for t in items if t not in WHAT]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(map(repr, bad))}: pick from "
                                         f"{','.join(WHAT)}")
    return tuple(dict.fromkeys(items))


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


def _checked(args, spec, device) -> tuple[str, ...]:
    """The measurements ``args`` ask for; every mistake refused before any weight loads."""
    what = args.what or DEFAULT_WHAT
    if args.tp > 1 and args.what is not None:
        raise UsageError("--tp N measures every all-reduce rung against one GPU: leave out "
                         "--what (or --tp)")
    if not args.peers:                                          # --no-peers
        if args.peer_names is not None:
            raise UsageError("give --peers NAMES or --no-peers, not both")
        what = tuple(t for t in what if t != "peers")
        if not what:
            raise UsageError("--no-peers leaves nothing to measure: add --what ladder (or "
                             "leave out --no-peers)")
    if args.peer_names is not None:
        from ..peers.gpt_fast import NAME as FAST
        from ..peers.rungs import RUNGS as PEERS
        if "peers" not in what:
            raise UsageError("--peers picks among the peers: add peers to --what")
        bad = [n for n in args.peer_names if n not in PEERS + (FAST,)]
        if bad:
            raise UsageError(f"unknown --peers {', '.join(map(repr, bad))}: pick from "
                             f"{', '.join(map(repr, PEERS + (FAST,)))}")
    if args.write_table and not {"sweepcfg", "sweepplan"} & set(what):
        raise UsageError("--write-table writes what a configuration sweep finds: add "
                         "--what sweepcfg or --what sweepplan")
    if args.write_table and device == "cpu":
        raise UsageError("--write-table writes a GPU's tuned launch configurations: run it "
                         "on a GPU (--device cuda)")
    if device == "cpu" and spec.name not in ("tiny-qwen2", "tiny-olmoe"):
        raise UsageError("on the CPU the kernels run in Triton's interpreter: use --model "
                         "tiny-qwen2 or tiny-olmoe")
    room = spec.max_ctx - run_ctx(0, args.tokens, args.iters)   # the engine holds ctx + these
    if room < 1:
        raise UsageError(f"--tokens {args.tokens} + --iters {args.iters} leave no context in "
                         f"{spec.name}'s {spec.max_ctx} tokens: use fewer --iters or --tokens")
    if not 1 <= args.ctx <= room:
        raise UsageError(f"--ctx must be between 1 and {room}")
    return what


def cmd_bench(args) -> int:
    device = _device(args.device)
    spec = get_spec(args.model)
    what = _checked(args, spec, device)
    _kernels_on(device)
    if args.tp > 1:
        return _bench_tp(args, spec, device)
    from ..measure import agree
    from ..measure.timing import run_bandwidth
    from ..weights import random_weights
    bw = run_bandwidth(device)                               # one bandwidth for the run
    w = random_weights(spec, args.seed, device=device)      # one set, shared by every rung
    gpu = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    print(f"{spec.name}, batch 1, ctx {args.ctx}, on {gpu}"
          + (f"; read bandwidth {bw:.2f} TB/s, floor {spec.floor_ms(bw, args.ctx):.3f} "
             "ms/token" if bw else "; CPU smoke run (Triton interpreter): times are not "
             "speeds"))
    out, failed = {"read_tbps": bw}, []
    for key in [k for k in WHAT if k in what]:
        if key == "ladder" and "peers" in what:
            continue                                         # one table with the peers
        if key in ("peers", "ladder"):
            got = _table(args, spec, w, device, bw, what)
            out.update(got)
            failed += agree.failures(got.get("peers", []) + got.get("ladder", []))
            continue
        out[key] = got = _measure(key, args, spec, w, device, bw)
        for r in got if isinstance(got, list) else [got]:     # long: one verdict
            print(json.dumps(r))
        if key != "sweepplan":      # a step sweep's failed trial is a row, not a failed run
            failed += agree.failures(got)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}")
    if failed:   # printed above, never timed; the run fails
        print(f"FAILED: {len(failed)} row(s) failed their check: "
              + ", ".join(str(r.get("rung") or r.get("op") or r.get("kernel") or r.get("model"))
                          for r in failed[:8]), file=sys.stderr)
        return 1
    return 0


def _table(args, spec, w, device, bw, what) -> dict:
    """The peers and our ladder, on one prompt and one oracle run: one table."""
    from ..measure.rungs import BENCH, MEGA
    from ..megakernel.step import device_refusal, refusal
    from ..peers.bench import bench_rows
    peers = "peers" in what and (tuple(args.peer_names) if args.peer_names else True)
    rows = bench_rows(spec, w, device, ctx=args.ctx, tokens=args.tokens, iters=args.iters,
                      seed=args.seed, read_tbps=bw, peers=peers,
                      rungs=BENCH if "ladder" in what else ())
    print_ladder(rows, out=sys.stdout)
    if "ladder" in what and (device_refusal(device) or refusal(spec)):
        why = refusal(spec) or "it needs an sm_90 GPU (Hopper)"
        print(f"{MEGA}: no row ({why})")
    if "peers" not in what or "ladder" not in what:
        return {"peers" if "peers" in what else "ladder": rows}
    return {"peers": [r for r in rows if r.get("kind") != "ours"],
            "ladder": [r for r in rows if r.get("kind") == "ours"]}


def _measure(key, args, spec, w, device, bw):
    """The rows of measurement ``key`` (``long``: one dict), each checked before timed."""
    from ..measure.kernel_rows import kernel_rows, plan_op_rows
    from ..measure.sweeps import long_context_agreement, maxctx_rows, sweep_rows
    from ..measure.tune import config_sweep, plan_config_sweep, write_plan_table, write_table
    a = args
    longest = spec.max_ctx - 96                      # room for the timed steps
    ctxs = tuple(c for c in (128, 512, 1024, 2048, 4000, 8192, 16384, 32768) if c <= longest)
    if key == "sweepplan":
        rows = plan_config_sweep(spec, w, device, ctx=a.ctx, read_tbps=bw, seed=a.seed)
        if a.write_table:
            print("wrote", write_plan_table(rows, spec.name))
        return rows
    if key == "sweepcfg":
        rows = config_sweep(spec, w, device, read_tbps=bw)
        if a.write_table:
            print("wrote", write_table(rows, bw, spec.name))
        return rows
    if key == "kernels":
        return [] if spec.is_moe else kernel_rows(spec, w, device, ctx=a.ctx, read_tbps=bw)
    if key == "ops":
        return plan_op_rows(spec, w, device, ctx=a.ctx, read_tbps=bw, seed=a.seed)
    if key == "sweep":
        return sweep_rows(spec, w, device, ctxs=ctxs, read_tbps=bw, seed=a.seed)
    if key == "maxctx":        # the same step in an engine for 1024 positions and the default
        return maxctx_rows(spec, w, device, ctx=a.ctx, max_ctxs=(1024, None), iters=a.iters,
                           read_tbps=bw, seed=a.seed)
    if key == "splitcap":      # the long contexts, the live splits capped at 256..32 programs
        caps = (None,) + tuple(-(-p // spec.kv_heads) for p in (256, 128, 64, 32))
        return sweep_rows(spec, w, device, ctxs=tuple(c for c in ctxs if c >= 2048),
                          read_tbps=bw, live_caps=caps, seed=a.seed)
    assert key == "long", key
    return long_context_agreement(spec, w, device, seed=a.seed,
                                  ctx=min(32768, 4000 if spec.is_moe else longest))


def _bench_tp(args, spec, device) -> int:
    """bench --tp N: the one-GPU step and every all-reduce rung, measured in one run."""
    from .. import tp
    from ..measure import tp as tp_jobs
    from ..report import results
    rungs = tuple(r.strip() for r in args.tp_rungs.split(",") if r.strip())
    bad = [r for r in rungs if r not in tp.RUNGS + tp.CPU_RUNGS]
    if bad:                                   # a typo is refused on every device
        raise UsageError(f"unknown --tp-rungs {','.join(bad)}: use {','.join(tp.RUNGS)}")
    if device == "cpu":                       # no peer memory on a CPU: gloo's all-reduce
        rungs = tp.CPU_RUNGS
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
    p = sub.add_parser(
        "bench", help="every rung of the ladder and the peers, checked against the oracle; "
        "or the measurements --what names",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Measure the read bandwidth, then what --what names (default: the peers "
        "and every rung of the ladder, as one table: ms/token, the ratio to the floor of "
        "this run, greedy agreement with the oracle). A row whose check fails gets no time, "
        "and the command then exits 1.",
        epilog="--what takes a comma list of:\n" + "\n".join(
            f"  {k:10} {v}" for k, v in WHAT.items()))
    p.add_argument("--model", required=True, help="qwen2.5-1.5b or olmoe-1b-7b (GPU); "
                   "tiny-qwen2 or tiny-olmoe (CPU)")
    p.add_argument("--what", type=_what, default=None,
                   help=f"comma list of measurements (default {','.join(DEFAULT_WHAT)}; "
                   "see below)")
    p.add_argument("--ctx", type=int, default=512, help="context of the timed steps (default 512)")
    p.add_argument("--tokens", type=_int_at_least(1), default=12,
                   help="greedy tokens checked (default 12)")
    p.add_argument("--iters", type=_int_at_least(1), default=100,
                   help="timed steps per rung (default 100)")
    p.add_argument("--seed", type=_seed, default=0)
    _add_engine_device(p)
    p.add_argument("--no-peers", dest="peers", action="store_false",
                   help="leave out the peers (HF generate, the eager and compiled oracle, "
                   "llama.cpp where ci/llama_build.sh built it, and for a dense model the "
                   "gpt-fast-style compiled step)")
    p.add_argument("--peers", dest="peer_names", type=lambda t: [n.strip() for n in t.split(",")],
                   default=None, metavar="NAMES",
                   help="the peers to run, a comma list (default: every one), e.g. llama.cpp")
    p.add_argument("--write-table", action="store_true",
                   help="with --what sweepcfg or sweepplan: write the fastest configuration of "
                   "each op to kernels/tuned/<arch>.json")
    p.add_argument("--json", default=None, type=_output_file,
                   help="also write the rows to this file, one key "
                   "a measurement")
    _add_tp(p, many=True)
    p.set_defaults(func=cmd_bench)
