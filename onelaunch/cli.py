"""The command line: ``python -m onelaunch <command>``.

One subparser and one ``cmd_<name>(args) -> int`` per command. A user's mistake (an
unknown model, a prompt that does not fit, no GPU for ``--device cuda``, a bad checkpoint)
is one line on stderr that starts with ``error:`` and says what to do, and exit status 2;
a check that runs but disagrees exits 1.
"""
from __future__ import annotations

import argparse
import sys

import torch

from .check import UsageError, compare_with_hf, format_report
from .specs import SPECS, UnknownModel, get_spec
from .weights import CheckpointError


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors are one ``error:`` line like every other usage error."""

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


def _ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise UsageError(f"--prompt-ids {text!r} is not a comma-separated list of "
                         "integers; write e.g. --prompt-ids 1,2,3") from None


# ---- check ----------------------------------------------------------------------------
def cmd_check(args) -> int:
    device = _device(args.device)
    if args.model is None and args.checkpoint is None:
        raise UsageError("check needs --model NAME or --checkpoint PATH "
                         f"(known models: {', '.join(SPECS)})")
    spec = get_spec(args.model) if args.model else None
    weights = None
    if args.checkpoint:
        from .weights import load_checkpoint
        spec, weights = load_checkpoint(args.checkpoint, spec, dtype=torch.float32)
    prompt_ids = _ids(args.prompt_ids) if args.prompt_ids is not None else None
    r = compare_with_hf(spec, device=device, tokens=args.tokens, prompt_len=args.prompt_len,
                        seed=args.seed, prompt_ids=prompt_ids, weights=weights)
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
    p.add_argument("--tokens", type=int, default=12, help="greedy tokens to generate")
    p.add_argument("--prompt-len", type=int, default=7, help="random prompt ids to draw")
    p.add_argument("--prompt-ids", help="the prompt as comma-separated ids (replaces --prompt-len)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompt")
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
    from .timing import read_bandwidth
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
    p.add_argument("--bandwidth", type=float, metavar="TBPS",
                   help="bandwidth in TB/s (default: measure the streaming read of this GPU)")
    p.add_argument("--ctx", type=int, default=0, help="tokens of context whose KV cache "
                   "the step also reads")
    p.set_defaults(func=cmd_info)


# ---- main -----------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="onelaunch", description="A batch-1 decode engine in Triton, "
                     "measured against the memory-bandwidth floor.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_check(sub)
    _add_info(sub)
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
