"""The command line: ``python -m onelaunch <command>``.

One subparser and one ``cmd_<name>(args) -> int`` per command. A user's mistake (an
unknown model, a prompt that does not fit, no GPU for ``--device cuda``, a bad checkpoint)
is one line on stderr that starts with ``error:`` and says what to do, and exit status 2;
a check that runs but disagrees exits 1.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys

import torch

from .measure.hf_check import compare_with_hf, format_report
from .prompt import UsageError
from .specs import SPECS, UnknownModel, get_spec
from .tp import RUNGS as RUNG_NAMES
from .measure.timing import run_ctx
from .weights import CheckpointError


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors are one ``error:`` line like every other usage error."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        # "-1,2" is a value (a list of ids, one negative), not an option: no option of
        # ours starts with a digit
        self._negative_number_matcher = re.compile(r"^-\d")

    def error(self, message):
        raise UsageError(f"{message} (see `python -m onelaunch {self._cmd()}--help`)")

    def _cmd(self):
        name = self.prog.split()[-1]
        return "" if name == "onelaunch" else f"{name} "


def _device(name: str) -> str:
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda needs a CUDA GPU and torch sees none; "
                         "use --device cpu (or run on the GPU machine)")
    return name


# ---- argument types: what argparse can refuse, it refuses, before any work ---------------
def _int_at_least(lo: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}; give a whole "
                                             f"number, at least {lo}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo} (got {v})")
        return v
    return parse


SEED_MAX = 2 ** 63 - 1          # what torch.Generator.manual_seed takes, with room to offset


def _seed(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}; give a whole number "
                                         "from 0 to 2**63 - 1, e.g. --seed 0") from None
    if not 0 <= v <= SEED_MAX:
        shown = str(v) if len(str(v)) <= 24 else f"a number of {len(str(v))} digits"
        raise argparse.ArgumentTypeError(f"must be from 0 to 2**63 - 1 (got {shown})")
    return v


def _positive_float(example: str):
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid float value: {text!r}; give a positive "
                                             f"number, e.g. {example}") from None
        if not (math.isfinite(v) and v > 0):
            raise argparse.ArgumentTypeError(f"must be a positive, finite number (got {text}); "
                                             f"e.g. {example}")
        return v
    return parse


def _prompt_ids(text: str) -> list[int]:
    """``1,2,3`` -> [1, 2, 3]. An empty item (``1,,2``, a trailing comma) is refused, not
    dropped; the range (against the model's vocabulary) is checked once the model is known."""
    items = text.split(",")
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give at least one id, e.g. --prompt-ids 1,2,3")
    if any(not t.strip() for t in items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item (two commas in a row, or "
                                         "one at an end); write e.g. --prompt-ids 1,2,3")
    try:
        return [int(t) for t in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of "
                                         "integers; write e.g. --prompt-ids 1,2,3") from None


def _prompt_text(text: str) -> None:
    """--prompt as the user meant it: not empty, and UTF-8 (bytes that are not arrive from
    the shell as lone surrogates, which no tokenizer encodes)."""
    if text == "":
        raise UsageError("--prompt is empty: give the text to send (or the prompt as ids, "
                         "--prompt-ids 1,2,3)")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = e.object[e.start:e.end].encode("utf-8", "surrogateescape")
        raise UsageError(f"--prompt holds bytes that are not UTF-8 ({bad!r} at character "
                         f"{e.start}): pass the text in UTF-8 (a UTF-8 locale, or convert "
                         "it with iconv -t UTF-8), or the prompt as ids with --prompt-ids"
                         ) from None


def _tp_fits(spec, world: int, rungs, device: str) -> None:
    """--tp N, refused before any rank starts: a model whose heads or MLP N does not
    divide, too few GPUs, no peer access for a rung that needs it."""
    from . import tp
    try:
        tp.shard_spec(spec, world)
        tp.check_hardware(world, rungs, device)
    except tp.TPError as ex:
        raise UsageError(str(ex)) from None


# ---- check ----------------------------------------------------------------------------
def cmd_check(args) -> int:
    device = _device(args.device)
    if args.model is None and args.checkpoint is None:
        raise UsageError("check needs --model NAME or --checkpoint PATH "
                         f"(known models: {', '.join(SPECS)})")
    from .prompt import make_prompt, validate_prompt
    from .weights import inspect_checkpoint, load_checkpoint
    spec = get_spec(args.model) if args.model else None
    if args.checkpoint is not None:            # its config, before any weight is read
        spec, _ = inspect_checkpoint(args.checkpoint, spec)
    validate_prompt(spec, make_prompt(spec, args.prompt_len, args.seed, args.prompt_ids),
                    args.tokens, spec.max_ctx)
    weights = None
    if args.checkpoint:
        spec, weights = load_checkpoint(args.checkpoint, spec, dtype=torch.float32)
    r = compare_with_hf(spec, device=device, tokens=args.tokens, prompt_len=args.prompt_len,
                        seed=args.seed, prompt_ids=args.prompt_ids, weights=weights)
    print(format_report(r))
    return 0 if r["ok"] else 1


def _add_check(sub):
    p = sub.add_parser("check", help="run the oracle against Hugging Face transformers",
                       description="Greedy-decode with the oracle and with HF on one prompt; "
                       "print the token agreement, the logit error and the smallest "
                       "top-1/top-2 margin. Exit 1 on disagreement.")
    p.add_argument("--model", help=f"one of: {', '.join(SPECS)}")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: fp32 oracle; cuda: bf16 oracle against an fp32 reference")
    p.add_argument("--tokens", type=_int_at_least(1), default=12, help="greedy tokens to generate")
    p.add_argument("--prompt-len", type=_int_at_least(1), default=7,
                   help="random prompt ids to draw")
    p.add_argument("--prompt-ids", type=_prompt_ids,
                   help="the prompt as comma-separated ids (replaces --prompt-len)")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the weights and the prompt")
    p.add_argument("--checkpoint", help="a local checkpoint folder (or hub id) to load "
                   "instead of random weights")
    p.set_defaults(func=cmd_check)


# ---- info -----------------------------------------------------------------------------
def _bandwidth(args) -> tuple[float, str]:
    if args.bandwidth is not None:
        if args.bandwidth <= 0:
            raise UsageError(f"--bandwidth must be positive TB/s (got {args.bandwidth})")
        return args.bandwidth, "given"
    if not torch.cuda.is_available():
        raise UsageError("no GPU here to measure the bandwidth on; pass --bandwidth TBPS "
                         "(e.g. --bandwidth 4.0 for an H200's streaming read)")
    from .measure.timing import read_bandwidth
    return read_bandwidth("cuda"), f"measured now on {torch.cuda.get_device_name()}"


def cmd_info(args) -> int:
    spec = get_spec(args.model)
    if not 0 <= args.ctx <= spec.max_ctx:
        raise UsageError(f"--ctx must be in [0, {spec.max_ctx}] for {spec.name} (got {args.ctx})")
    kv = spec.kv_bytes_per_token_of_context()
    total = spec.bytes_per_token(args.ctx)
    print(f"{spec.name}  ({spec.family}{', ' + spec.hf_id if spec.hf_id else ''})")
    rows = [("parameters", f"{spec.params:,}"),
            ("active per token", f"{spec.active_params:,}"),
            ("weight bytes per token", f"{spec.weight_bytes_per_token / 1e9:.3f} GB (bf16)"),
            ("KV bytes per token of ctx", f"{kv / 1024:g} KiB"),
            (f"bytes per token at ctx {args.ctx}", f"{total / 1e9:.3f} GB")]
    for label, value in rows:
        print(f"  {label:<30}{value}")
    sys.stdout.flush()
    tbps, how = _bandwidth(args)
    print(f"  {'floor':<30}{spec.floor_ms(tbps, args.ctx):.3f} ms/token at {tbps:.2f} TB/s ({how})")
    return 0


def _add_info(sub):
    p = sub.add_parser("info", help="parameters, bytes per token and the bandwidth floor",
                       description="Print the spec's parameter counts, the bytes one decode "
                       "step reads, and the floor bytes / bandwidth in ms/token.")
    p.add_argument("--model", required=True, help=f"one of: {', '.join(SPECS)}")
    p.add_argument("--bandwidth", type=_positive_float("--bandwidth 4.0"), metavar="TBPS",
                   help="bandwidth in TB/s (default: measure the streaming read of this GPU)")
    p.add_argument("--ctx", type=int, default=0, help="tokens of context whose KV cache "
                   "the step also reads")
    p.set_defaults(func=cmd_info)


# ---- generate --------------------------------------------------------------------------
def _kernels_on(device: str) -> None:
    """On the CPU, the Triton kernels run in Triton's interpreter; that must be chosen
    before any kernel module is imported."""
    import os
    if device == "cpu":
        if "onelaunch.kernels" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise UsageError("the kernels were imported without TRITON_INTERPRET=1; "
                             "set it before running on the CPU")
        os.environ["TRITON_INTERPRET"] = "1"


class _Stop(Exception):
    """Raised from the token callback when the reply has ended (a stop id was read)."""


def _generate(e, prompt, tokens, graph, batched, on_tokens, read_every, weights):
    """``Engine.generate`` with the prompt prefilled in batched chunks (``batched``) or one
    step per token, handing ``on_tokens`` the first new token alone, as soon as it exists
    (so the caller can time it), then every ``read_every`` tokens."""
    return e.generate(prompt, tokens, graph=graph, on_tokens=on_tokens, read_every=read_every,
                      batched_prefill=batched)


def cmd_generate(args) -> int:
    import time
    device = _device(args.device)
    _kernels_on(device)
    from .prompt import make_prompt, validate_prompt
    from .engine import Engine, EngineError
    from .text import TextStream, encode, load_tokenizer, progress, stop_ids
    from .weights import inspect_checkpoint, load_checkpoint, random_weights
    text = args.prompt is not None
    if text and args.prompt_ids is not None:
        raise UsageError("give the prompt as text (--prompt) or as ids (--prompt-ids), not both")
    if args.chat and not text:
        raise UsageError("--chat wraps --prompt TEXT in the chat template: add --prompt")
    if args.model is None and args.checkpoint is None:
        raise UsageError(f"generate needs --model NAME or --checkpoint PATH (known models: "
                         f"{', '.join(SPECS)})")
    if text and args.checkpoint is None:
        raise UsageError("--prompt TEXT needs the checkpoint's tokenizer: add --checkpoint PATH "
                         "(random weights take --prompt-ids or --prompt-len)")
    if text:
        _prompt_text(args.prompt)
    tokens = args.tokens if args.tokens is not None else (128 if text else 12)
    if tokens < 1:
        raise UsageError("--tokens must be at least 1")
    # everything up to the weights is cheap: a mistake is refused before they load
    spec = get_spec(args.model) if args.model else None
    folder = None
    if args.checkpoint is not None:            # the config (a hub id: fetched), no weights
        spec, folder = inspect_checkpoint(args.checkpoint, spec)
    if args.max_ctx is not None and args.max_ctx > spec.max_ctx:
        raise UsageError(f"--max-ctx {args.max_ctx} is more than {spec.name}'s context "
                         f"({spec.max_ctx}): use --max-ctx {spec.max_ctx} or less, or leave it out")
    if args.tp > 1:
        _tp_fits(spec, args.tp, ("gloo",) if device == "cpu" else (args.tp_rung,), device)
    tok = None
    if text:
        tok = load_tokenizer(str(folder))
        prompt = torch.tensor(encode(tok, args.prompt, chat=args.chat), dtype=torch.long)
    else:
        prompt = make_prompt(spec, args.prompt_len, args.seed, args.prompt_ids)
    n = prompt.numel()
    if args.max_ctx is not None and n + tokens > args.max_ctx:
        raise UsageError(f"--max-ctx {args.max_ctx} is less than the prompt ({n}) + new tokens "
                         f"({tokens}) = {n + tokens}: use --max-ctx {n + tokens} or more "
                         "(or leave it out)")
    validate_prompt(spec, prompt, tokens, args.max_ctx or spec.max_ctx)
    max_ctx = args.max_ctx or min(spec.max_ctx, run_ctx(n, tokens, 0))
    if args.tp > 1:                            # every rank loads its own weights
        return _generate_tp(args, spec, prompt, tokens, max_ctx, tok, device)
    if args.checkpoint:
        spec, w = load_checkpoint(args.checkpoint, spec, device=device)
    else:
        w = random_weights(spec, args.seed, device=device)
    batched = args.prefill == "batched"
    stream = None
    if text:
        stream = TextStream(tok, () if args.ignore_eos else stop_ids(tok, str(folder)))
    got, stamps = [], []                       # ids as read; (time, how many) at each read
    bar = progress(total=tokens, desc="generate", unit="tok") if not text else None

    def on_tokens(batch):
        stamps.append((time.perf_counter(), len(batch)))
        got.extend(batch)
        if stream is not None:
            sys.stdout.write(stream.push(batch))
            sys.stdout.flush()
            if stream.stopped:
                raise _Stop
        else:
            bar.update(len(batch))

    try:
        e = Engine(spec, w, max_ctx=max_ctx, attention=args.attention, pdl=args.pdl)
        graph = device == "cuda" and not args.eager
        # what runs, read from the engine's plan (a setting that fell back shows)
        mode = ("CUDA graph" if graph else "eager launches") + ", " + e.describe()
        source = (f"checkpoint {args.checkpoint}" if args.checkpoint
                  else f"random weights, seed {args.seed}")
        print(f"{spec.name} on {device} ({mode}; {source}): prompt {n} ids"
              f"{' (chat template)' if args.chat else ''}, {tokens} tokens at most, "
              f"{e.prefill_mode(n, batched)} prefill")
        if device == "cuda":                   # compile, capture and warm up on a short prompt
            _generate(e, prompt[:16], 1, graph, batched, lambda b: None, 64, w)
            torch.cuda.synchronize()
        if stream is not None:
            print("-" * 8, flush=True)
        t0 = time.perf_counter()
        try:
            _generate(e, prompt, tokens, graph, batched, on_tokens, 8 if text else 64, w)
        except _Stop:
            pass
    except EngineError as ex:
        raise UsageError(str(ex)) from None
    finally:
        if bar is not None:
            bar.close()
    if stream is not None:
        print(stream.flush())
        print("-" * 8)
    else:
        print("ids:", " ".join(map(str, got)))
    ttft = stamps[0][0] - t0
    note = "" if device == "cuda" else "  (Triton interpreter on the CPU: not a speed)"
    line = f"time to first token {ttft:.3f} s ({n}-token prompt, {args.prefill} prefill)"
    rest = len(got) - stamps[0][1]
    if rest > 0:
        line += (f"; decode {(stamps[-1][0] - stamps[0][0]) / rest * 1e3:.3f} ms/token over "
                 f"{rest} token{'s' if rest > 1 else ''}")
    if stream is not None and stream.stopped:
        line += "; the reply ended (a stop token)"
    print(line + note)
    if args.check:
        from .measure import agree
        from .measure.mechanisms import check_mechanisms, judge_generated
        j = judge_generated(spec, w, prompt, torch.tensor(got), max_ctx)
        print(f"oracle: {agree.describe(j)}" + ("" if j["ok"] else "; REFUSED"))
        covered, report = check_mechanisms(e, args.seed)   # what it exercised; CPU: the rest
        print(report)
        return 0 if j["ok"] and covered else 1
    return 0


def _generate_tp(args, spec, prompt, tokens, max_ctx, tok, device) -> int:
    """generate --tp N: one process per GPU, each a rank; rank 0 reports (no streaming)."""
    from . import tp
    if device == "cpu":                      # no peer memory on a CPU: gloo's all-reduce
        args.tp_rung = "gloo"
    try:
        out = tp.launch(tp.generate_job, world=args.tp, device=device, uses=(args.tp_rung,),
                        timeout_s=args.timeout, model=spec.name, checkpoint=args.checkpoint,
                        prompt=prompt, tokens=tokens, seed=args.seed, rung=args.tp_rung,
                        max_ctx=max_ctx, check=args.check)[0]
    except tp.TPError as ex:
        raise UsageError(str(ex)) from None
    ids = out["ids"]
    print(f"{spec.name} on {args.tp} GPUs ({args.tp_rung} all-reduce, CUDA graph): prompt "
          f"{prompt.numel()} ids, {tokens} tokens")
    print(tok.decode(ids) if tok is not None else "ids: " + " ".join(map(str, ids)))
    print(f"time to first token {out['ttft_s']:.3f} s (prompt step by step); decode "
          f"{out['ms_per_token']:.3f} ms/token" if out["ms_per_token"] else "")
    if args.check:
        print(f"oracle: {out['verdict']}" + ("" if out["ok"] else "; REFUSED"))
        return 0 if out["ok"] else 1
    return 0


def _add_tp(p, many: bool):
    p.add_argument("--tp", type=_int_at_least(1), default=1,
                   help="tensor-parallel over this many GPUs (one process each; default 1)")
    if many:
        p.add_argument("--tp-rungs", default=",".join(RUNG_NAMES),
                       help=f"all-reduce rungs to measure (default {','.join(RUNG_NAMES)})")
    else:
        p.add_argument("--tp-rung", default="fused", choices=RUNG_NAMES,
                       help="how partial sums meet: nccl (works without peer access), symm, "
                       "p2p or fused (default; needs peer access)")
    p.add_argument("--timeout", type=_positive_float("--timeout 900"), default=900,
                   help="seconds before a --tp run is stopped (default 900)")


def _add_engine_device(p):
    """--device for the commands that run the Triton engine: the GPU when there is one,
    else the CPU, where the kernels run in Triton's interpreter."""
    p.add_argument("--device", choices=("cpu", "cuda"),
                   default="cuda" if torch.cuda.is_available() else "cpu",
                   help="default: cuda if a GPU is visible, else cpu (Triton interpreter)")


def _add_generate(sub):
    p = sub.add_parser("generate", help="greedy decoding through the Triton engine (dense models)",
                       description="Prefill and decode with the engine: one CUDA graph per "
                       "token on a GPU, eager launches in the Triton interpreter on a CPU. "
                       "With --checkpoint and --prompt, text in and streamed text out.")
    p.add_argument("--model", help=f"one of: {', '.join(SPECS)} (default with --checkpoint: "
                   "inferred from its shapes)")
    p.add_argument("--checkpoint", help="a local checkpoint folder (or hub id): its weights, "
                   "and its tokenizer for --prompt")
    p.add_argument("--prompt", default=None, help="the prompt as text (needs --checkpoint)")
    p.add_argument("--chat", action="store_true",
                   help="wrap --prompt in the tokenizer's chat template (instruct models)")
    p.add_argument("--prompt-len", type=_int_at_least(1), default=16,
                   help="random prompt length (default 16)")
    p.add_argument("--prompt-ids", type=_prompt_ids, default=None,
                   help="comma-separated token ids instead of a random prompt")
    p.add_argument("--tokens", type=_int_at_least(1), default=None,
                   help="tokens to generate at most (default 128 with --prompt, else 12)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="with --prompt: go on past the end-of-text token")
    p.add_argument("--seed", type=_seed, default=0, help="weights and prompt seed (default 0)")
    _add_engine_device(p)
    p.add_argument("--prefill", choices=("batched", "steps"), default="batched",
                   help="batched: the prompt in chunks of 1024 tokens (default); steps: one "
                   "decode step per prompt token")
    p.add_argument("--attention", choices=("splitk", "plain"), default="splitk")
    p.add_argument("--pdl", action=argparse.BooleanOptionalAction, default=True,
                   help="programmatic dependent launch where the GPU has it (Hopper+; default "
                   "on; --no-pdl turns it off)")
    p.add_argument("--eager", action="store_true", help="launch kernels one by one, no CUDA graph")
    p.add_argument("--max-ctx", type=_int_at_least(1), default=None,
                   help="the engine's context (default: fits)")
    p.add_argument("--check", action="store_true", help="also decode with the oracle and compare")
    _add_tp(p, many=False)
    p.set_defaults(func=cmd_generate)


# ---- bench -------------------------------------------------------------------------------
def _fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def print_ladder(rows: list[dict], out=sys.stdout) -> None:
    """One line per rung: ms/token and the ratio to the floor of the same run, or why
    there is no time. A rung whose oracle check failed never shows one."""
    from .report.results import row_passes
    print(f"{'model':14} {'rung':16} {'ctx':>6} {'ms/token':>9} {'x floor':>8} {'agree':>7}  check",
          file=out)
    for r in rows:
        ok = row_passes(r)
        ms = r.get("ms_per_token") if ok else None
        x = (ms / r["floor_ms"]) if ok and r.get("floor_ms") else None
        agree = r.get("agree") or "ref"
        if ok:
            check = "pass" if r.get("agree") is None or r.get("agree").split("/")[0] == \
                r.get("agree").split("/")[1] else "near ties only"
        else:
            check = "REFUSED: " + (r.get("refused") or "oracle check failed")
        print(f"{r['model']:14} {r['rung']:16} {r['ctx']:>6} {_fmt(ms):>9} {_fmt(x, '.2f'):>8} "
              f"{agree:>7}  {check}", file=out)


def cmd_bench(args) -> int:
    import json
    device = _device(args.device)
    spec = get_spec(args.model)
    _kernels_on(device)
    from .measure import agree
    from .measure.ladder import bench_rows
    from .measure.timing import run_bandwidth
    from .weights import random_weights
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
                      seed=args.seed, read_tbps=bw, peers=args.peers)
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
    from . import tp
    from .report import results
    rungs = tuple(r.strip() for r in args.tp_rungs.split(",") if r.strip())
    if device == "cpu":
        rungs = tp.CPU_RUNGS
    bad = [r for r in rungs if r not in tp.RUNGS + tp.CPU_RUNGS]
    if bad:
        raise UsageError(f"unknown --tp-rungs {','.join(bad)}: use {','.join(tp.RUNGS)}")
    _tp_fits(spec, args.tp, rungs, device)
    try:
        rows = tp.launch(tp.bench_job, world=args.tp, device=device, uses=rungs,
                         timeout_s=args.timeout, model=spec.name, ctx=args.ctx,
                         tokens=args.tokens, iters=args.iters, rungs=rungs, seed=args.seed)[0]
    except tp.TPError as ex:
        print(f"error: {ex}", file=sys.stderr)
        return 1
    print(tp.format_rows(rows))
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
                   help="skip the peer rungs (HF generate, the eager and compiled oracle)")
    p.add_argument("--json", default=None, help="also write the rows to this file")
    _add_tp(p, many=True)
    p.set_defaults(func=cmd_bench)


# ---- main -----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="onelaunch", description="A batch-1 decode engine in Triton, "
                     "measured against the memory-bandwidth floor.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_check(sub)
    _add_info(sub)
    _add_generate(sub)
    _add_bench(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        return args.func(args)
    except (UsageError, UnknownModel, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
