"""Launch configurations, chosen per GPU architecture and weight shape in the launchers
(never in kernels).

Every fused kernel is memory-bound at batch 1, so a configuration is about bytes in flight:
enough programs to give every SM work, and tiles large enough that each SM keeps tens of
kilobytes of loads outstanding. Entries are keyed by compute capability; a GPU missing from
the table (or the CPU interpreter) falls back to ``default``, which is safe everywhere.

sm_90 (H100/H200: 132 SMs, 50 MB+ of L2) was measured in this project (see NOTES.md);
sm_89 (RTX 4090: 128 SMs, 72 MB L2, ~1 TB/s) takes the defaults: shapes that measured
within about 10% of the best on the H200 and stay clear of the one that spilled
registers there. They are untested on Ada; a reader with a 4090 can measure and write
its own table with the sweep.
"""
from __future__ import annotations

import functools

import torch

from .. import env
from . import tuned

# op -> dict of launch parameters
_DEFAULT = {
    "rms_qkv":     dict(BLOCK_N=16, BLOCK_K=512, num_warps=4),
    "o_proj_residual":      dict(BLOCK_N=16, BLOCK_K=512, num_warps=4),
    "rms_gate_up_swiglu":     dict(BLOCK_N=16, BLOCK_K=512, num_warps=4),
    "down_residual":        dict(BLOCK_N=16, BLOCK_K=512, SPLIT_K=4, num_warps=4),
    "lm_head_argmax":     dict(BLOCK_N=32, BLOCK_K=256, num_warps=4),   # not 64x512: it spilled (6%)
    "attention":   dict(BLOCK_T=64, num_warps=4),
    "attention_splitk":  dict(BLOCK_T=64, num_warps=4),
    "moe_router":      dict(BLOCK_N=4, BLOCK_K=512, num_warps=4),
    "moe_gate_up_swiglu": dict(BLOCK_N=8, BLOCK_K=512, num_warps=4),
    "moe_down_residual":    dict(BLOCK_N=8, BLOCK_K=512, num_warps=4),
    # the persistent layer kernel (one launch a layer): the warps of every phase; NEXT:
    # request the next phase's first tiles before each grid barrier; STAGES > 0: its GEMV
    # phases stream through shared memory, STAGES - 1 tiles of TILE (rows x K) ahead
    # (2 x 16 KB for gate/up here: well inside a 4090's 99 KB); 0: the unfused ops' tiles
    # with a register ring
    "layer_persistent": dict(num_warps=4, NEXT=1, STAGES=3, TILE="8x512"),
}

TABLE: dict[str, dict[str, dict]] = {
    "default": _DEFAULT,
    "sm_90": {   # the GEMVs' entries are in tuned/sm_90.json (a sweep: NOTES.md)
        "attention":  dict(BLOCK_T=64, num_warps=4),
        "attention_splitk": dict(BLOCK_T=64, num_warps=4),
        # measured (H200, Qwen, ctx 512): with a register ring, 8 warps 1 program per SM
        # 2.47 ms, 4 warps 2 per SM 1.90 (results/h200/2026-11-30_tp-peer-and-split-caps/
        # persistent_check.json); streamed through shared memory, 4 warps 2 per SM, 4
        # stages of 8 x 512: 1.55 ms (8 warps 1 per SM, 4 of 16 x 512: 1.54; 6 of 8 x 512:
        # 1.63; results/h200/2026-11-30_persistent-layer/persistent_stream.json).
        # PDL=0: launched without PDL (results/h200/2026-11-30_persistent-layer-variants/
        # *_nopdl.json): OLMoE 1.67 -> 1.50 ms, Qwen 1.54 -> 1.56 (within the step's
        # noise). FOLD_ROPE=1: RoPE and the KV write inside the attention phase, one
        # barrier fewer (Qwen 1.557 -> 1.501 ms, bit for bit,
        # results/h200/2026-11-30_o-merge-and-l2-prefetch/fold_qwen_*.json); OLMoE's q/k
        # norm keeps its own phase: the kernel ignores FOLD_ROPE there.
        "layer_persistent": dict(num_warps=4, PER_SM=2, NEXT=1, STAGES=4, TILE="8x512",
                                 PDL=0, FOLD_ROPE=1),
    },
    # RTX 4090 (Ada): not measured here; the defaults, whose tiles are safe on any GPU.
    # `python -m onelaunch bench --model NAME --what sweepcfg --write-table` writes a
    # measured table (tuned/sm_89.json, ``tuned.py``), which takes precedence over this one.
    "sm_89": _DEFAULT,
    # Triton's CPU interpreter: its cost grows with programs x loop steps, not with bytes,
    # so the CPU runs take few, wide programs (still several per op, so the masks and
    # the last-arrival reductions across programs are exercised at the tiny shapes)
    "interpreter": {**_DEFAULT,
                    "rms_qkv": dict(BLOCK_N=64, BLOCK_K=512, num_warps=4),
                    "o_proj_residual": dict(BLOCK_N=64, BLOCK_K=512, num_warps=4),
                    "rms_gate_up_swiglu": dict(BLOCK_N=64, BLOCK_K=512, num_warps=4),
                    "down_residual": dict(BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, num_warps=4),
                    "lm_head_argmax": dict(BLOCK_N=256, BLOCK_K=256, num_warps=4),
                    "moe_router": dict(BLOCK_N=8, BLOCK_K=512, num_warps=4),
                    "moe_gate_up_swiglu": dict(BLOCK_N=32, BLOCK_K=512, num_warps=4),
                    "moe_down_residual": dict(BLOCK_N=64, BLOCK_K=512, num_warps=4),
                    # streamed at the ops' own tiles (plan.persistent_cfgs)
                    "layer_persistent": dict(num_warps=4, NEXT=1, STAGES=2)},
}


def interpreting() -> bool:
    return env.interpreting()


@functools.lru_cache(maxsize=None)
def arch(device_index: int = 0) -> str:
    if interpreting():
        return "interpreter"
    if not torch.cuda.is_available():
        return "default"
    major, minor = torch.cuda.get_device_capability(device_index)
    return f"sm_{major}{minor}"


def get(op: str, device=None, shape: tuple[int, int] | None = None) -> dict:
    """The launch configuration of ``op`` on ``device`` for a weight of ``shape`` (N, K)."""
    a = "interpreter" if interpreting() else "default"
    if device is not None and torch.device(device).type == "cuda":
        a = arch(torch.device(device).index or 0)
    return for_arch(op, a, shape)


def for_arch(op: str, arch_name: str, shape: tuple[int, int] | None = None) -> dict:
    """``op``'s configuration on ``arch_name``: the measured table's entry for that shape
    (``tuned.py``: tuned/<arch>.json), else the one measured nearest to it, else the
    hand-written table of the architecture, else the defaults."""
    c = tuned.nearest(tuned.read(arch_name).get(op, {}), shape)
    if c is not None:
        return dict(c)
    return dict(TABLE.get(arch_name, _DEFAULT).get(op, _DEFAULT[op]))


def prefetch(c: dict, k_span: int) -> int:
    """Weight tiles a program keeps in flight: it requests that many before its PDL wait,
    then one more each time it consumes one. The entry's PREFETCH (default 1), at most 4
    and at most the tiles that cover ``k_span`` (one program's share of K)."""
    return max(1, min(int(c.get("PREFETCH", 1)), 4, -(-k_span // c["BLOCK_K"])))


def pdl_supported(device) -> bool:
    """Programmatic dependent launch needs Hopper or newer and a real GPU."""
    if interpreting() or torch.device(device).type != "cuda":
        return False
    return torch.cuda.get_device_capability(torch.device(device).index or 0)[0] >= 9
