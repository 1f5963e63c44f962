"""The one-launch kernels compiled for sm_90 on any machine (no GPU): the layouts, TMA
boxes, barriers and shared memory hold, and a hash of the code shows whether an edit
changed what the GPU runs.

    python -m onelaunch.megakernel.aot                         # Qwen2.5-1.5B, every form
    python -m onelaunch.megakernel.aot --model olmoe-1b-7b     # the MoE kernel
    python -m onelaunch.megakernel.aot --attention three --l2 1,2  # the L2 prefetch on
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import sys

import triton

from . import schedule
from .boxes import KB, TK, TN, down_boxes, gate_up_boxes, smem_layout
from .gluon import args
from .gluon.dense import step_kernel
from .gluon.moe import moe_step_kernel
from .step import (ATTENTION, BT, MOE_ATTENTION, MOE_STAGES, POLL, STAGES, constexprs,
                   moe_constexprs, plan_schedule)

# the kernels' pointers by name: their element types in a signature (sizes are i32)
BF16 = set("x qkv q attn h kc vc cos sin emb gin gpost gfin bqkv qn kn".split())
FP32 = set("pm pl po val ss rl rw".split())
I64 = {"clk"}
SCALARS = {"prog_ptr": "*i32", "n_instr": "i32", "eps": "fp32", "scale": "fp32",
           "timeout_ns": "i64", "n_ctr": "i32", "l2_tab": "*i64", "C": "constexpr",
           "num_warps": "constexpr"}
GROUPS = {"acts": args.Acts, "cache": args.Cache, "parts": args.Partials,
          "token": args.Token, "sync": args.Sync}
DENSE_GROUPS = dict(GROUPS, gains=args.Gains, sizes=args.Sizes)
MOE_GROUPS = dict(GROUPS, gains=args.MoEGains, route=args.Route, sizes=args.MoESizes)


def pointer(name: str) -> str:
    return ("*bf16" if name in BF16 else "*fp32" if name in FP32 else "*i64" if name in I64
            else "*i32")


def signature(kernel, groups: dict, boxes: dict, absent=()) -> tuple[dict, list]:
    """``kernel``'s signature by its parameters' names (``boxes``: each descriptor's K
    tiles a box; ``groups``: each tuple parameter's NamedTuple; ``absent``: parameters
    passed as None, compile-time constants), and the paths of its pointers (16-byte
    aligned, as the host's tensors are)."""
    lay = smem_layout()
    sig, aligned = {}, []
    for i, n in enumerate(inspect.signature(kernel.fn).parameters):
        if n in absent:
            sig[n] = "constexpr"
        elif n in boxes:
            sig[n] = f"tensordesc<bf16[{TN},{boxes[n]},{TK}],{lay!r}>"
        elif n in groups:
            cls = groups[n]
            sizes = cls in (args.Sizes, args.MoESizes)
            sig[n] = cls(*("i32" if sizes else pointer(f) for f in cls._fields))
            aligned += [(i, j) for j in range(len(cls._fields)) if not sizes]
        else:
            sig[n] = SCALARS[n]
            aligned += [(i,)] if sig[n].startswith("*") else []
    return sig, aligned


def aot(spec_name: str = "qwen2.5-1.5b", P: int = 132, stages: int | None = None,
        num_warps: int = 4, attention: str = ATTENTION, poll: int = POLL,
        bt: int = BT, l2: int = 0) -> dict:
    """The one-launch kernel of ``spec_name`` compiled for sm_90 (an MoE spec: the MoE
    kernel, its one attention form, ``attention`` unused); ``l2`` the dense kernel's L2
    prefetch (``Consts.L2PF``; 0: its table None)."""
    from ..specs import get_spec
    s = get_spec(spec_name)
    kg, gt = gate_up_boxes(s.hidden // TK, KB)
    if s.is_moe:
        kernel, stages = moe_step_kernel, stages or MOE_STAGES
        n_ctr = len(plan_schedule(s, P, 512).counters)
        consts = moe_constexprs(s, P, n_ctr, stages, True, kg, gt, poll, bt)
        boxes = dict(d_qkv=KB, d_o=KB, d_rt=KB, d_egu=KB, d_edn=s.intermediate // TK,
                     d_lm=KB)
        groups = MOE_GROUPS
    else:
        kernel, stages = step_kernel, stages or STAGES
        nf, tail = down_boxes(s.intermediate // TK, 2 * KB, True, num_warps)
        n_ctr = len(plan_schedule(s, P, 512, attention).counters)
        consts = constexprs(s, P, n_ctr, stages, True, kg, gt, nf, tail, attention, poll, l2)
        boxes = dict(d_qkv=KB, d_o=KB, d_gu=KB, d_dn=2 * KB, d_dt=tail or 2 * KB, d_lm=KB)
        groups = DENSE_GROUPS
    absent = () if s.is_moe or l2 else ("l2_tab",)
    sig, aligned = signature(kernel, groups, boxes, absent)
    return compile_sm90(kernel, sig, dict(C=consts, num_warps=num_warps,
                                          **dict.fromkeys(absent)), aligned, num_warps)


def compile_sm90(kernel, sig: dict, consts: dict, aligned, num_warps: int) -> dict:
    """``kernel`` compiled for sm_90 on any machine (``aligned``: the indices, or paths into
    tuple arguments, of pointers 16-byte aligned); raises unless its PTX has TMA copies,
    mbarriers and the clock. Returns its shared memory, TMA copies, every thread's own
    acquire loads (``POLL`` 1's polls), bulk L2 prefetches, PTX lines and ``code``: a hash
    of the PTX's code (``ptx_code_hash``)."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource
    attrs = {(i if isinstance(i, tuple) else (i,)): [["tt.divisibility", 16]]
             for i in aligned}
    k = triton.compile(GluonASTSource(kernel, sig, constexprs=consts, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))
    ptx = k.asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx, "TMA loads"
    assert "mbarrier" in ptx and "%globaltimer" in ptx
    return {"shared": k.metadata.shared, "tma": ptx.count("cp.async.bulk.tensor"),
            "acquire": ptx.count("ld.acquire.gpu.global"),
            "l2_prefetch": ptx.count("cp.async.bulk.prefetch.L2"),
            "evict_last": ptx.count("createpolicy.fractional.L2::evict_last"),
            "ptx_lines": ptx.count("\n"),
            "code": ptx_code_hash(ptx)}


def ptx_code_hash(ptx: str) -> str:
    """16 hex digits of the SHA-256 of the PTX's code: without its source files and line
    numbers (``.file``, ``.loc``) and debug sections, so moving or re-commenting the
    source leaves it, and any change to the generated code changes it."""
    keep = []
    for line in ptx.split("\n"):
        s = line.strip()
        if s.startswith(".section") and ".debug" in s:
            break
        if not s.startswith((".file", ".loc")):
            keep.append(line)
    return hashlib.sha256("\n".join(keep).encode()).hexdigest()[:16]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m onelaunch.megakernel.aot",
                                 description="compile the one-launch step for sm_90 (no GPU)")
    ap.add_argument("--model", default="qwen2.5-1.5b",
                    help="the spec (an MoE one compiles the MoE kernel, attention four)")
    ap.add_argument("--stages", default=None,
                    help=f"the ring's stages, comma-separated: each (default {STAGES}; "
                    f"MoE {MOE_STAGES})")
    ap.add_argument("--poll", default=str(POLL), help="counter polls, comma-separated: 0 "
                    "one thread's load broadcast, 1 every thread's own "
                    f"(default {POLL})")
    ap.add_argument("--attention", default=",".join(schedule.FORMS),
                    help="the attention's forms (" + "; ".join(
                        f"{f}: {t}" for f, t in schedule.FORM_TEXT.items()) + ")")
    ap.add_argument("--l2", default="0", help="the dense kernel's L2 prefetch of gate/up, "
                    "comma-separated: 0 off, 1 on, 2 on with evict-last (default 0)")
    a = ap.parse_args(argv)
    from ..specs import get_spec
    moe = get_spec(a.model).is_moe
    default = MOE_STAGES if moe else STAGES
    forms = [MOE_ATTENTION] if moe else a.attention.split(",")
    for st in (int(v) for v in (a.stages or str(default)).split(",")):
        for f in forms:
            for pl in (int(v) for v in a.poll.split(",")):
                for l2 in (0,) if moe else (int(v) for v in a.l2.split(",")):
                    print(f"[{'moe_step_kernel' if moe else 'step_kernel'}] sm_90 STAGES "
                          f"{st} attention {f} poll {pl}{f' l2 {l2}' if l2 else ''}: "
                          f"{aot(a.model, stages=st, attention=f, poll=pl, l2=l2)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
