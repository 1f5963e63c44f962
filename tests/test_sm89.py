"""Every Triton kernel compiles for an RTX 4090 (sm_89) on a CPU, with every launch
configuration the sm_89 table can pick, within the 4090's shared memory.

Triton compiles for a named target without the GPU: the driver is replaced by one that
names ``GPUTarget("cuda", 89, 32)``, and each launcher is called with CPU tensors of the
real shapes, so its kernel is specialised exactly as on the card (dtypes, 16-byte
alignment, constexprs) and compiled to a cubin by the ``ptxas`` that Triton ships; it is
never launched. This needs Triton's compiler, not its interpreter, so it runs in a
subprocess without ``TRITON_INTERPRET``.

The configurations: for each op, the entry of ``config.TABLE["sm_89"]`` and the entries
of ``kernels/tuned/sm_89.json`` (``config.get`` prefers them): what a 4090 runs today;
the split-K chunk for every context length the specs allow; no PDL (it needs sm_90). The
candidates of the launch-configuration sweep (``tune.config_sweep``) are not compiled
here: on a 4090 the sweep runs each candidate, records one that raises (a failed compile,
too much shared memory) as an ``error`` row, and writes only a candidate that passed its
check and was timed into ``tuned/sm_89.json`` (``tune.write_table``), where this test
then compiles it.

Adding a kernel: add a case to ``CASES`` (a function that calls its launcher). The test
fails if a ``_*_kernel`` in ``onelaunch/kernels/`` is compiled by no case.

    python tests/test_sm89.py [OUT.json]       # the same, printing one line per compile
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARCH = 89
# the RTX 4090's (sm_89) opt-in shared memory per block: 99 KB
SMEM_LIMIT = 99 * 1024
MODELS = ("qwen2.5-1.5b", "olmoe-1b-7b")


# ---- the cases: one per launcher, over the sm_89 table's configurations ----------------
def _sm89_configs(op: str) -> list[dict]:
    """The configurations ``config.get(op)`` can return on an sm_89 GPU: the table's
    entry and the tuned file's."""
    from onelaunch.kernels import config, tuned
    out = []
    for c in (config.TABLE["sm_89"].get(op, config.TABLE["default"][op]),
              *tuned.read("sm_89").get(op, {}).values()):
        if c is not None and dict(c) not in out:
            out.append(dict(c))
    return out


def _chunks(spec) -> list[int]:
    """Every split-K chunk an engine of this model can use (it depends on max_ctx)."""
    from onelaunch import kernels as K
    ctxs = [16 << i for i in range(20) if 16 << i < spec.max_ctx] + [spec.max_ctx]
    return sorted({K.attention_splitk.chunk_for(c) for c in ctxs})


def _t(*shape, dtype="bf16"):
    import torch
    dt = {"bf16": torch.bfloat16, "f32": torch.float32, "i32": torch.int32}[dtype]
    return torch.empty(shape, dtype=dt)       # never touched: only its dtype and address


def case_embed(spec):
    from onelaunch import kernels as K
    K.embed.embed(_t(spec.vocab, spec.hidden), _t(spec.hidden), _t(8, dtype="i32"), _t(1, dtype="i32"))
    yield "default"


def case_rms_qkv(spec):
    from onelaunch import kernels as K
    H = spec.hidden
    for c in _sm89_configs("rms_qkv"):
        bias = _t(spec.qkv_size) if spec.qkv_bias else None
        K.rms_qkv.rms_qkv(_t(H), _t(H), _t(spec.qkv_size, H), bias, _t(spec.qkv_size), 1e-6, cfg=c)
        yield c


def case_rope_kv(spec):
    from onelaunch import kernels as K
    C, D = 256, spec.head_dim
    K.rope_kv_write.rope_kv_write(_t(spec.qkv_size), _t(spec.q_size), _t(spec.kv_heads, C, D),
                    _t(spec.kv_heads, C, D), _t(C, D), _t(C, D), _t(1, dtype="i32"),
                    spec.heads, spec.kv_heads, D)
    yield "default"


def case_attention(spec):
    from onelaunch import kernels as K
    C, D = 256, spec.head_dim
    for c in _sm89_configs("attention"):
        K.attention.attention(_t(spec.q_size), _t(spec.kv_heads, C, D), _t(spec.kv_heads, C, D),
                    _t(spec.q_size), _t(1, dtype="i32"), spec.heads, spec.kv_heads, D, c)
        yield c


def _splitk_buffers(spec, chunk):
    from onelaunch import kernels as K
    C = chunk * 4
    n = K.attention_splitk.n_splits_for(C, chunk)
    D = spec.head_dim
    return C, (_t(spec.heads, n, D, dtype="f32"), _t(spec.heads, n, dtype="f32"),
               _t(spec.heads, n, dtype="f32"))


def case_attention_splitk(spec):
    from onelaunch import kernels as K
    D = spec.head_dim
    for c in _sm89_configs("attention_splitk"):
        for chunk in _chunks(spec):
            C, parts = _splitk_buffers(spec, chunk)
            K.attention_splitk.attention_splitk(_t(spec.q_size), _t(spec.kv_heads, C, D), _t(spec.kv_heads, C, D),
                               _t(spec.q_size), _t(1, dtype="i32"), *parts, spec.heads,
                               spec.kv_heads, D, chunk, c)
            yield {**c, "CHUNK": chunk}


def case_o_proj(spec):
    from onelaunch import kernels as K
    for c in _sm89_configs("o_proj_residual"):
        K.o_proj_residual.o_proj_residual(_t(spec.q_size), _t(spec.hidden, spec.q_size), _t(spec.hidden), cfg=c)
        yield c


def case_gate_up(spec):
    from onelaunch import kernels as K
    if spec.is_moe:      # the experts have their own kernels
        return
    H, I = spec.hidden, spec.intermediate
    for c in _sm89_configs("rms_gate_up_swiglu"):
        K.rms_gate_up_swiglu.rms_gate_up_swiglu(_t(H), _t(H), _t(2 * I, H), _t(I), 1e-6, cfg=c)
        yield c


def case_down(spec):
    from onelaunch import kernels as K
    if spec.is_moe:
        return
    H, I = spec.hidden, spec.intermediate
    for c in _sm89_configs("down_residual"):
        for split in sorted({1, c.get("SPLIT_K", 1)}):    # SPLIT_K 1 is a different kernel
            cs = {**c, "SPLIT_K": split}
            K.down_residual.down_residual(_t(I), _t(H, I), _t(H), _t(16 * H, dtype="f32"),
                            _t(H, dtype="i32"), cfg=cs)
            yield cs


def case_lm_head(spec):
    from onelaunch import kernels as K
    H, V = spec.hidden, spec.vocab
    for c in _sm89_configs("lm_head_argmax"):
        n = -(-V // c["BLOCK_N"])
        for argmax in (None, _t(64, dtype="i32")):
            K.lm_head_argmax.lm_head_argmax(_t(H), _t(H), _t(V, H), _t(V, dtype="f32"), _t(n, dtype="f32"),
                             _t(n, dtype="i32"), _t(1, dtype="i32"), _t(64, dtype="i32"),
                             _t(1, dtype="i32"), _t(1, dtype="i32"), 1e-6, cfg=c, argmax=argmax)
            yield {**c, "argmax": argmax is not None}


def case_moe(spec):
    from onelaunch import kernels as K
    if not spec.is_moe:
        return
    H, I, E, k = spec.hidden, spec.intermediate, spec.experts, spec.top_k
    for c in _sm89_configs("moe_router"):
        K.moe_router.moe_router(_t(H), _t(H), _t(E, H), _t(H), _t(E, dtype="f32"), _t(k, dtype="i32"),
                     _t(k, dtype="f32"), _t(1, dtype="i32"), _t(1, dtype="i32"), 1e-5,
                     log=_t(8, spec.layers, k, dtype="i32"), cfg=c)
        yield {"op": "moe_router", **c}
    for c in _sm89_configs("moe_gate_up_swiglu"):
        K.moe_experts.moe_gate_up_swiglu(_t(H), _t(E, 2 * I, H), _t(k, dtype="i32"), _t(k, I), cfg=c)
        yield {"op": "moe_gate_up_swiglu", **c}
    for c in _sm89_configs("moe_down_residual"):
        K.moe_experts.moe_down_residual(_t(k, I), _t(E, H, I), _t(k, dtype="i32"), _t(k, dtype="f32"), _t(H),
                            _t(k * H, dtype="f32"), _t(H, dtype="i32"), cfg=c)
        yield {"op": "moe_down_residual", **c}


def _peer_site():
    """A CPU PeerBuffers site (2 ranks) large enough for every TP launch below."""
    from onelaunch.kernels.peer import PeerBuffers
    slots, flags, seqnos = PeerBuffers.alloc_shared(2, 1, 4096, 1024)
    return PeerBuffers.from_tensors(0, 2, slots, flags, seqnos[0]).site(0)


def case_tp(spec):
    """Tensor parallelism's modes at one rank's shapes of TP=2: the row-parallel
    projections' ``out`` (unfused) and ``peer`` (fused) epilogues, the vocabulary-split LM
    head's ``keys`` and ``peer``, RoPE with the ranks' q/k statistic, and tp_ops."""
    from onelaunch import kernels as K
    H, V, k = spec.hidden, spec.vocab // 2, spec.top_k
    site = _peer_site()
    ep = [("out", dict(out=_t(H, dtype="f32"))), ("peer", dict(peer=site))]
    for c in _sm89_configs("o_proj_residual"):
        for name, kw in ep:
            K.o_proj_residual.o_proj_residual(_t(spec.q_size // 2), _t(H, spec.q_size // 2), _t(H), cfg=c, **kw)
            yield {"op": "o_proj_residual", name: True, **c}
    if spec.is_moe:
        I, E = spec.intermediate // 2, spec.experts
        for c in _sm89_configs("moe_down_residual"):
            for name, kw in ep:
                K.moe_experts.moe_down_residual(_t(k, I), _t(E, H, I), _t(k, dtype="i32"), _t(k, dtype="f32"),
                                    _t(H), _t(k * H, dtype="f32"), _t(H, dtype="i32"), cfg=c, **kw)
                yield {"op": "moe_down_residual", name: True, **c}
        D, C = spec.head_dim, 256
        hq, hkv = spec.heads // 2, spec.kv_heads // 2
        K.rope_kv_write.rope_kv_write(_t((hq + 2 * hkv) * D), _t(hq * D), _t(hkv, C, D), _t(hkv, C, D), _t(C, D),
                        _t(C, D), _t(1, dtype="i32"), hq, hkv, D, q_norm=_t(hq * D),
                        k_norm=_t(hkv * D), eps=1e-5, ss=_t(2, dtype="f32"), q_total=spec.q_size,
                        k_total=spec.kv_heads * D)
        yield {"op": "rope_ss"}
        for peer in (None, site):
            K.tp_ops.qk_sumsq(_t((hq + 2 * hkv) * D), _t(2, dtype="f32"), hq * D, hkv * D, peer=peer)
            yield {"op": "qk_sumsq", "peer": peer is not None}
    else:
        I = spec.intermediate // 2
        for c in _sm89_configs("down_residual"):
            for split in sorted({1, c.get("SPLIT_K", 1)}):
                for name, kw in ep:
                    K.down_residual.down_residual(_t(I), _t(H, I), _t(H), _t(16 * H, dtype="f32"),
                                    _t(H, dtype="i32"), cfg={**c, "SPLIT_K": split}, **kw)
                    yield {"op": "down_residual", name: True, **c, "SPLIT_K": split}
    for c in _sm89_configs("lm_head_argmax"):
        n = -(-V // c["BLOCK_N"])
        for name, kw in (("keys", dict(keys=_t(4, dtype="f32"), vocab_offset=V, rank=1, world=2)),
                         ("peer", dict(peer=site))):
            K.lm_head_argmax.lm_head_argmax(_t(H), _t(H), _t(V, H), _t(V, dtype="f32"), _t(n, dtype="f32"),
                             _t(n, dtype="i32"), _t(1, dtype="i32"), _t(64, dtype="i32"),
                             _t(1, dtype="i32"), _t(1, dtype="i32"), 1e-6, cfg=c,
                             argmax=_t(64, dtype="i32"), **kw)
            yield {"op": "lm_head_argmax", name: True, **c}
    K.tp_ops.residual_add(_t(H, dtype="f32"), _t(H))
    yield {"op": "residual_add"}
    K.tp_ops.allreduce_residual(_t(H, dtype="f32"), _t(H), site)
    yield {"op": "allreduce_residual"}
    for argmax in (None, _t(64, dtype="i32")):
        K.tp_ops.argmax_merge(_t(4, dtype="f32"), _t(64, dtype="i32"), _t(1, dtype="i32"),
                       _t(1, dtype="i32"), 2, argmax=argmax)
        yield {"op": "argmax_merge", "argmax": argmax is not None}


def case_layer_persistent(spec):
    """The persistent layer, all phases in one launch, with the sm_89 table's first
    configuration of every op at the persistent kernel's warps (plan.persistent_tiles):
    streamed at the table's STAGES and TILE; dense models also with the register ring, its
    next-phase tiles requested ahead or not (the MoE layer always streams), and streamed
    with RoPE folded into the attention phase."""
    from onelaunch import kernels as K
    from onelaunch.kernels import config
    from onelaunch.plan import persistent_tiles
    H, I, D, C, chunk = spec.hidden, spec.intermediate, spec.head_dim, 256, 64
    L = {"input_norm": _t(H), "w_qkv": _t(spec.qkv_size, H),
         "b_qkv": _t(spec.qkv_size) if spec.qkv_bias else None, "w_o": _t(H, spec.q_size),
         "post_norm": _t(H)}
    moe = None
    if spec.is_moe:
        E, k = spec.experts, spec.top_k
        L.update(w_router=_t(E, H), w_experts_gate_up=_t(E, 2 * I, H),
                 w_experts_down=_t(E, H, I))
        if spec.qk_norm:
            L.update(q_norm=_t(spec.q_size), k_norm=_t(spec.kv_heads * D))
        log = _t(C, spec.layers, k, dtype="i32")
        moe = dict(logits=_t(E, dtype="f32"), ids=_t(k, dtype="i32"),
                   weights=_t(k, dtype="f32"), log=log, log_row=log.stride(0), log_offset=0,
                   h=_t(k, I))
        ops = ("rms_qkv", "o_proj_residual", "moe_router", "moe_gate_up_swiglu", "moe_down_residual", "attention_splitk")
    else:
        L.update(w_gate_up=_t(2 * I, H), w_down=_t(H, I))
        ops = ("rms_qkv", "o_proj_residual", "rms_gate_up_swiglu", "down_residual", "attention_splitk")
    n = K.attention_splitk.n_splits_for(C, chunk)
    entry = config.TABLE["sm_89"].get("layer_persistent",
                                      config.TABLE["default"]["layer_persistent"])
    streamed = (1, entry.get("STAGES", 0), 0)
    # dense: also the register ring, and RoPE folded into attention (FOLD_ROPE)
    variants = (streamed,) + (() if moe else ((1, 0, 0), (0, 0, 0), streamed[:2] + (1,)))
    for nxt, stages, fold in variants:
        c_p = dict(entry, NEXT=nxt, STAGES=stages, FOLD_ROPE=fold)
        cfgs = persistent_tiles(c_p, {op: _sm89_configs(op)[0] for op in ops})
        K.layer_persistent.layer_persistent(_t(H), L, _t(spec.qkv_size), _t(spec.q_size), _t(spec.q_size), _t(I),
                           _t(spec.kv_heads, C, D), _t(spec.kv_heads, C, D), _t(C, D), _t(C, D),
                           _t(1, dtype="i32"), _t(spec.heads, n, D, dtype="f32"),
                           _t(spec.heads, n, dtype="f32"), _t(spec.heads, n, dtype="f32"),
                           _t(16 * H, dtype="f32"), _t(H, dtype="i32"), _t(2, dtype="i32"),
                           spec.heads, spec.kv_heads, D, 1e-6, chunk, cfgs, grid=128,
                           opts={"pdl": False, "cooperative": False, "split": False}, moe=moe)
        yield {"NEXT": nxt, "STAGES": stages, "FOLD_ROPE": fold, "num_warps": c_p["num_warps"],
               "moe": bool(moe)}


CASES = [case_embed, case_rms_qkv, case_rope_kv, case_attention, case_attention_splitk,
         case_o_proj, case_gate_up, case_down, case_lm_head, case_moe,
         case_tp, case_layer_persistent]


# ---- compiling without a GPU ----------------------------------------------------------
class _TargetOnlyDriver:
    """Stands in for Triton's CUDA driver: names the target, launches nothing."""

    def __init__(self, target):
        self.target = target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target


def kernels_in_package() -> set[str]:
    """Names of the launchable kernels (``_*_kernel``) in ``onelaunch/kernels/``."""
    import importlib
    import pkgutil

    from triton.runtime.jit import JITFunction

    import onelaunch.kernels as pkg
    names = set()
    for m in pkgutil.iter_modules(pkg.__path__):
        mod = importlib.import_module(f"onelaunch.kernels.{m.name}")
        names |= {n for n, v in vars(mod).items()
                  if isinstance(v, JITFunction) and n.startswith("_") and n.endswith("_kernel")}
    return names


def compile_all(arch: int = ARCH, out=None) -> dict:
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    from onelaunch.specs import get_spec
    driver.set_active(_TargetOnlyDriver(GPUTarget("cuda", arch, 32)))
    compiled = []
    run = JITFunction.run

    def compile_only(self, *args, grid, warmup, **kw):
        k = run(self, *args, grid=grid, warmup=True, **kw)
        compiled.append((self.fn.__name__, k))
        return k

    JITFunction.run = compile_only
    rows = []
    try:
        for name in MODELS:
            spec = get_spec(name)
            for case in CASES:
                for cfg in case(spec):
                    for kname, k in compiled:
                        md = k.metadata
                        rows.append({"model": name, "case": case.__name__[5:], "kernel": kname,
                                     "config": cfg, "arch": md.target.arch, "shared": md.shared,
                                     "num_warps": md.num_warps})
                        if out:
                            print(f"{name:14s} {kname:28s} shared {md.shared:6d} B  {cfg}",
                                  file=out, flush=True)
                    compiled.clear()
    finally:
        JITFunction.run = run     # (the stand-in driver stays: this runs in its own process)
    return {"rows": rows, "kernels": sorted(kernels_in_package()),
            "uncovered": sorted(kernels_in_package() - {r["kernel"] for r in rows})}


# ---- the test -------------------------------------------------------------------------
def test_every_kernel_compiles_for_sm89(tmp_path):
    """Compiled for sm_89 by Triton's compiler (ptxas included): every kernel, every
    configuration of the sm_89 table, shared memory within the 4090's 99 KB."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    out = tmp_path / "sm89.json"
    p = subprocess.run([sys.executable, __file__, str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, f"compiling for sm_89 failed:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}"
    res = json.loads(out.read_text())
    assert not res["uncovered"], f"kernels no case compiles (add one to CASES): {res['uncovered']}"
    assert res["rows"] and all(r["arch"] == ARCH for r in res["rows"])
    over = [r for r in res["rows"] if r["shared"] > SMEM_LIMIT]
    assert not over, f"over the 4090's {SMEM_LIMIT} B of shared memory: {over}"


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        sys.exit("unset TRITON_INTERPRET: this compiles with Triton's compiler")
    sys.path.insert(0, str(ROOT))
    res = compile_all(out=sys.stdout)
    rows = res["rows"]
    worst = max(rows, key=lambda r: r["shared"])
    print(f"{len(rows)} compiles of {len({r['kernel'] for r in rows})} kernels for sm_{ARCH}; "
          f"largest shared memory {worst['shared']} B ({worst['kernel']}, {worst['config']}); "
          f"not compiled: {res['uncovered'] or 'none'}")
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(json.dumps(res, indent=1))
