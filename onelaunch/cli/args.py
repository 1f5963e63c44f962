"""The command line's arguments: the parser whose errors are one ``error:`` line, the
argument types that refuse a bad value before any work, and the checks shared by the
commands (the device, Triton's interpreter on the CPU, whether --tp fits).
"""
from __future__ import annotations

import argparse
import math
import re
import sys

import torch

from .. import env
from ..prompt import UsageError
from ..tp import RUNGS as RUNG_NAMES


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
                         "use --device cpu (or run on a machine with a GPU)")
    return name


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


def _output_file(text: str) -> str:
    """A file a run will write at its end: refused now, not after the run, when its folder
    does not exist or the path is a folder."""
    import os
    folder = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a folder: give a file name in it, "
                                         f"e.g. {os.path.join(text, 'bench.json')}")
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"the folder {folder!r} does not exist: create it "
                                         "first, or write the file elsewhere")
    if not os.access(folder, os.W_OK):
        raise argparse.ArgumentTypeError(f"the folder {folder!r} is not writable")
    return text


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
        ids = [int(t) for t in items]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of "
                                         "integers; write e.g. --prompt-ids 1,2,3") from None
    bad = next((i for i in ids if not 0 <= i < 2 ** 31), None)
    if bad is not None:     # before torch sees it: 10**30 overflows an int64
        raise argparse.ArgumentTypeError(f"has id {bad}, which no vocabulary holds: ids are "
                                         "0 or more, below the model's vocabulary size")
    return ids


def _model_name(text: str) -> str:
    """--model as typed: a name, not an empty string (the spec itself is looked up later,
    with the list of known ones in the refusal)."""
    if not text.strip():
        from ..specs import SPECS
        raise argparse.ArgumentTypeError(f"is empty: give one of: {', '.join(SPECS)}")
    return text


def _prompt_len(args, default: int) -> int:
    """--prompt-len, or its default; refused beside --prompt-ids (which sets the length)."""
    if args.prompt_ids is not None and args.prompt_len is not None:
        raise UsageError("give --prompt-ids or --prompt-len, not both (the ids set the "
                         "prompt's length)")
    return default if args.prompt_len is None else args.prompt_len


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
    from .. import tp
    try:
        tp.shard_spec(spec, world)
        tp.check_hardware(world, rungs, device)
    except tp.TPError as ex:
        raise UsageError(str(ex)) from None


def _kernels_on(device: str) -> None:
    """On the CPU, the Triton kernels run in Triton's interpreter; that must be chosen
    before any kernel module is imported."""
    if device == "cpu":
        if "onelaunch.kernels" in sys.modules and not env.interpreting():
            raise UsageError("the kernels were imported without TRITON_INTERPRET=1; "
                             "set it before running on the CPU")
        env.use_interpreter()


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
