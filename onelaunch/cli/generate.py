"""``onelaunch generate``: greedy decoding through the Triton engine, on one GPU or as
``--tp N`` ranks (``generate_job``, run on every rank by ``tp.launch``)."""
from __future__ import annotations

import argparse
import sys
import time

import torch

from ..prompt import UsageError
from ..specs import SPECS, get_spec
from .args import (_add_engine_device, _add_tp, _device, _int_at_least, _kernels_on,
                   _model_name, _prompt_ids, _prompt_len, _prompt_text, _seed, _tp_fits)


class _Stop(Exception):
    """Raised from the token callback when the reply has ended (a stop id was read)."""


def _generate(e, prompt, tokens, graph, batched, on_tokens, read_every):
    """``Engine.generate`` with the prompt prefilled in batched chunks (``batched``) or one
    step per token, handing ``on_tokens`` the first new token alone, as soon as it exists
    (so the caller can time it), then every ``read_every`` tokens."""
    return e.generate(prompt, tokens, graph=graph, on_tokens=on_tokens, read_every=read_every,
                      batched_prefill=batched)


MEGAKERNEL_NOTE = ("note: --megakernel needs an sm_90 GPU (Hopper); running the chain of "
                   "kernels")


def _megakernel(args, spec, device, max_ctx: int) -> bool:
    """--megakernel: True where the one-launch step runs (Hopper); elsewhere one line says
    the chain of kernels runs instead. What it cannot run is refused before weights load."""
    if not args.megakernel:
        return False
    if args.tp > 1 or args.attention != "splitk":
        raise UsageError("--megakernel runs the whole step in one launch on one GPU: leave "
                         "out --tp and --attention plain")
    from ..megakernel.step import device_refusal, refusal
    if device_refusal(device):
        print(MEGAKERNEL_NOTE, file=sys.stderr)
        return False
    why = refusal(spec, max_ctx)
    if why:
        raise UsageError(f"--megakernel: {why}; leave out --megakernel for the chain of kernels")
    return True


def cmd_generate(args) -> int:
    device = _device(args.device)
    _kernels_on(device)
    from ..engine import Engine, EngineError
    from ..measure.timing import run_ctx
    from ..prompt import make_prompt, validate_prompt
    from ..text import TextStream, encode, load_tokenizer, progress, stop_ids
    from ..checkpoint import inspect_checkpoint, load_checkpoint, positions_fit
    from ..weights import random_weights
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
        if prompt.numel() and int(prompt.max()) >= spec.vocab:
            raise UsageError(f"the checkpoint's tokenizer gives id {int(prompt.max())}, but "
                             f"{spec.name}'s vocabulary has {spec.vocab} ids: the tokenizer "
                             "files are another model's; use the tokenizer of this checkpoint")
    else:
        prompt = make_prompt(spec, _prompt_len(args, 16), args.seed, args.prompt_ids)
    n = prompt.numel()
    if args.max_ctx is not None and n + tokens > args.max_ctx:
        raise UsageError(f"--max-ctx {args.max_ctx} is less than the prompt ({n}) + new tokens "
                         f"({tokens}) = {n + tokens}: use --max-ctx {n + tokens} or more "
                         "(or leave it out)")
    validate_prompt(spec, prompt, tokens, args.max_ctx or spec.max_ctx)
    if folder is not None:
        positions_fit(folder, n + tokens)
    max_ctx = args.max_ctx or min(spec.max_ctx, run_ctx(n, tokens, 0))
    mega = _megakernel(args, spec, device, max_ctx)   # the one launch, or the chain
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
        e = Engine(spec, w, max_ctx=max_ctx, attention=args.attention, pdl=args.pdl,
                   megakernel=mega)
        graph = device == "cuda" and not args.eager
        # what runs, read from the engine's plan (a setting that fell back shows)
        mode = ("CUDA graph" if graph else "eager launches") + ", " + e.describe()
        source = (f"checkpoint {args.checkpoint}" if args.checkpoint
                  else f"random weights, seed {args.seed}")
        print(f"{spec.name} on {device} ({mode}; {source}): prompt {n} ids"
              f"{' (chat template)' if args.chat else ''}, {tokens} tokens at most, "
              f"{e.prefill_mode(n, batched)} prefill")
        if device == "cuda":                   # compile, capture and warm up on a short prompt
            _generate(e, prompt[:16], 1, graph, batched, lambda b: None, 64)
            torch.cuda.synchronize()
        if stream is not None:
            print("-" * 8, flush=True)
        t0 = time.perf_counter()
        try:
            _generate(e, prompt, tokens, graph, batched, on_tokens, 8 if text else 64)
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
    ran = e.last_run["prefill"]                 # what ran, not what was asked for
    line = f"time to first token {ttft:.3f} s ({n}-token prompt, {ran} prefill)"
    rest = len(got) - stamps[0][1]
    if rest > 0:
        line += (f"; decode {(stamps[-1][0] - stamps[0][0]) / rest * 1e3:.3f} ms/token over "
                 f"{rest} token{'s' if rest > 1 else ''}")
    if stream is not None and stream.stopped:
        line += "; the reply ended (a stop token)"
    print(line + note)
    if args.check:
        from ..measure import agree
        from ..measure.mechanisms import check_mechanisms, judge_generated
        j = judge_generated(spec, w, prompt, torch.tensor(got), max_ctx)
        print(f"oracle: {agree.describe(j)}" + ("" if j["ok"] else "; REFUSED"))
        covered, report = check_mechanisms(e, args.seed)   # what it exercised; CPU: the rest
        print(report)
        return 0 if j["ok"] and covered else 1
    return 0


def _generate_tp(args, spec, prompt, tokens, max_ctx, tok, device) -> int:
    """generate --tp N: one process per GPU, each a rank; rank 0 reports (no streaming)."""
    from .. import tp
    if device == "cpu":                      # no peer memory on a CPU: gloo's all-reduce
        args.tp_rung = "gloo"
    try:
        out = tp.launch(generate_job, world=args.tp, device=device, uses=(args.tp_rung,),
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


def generate_job(rank, world, device, model, prompt, tokens, rung="fused", seed=0,
                 checkpoint=None, max_ctx=None, check=False):
    """``generate --tp``: every rank decodes (the prompt step by step); rank 0 reports the
    ids, time to first token and ms/token, and with ``check`` the oracle's verdict."""
    from ..measure import agree
    from ..measure.mechanisms import judge_generated
    from ..measure.timing import run_ctx
    from ..tp.group import rank_engine
    from ..tp.shard import rank_weights, shard_weights
    from ..checkpoint import load_checkpoint
    from ..weights import random_weights
    spec = get_spec(model)
    cuda = torch.device(device).type == "cuda"
    if checkpoint:
        spec, full = load_checkpoint(checkpoint, spec, device=device)
        w = shard_weights(spec, full, rank, world)
        if not (check and rank == 0):
            del full
    else:
        w = rank_weights(spec, seed, rank, world, device)
    max_ctx = max_ctx or min(spec.max_ctx, run_ctx(prompt.numel(), tokens, 0))
    e = rank_engine(spec, w, rank, world, rung, device, max_ctx)
    if cuda:                                   # compile, capture and warm up
        e.generate(prompt[:16], 1, graph=True)
        torch.cuda.synchronize()
    stamps = []
    t0 = time.perf_counter()
    ids = e.generate(prompt, tokens, graph=cuda, read_every=64,
                     on_tokens=lambda b: stamps.append((time.perf_counter(), len(b))))
    if rank != 0:
        return None
    rest = tokens - stamps[0][1]
    out = {"ids": ids.tolist(), "ttft_s": stamps[0][0] - t0,
           "ms_per_token": (stamps[-1][0] - stamps[0][0]) / rest * 1e3 if rest > 0 else None}
    if check:
        del e
        full = full if checkpoint else random_weights(spec, seed, device=device)
        j = judge_generated(spec, full, prompt, ids, max_ctx)
        out.update(ok=j["ok"], verdict=agree.describe(j))
    return out


def _add_generate(sub):
    p = sub.add_parser("generate", help="greedy decoding through the Triton engine (dense models)",
                       description="Prefill and decode with the engine: one CUDA graph per "
                       "token on a GPU, eager launches in the Triton interpreter on a CPU. "
                       "With --checkpoint and --prompt, text in and streamed text out.")
    p.add_argument("--model", type=_model_name, help=f"one of: {', '.join(SPECS)} (default with --checkpoint: "
                   "inferred from its shapes)")
    p.add_argument("--checkpoint", help="a local checkpoint folder (or hub id): its weights, "
                   "and its tokenizer for --prompt")
    p.add_argument("--prompt", default=None, help="the prompt as text (needs --checkpoint)")
    p.add_argument("--chat", action="store_true",
                   help="wrap --prompt in the tokenizer's chat template (instruct models)")
    p.add_argument("--prompt-len", type=_int_at_least(1), default=None,
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
    p.add_argument("--megakernel", action="store_true",
                   help="the whole step in one launch (a Gluon kernel for Hopper, sm_90); "
                   "elsewhere one line says so and the chain of kernels runs")
    p.add_argument("--max-ctx", type=_int_at_least(1), default=None,
                   help="the engine's context (default: fits)")
    p.add_argument("--check", action="store_true", help="also decode with the oracle and compare")
    _add_tp(p, many=False)
    p.set_defaults(func=cmd_generate)
