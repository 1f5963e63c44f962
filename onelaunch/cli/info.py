"""``onelaunch info``: a spec's parameters, the bytes one step reads and its floor."""
from __future__ import annotations

import sys

import torch

from ..prompt import UsageError
from ..specs import SPECS, get_spec
from .args import _positive_float


def _bandwidth(args) -> tuple[float, str]:
    if args.bandwidth is not None:
        if args.bandwidth <= 0:
            raise UsageError(f"--bandwidth must be positive TB/s (got {args.bandwidth})")
        return args.bandwidth, "given"
    if not torch.cuda.is_available():
        raise UsageError("no GPU here to measure the bandwidth on; pass --bandwidth TBPS "
                         "(e.g. --bandwidth 4.0 for an H200's streaming read)")
    from ..measure.timing import read_bandwidth
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
