"""``onelaunch check``: the oracle against Hugging Face transformers on one prompt."""
from __future__ import annotations

import torch

from ..prompt import UsageError
from ..specs import SPECS, get_spec
from .args import _device, _int_at_least, _model_name, _prompt_ids, _prompt_len, _seed


def cmd_check(args) -> int:
    device = _device(args.device)
    if args.model is None and args.checkpoint is None:
        raise UsageError("check needs --model NAME or --checkpoint PATH "
                         f"(known models: {', '.join(SPECS)})")
    from ..measure.hf_check import compare_with_hf, format_report
    from ..prompt import make_prompt, validate_prompt
    from ..checkpoint import inspect_checkpoint, load_checkpoint
    spec = get_spec(args.model) if args.model else None
    if args.checkpoint is not None:            # its config, before any weight is read
        spec, _ = inspect_checkpoint(args.checkpoint, spec)
    args.prompt_len = _prompt_len(args, 7)
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
    p.add_argument("--model", type=_model_name, help=f"one of: {', '.join(SPECS)}")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="cpu: fp32 oracle; cuda: bf16 oracle against an fp32 reference")
    p.add_argument("--tokens", type=_int_at_least(1), default=12, help="greedy tokens to generate")
    p.add_argument("--prompt-len", type=_int_at_least(1), default=None,
                   help="random prompt ids to draw (default 7)")
    p.add_argument("--prompt-ids", type=_prompt_ids,
                   help="the prompt as comma-separated ids (replaces --prompt-len)")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the weights and the prompt")
    p.add_argument("--checkpoint", help="a local checkpoint folder (or hub id) to load "
                   "instead of random weights")
    p.set_defaults(func=cmd_check)
