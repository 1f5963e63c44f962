"""The decode step as data: a list of launches, built from the spec by small block builders.

    plan = embedding(e) + [attention(e, l) + mlp(e, l) for each layer l] + head(e)

(or, with ``e.persistent``, one ``layer_persistent(e, l)`` launch for each layer l)

Each entry is one kernel launch: its op, its layer, the launcher it calls (a function of
``onelaunch.kernels``) with the arguments it passes (the engine's static buffers, the
weights, the launch configuration) and the bytes it must read. So ``len(plan)`` is the
launch count, ``for launch in plan: launch.run()`` is the step (eagerly, or once under a
CUDA-graph capture), ``Engine.trace`` reads the calls without running one, and the
chapters print the plan as a table. A model differs only in the blocks it picks: the
dense MLP (Qwen) or the mixture of experts (OLMoE); attention adds q/k normalisation
where the spec asks for it. Buffers are asked for by name from the engine (``e.buf``) as
the builders need them, so an engine allocates only what its plan uses, and layers share
one activation buffer per name.

This is the shape of Hazy Research's megakernel schedule (a list of instructions per
layer) kept as plain Python: a later persistent kernel can serialise the same list.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from . import kernels as K
from .kernels import config

BF16 = torch.bfloat16
F32 = torch.float32
I32 = torch.int32


@dataclass
class Launch:
    """One launch of the step: ``fn(*args, **kwargs)``, nothing hidden in a closure."""
    op: str                          # the fused op, named for its launcher
    layer: int | None                # None for the embedding and the head
    fn: Callable = field(repr=False)  # the launcher; reads everything on the device
    weight_bytes: int                # weight bytes it must stream per token
    kv_bytes_per_ctx: int = 0        # cache bytes it reads per token of context
    args: tuple = field(default=(), repr=False)        # fn's positional arguments
    kwargs: dict = field(default_factory=dict, repr=False)

    def run(self):
        """Issue the launch."""
        return self.fn(*self.args, **self.kwargs)

    def bytes_at(self, ctx: int) -> int:
        return self.weight_bytes + ctx * self.kv_bytes_per_ctx


def launcher_name(fn) -> str | None:
    """The name of ``fn`` among the launchers of ``onelaunch.kernels`` (``K.LAUNCHERS``),
    or None for anything else (an all-reduce through torch.distributed, the one-launch
    step's Gluon kernel)."""
    return next((n for n, m in K.LAUNCHERS.items() if getattr(m, n, None) is fn), None)


def _nbytes(*ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


# ---- the step's ops, as data -------------------------------------------------------------
# Each block's ops in launch order at TP=1 (under TP the exchanges join them: qk_sumsq,
# all_reduce, residual_add, allreduce_residual, argmax_merge). The block builders below
# issue these ops in this order, and the one-launch step's schedule is built from them
# (``megakernel/stages.py``), so a change here reaches both.
EMBED_OPS = ("embed",)
ATTENTION_OPS = {"plain": ("attention",), "splitk": ("attention_partial", "attention_reduce")}
MLP_OPS = {"dense_mlp": ("rms_gate_up_swiglu", "down_residual"),
           "moe_mlp": ("moe_router", "moe_gate_up_swiglu", "moe_down_residual")}
HEAD_OPS = ("lm_head_argmax",)


def attention_ops(attention: str = "splitk") -> tuple[str, ...]:
    """The attention block's ops for the engine's ``attention`` ("plain" or "splitk")."""
    return ("rms_qkv", "rope_kv_write", *ATTENTION_OPS[attention], "o_proj_residual")


def layer_ops(spec, attention: str = "splitk") -> tuple[str, ...]:
    """One layer's ops in order: the attention block's, then the MLP's the spec picks."""
    return attention_ops(attention) + MLP_OPS["moe_mlp" if spec.is_moe else "dense_mlp"]


def step_ops(spec, attention: str = "splitk") -> list[tuple[int | None, tuple[str, ...]]]:
    """The unfused step's ops as (layer, ops) in order: the embedding's (layer None), each
    layer's, the head's (None); flattened, the plan's ``[L.op for L in plan]`` at TP=1."""
    return ([(None, EMBED_OPS)] + [(li, layer_ops(spec, attention)) for li in range(spec.layers)]
            + [(None, HEAD_OPS)])


# ---- blocks -----------------------------------------------------------------------------
def embedding(e) -> list[Launch]:
    E = e.W["embed"]
    return [Launch("embed", None, K.embed.embed, E.shape[1] * E.element_size(),
                   args=(E, e.x, e.seq, e.pos), kwargs=dict(use_pdl=e.pdl))]


def attention(e, li: int) -> list[Launch]:
    """RMSNorm + QKV (+ bias), (q/k norm +) RoPE + KV write, attention, O + residual: the
    launches of ``attention_ops(e.attention)``."""
    return launches(e, li, attention_ops(e.attention))


def dense_mlp(e, li: int) -> list[Launch]:
    """RMSNorm + gate/up + SwiGLU, then down + residual (split over K, last arrival)."""
    return launches(e, li, MLP_OPS["dense_mlp"])


def launches(e, li: int, ops) -> list[Launch]:
    """Layer ``li``'s launches of ``ops``, in order (each op's maker in ``OP_LAUNCHES``)."""
    return [L for op in ops for L in OP_LAUNCHES[op](e, li)]


def _rms_qkv(e, li: int) -> list[Launch]:
    s, L = e.spec, e.W["layers"][li]
    qkv = e.buf("qkv", (s.qkv_size,))                 # q|k|v before RoPE
    return [Launch("rms_qkv", li, K.rms_qkv.rms_qkv,
                   _nbytes(L["input_norm"], L["w_qkv"], L["b_qkv"]),
                   args=(e.x, L["input_norm"], L["w_qkv"], L["b_qkv"], qkv, s.rms_eps),
                   kwargs=dict(use_pdl=e.pdl, cfg=e.cfg("rms_qkv", L["w_qkv"])))]


def _rope_kv_write(e, li: int) -> list[Launch]:
    """(q/k norm +) RoPE + KV write; under TP the q/k norm's sums of squares meet first."""
    s, L = e.spec, e.W["layers"][li]
    qkv, q = e.buf("qkv", (s.qkv_size,)), e.buf("q", (s.q_size,))     # q: after RoPE
    qn, kn = L.get("q_norm"), L.get("k_norm")
    out, norm = [], {}
    if s.qk_norm and e.tp is not None:            # the RMS spans every rank's heads
        out, ss = qk_sumsq(e, li, qkv)
        norm = dict(ss=ss, q_total=e.tp.full.q_size, k_total=e.tp.full.kv_size)
    return out + [Launch("rope_kv_write", li, K.rope_kv_write.rope_kv_write, _nbytes(qn, kn),
                         args=(qkv, q, e.k_cache[li], e.v_cache[li], e.cos, e.sin, e.pos,
                               s.heads, s.kv_heads, s.head_dim),
                         kwargs=dict(use_pdl=e.pdl, q_norm=qn, k_norm=kn, eps=s.rms_eps,
                                     **norm))]


def _kv_ctx(e, li: int) -> int:                  # cache bytes a token of context
    return 2 * e.spec.kv_heads * e.spec.head_dim * e.k_cache[li].element_size()


def _attention(e, li: int) -> list[Launch]:
    s = e.spec
    q, attn = e.buf("q", (s.q_size,)), e.buf("attn", (s.q_size,))
    return [Launch("attention", li, K.attention.attention, 0, _kv_ctx(e, li),
                   args=(q, e.k_cache[li], e.v_cache[li], attn, e.pos, s.heads, s.kv_heads,
                         s.head_dim, e.cfg("attention")),
                   kwargs=dict(use_pdl=e.pdl))]


def _attention_partial(e, li: int) -> list[Launch]:
    s = e.spec
    pm, pl, po = e.partials()
    return [Launch("attention_partial", li, K.attention_splitk.attention_partial, 0,
                   _kv_ctx(e, li),
                   args=(e.buf("q", (s.q_size,)), e.k_cache[li], e.v_cache[li], e.pos, po, pm,
                         pl, s.heads, s.kv_heads, s.head_dim, e.chunk,
                         e.cfg("attention_splitk")),
                   kwargs=dict(use_pdl=e.pdl, live_cap=e.live_cap))]


def _attention_reduce(e, li: int) -> list[Launch]:
    s = e.spec
    pm, pl, po = e.partials()
    rw = e.cfg("attention_splitk").get("reduce_warps", 4)
    return [Launch("attention_reduce", li, K.attention_splitk.attention_reduce, 0,
                   args=(po, pm, pl, e.buf("attn", (s.q_size,)), e.pos, s.head_dim, e.chunk),
                   kwargs=dict(use_pdl=e.pdl, num_warps=rw, live_cap=e.live_cap))]


def _o_proj_residual(e, li: int) -> list[Launch]:
    L = e.W["layers"][li]
    return into_residual(e, "o_proj_residual", li, _nbytes(L["w_o"]),
                         K.o_proj_residual.o_proj_residual,
                         (e.buf("attn", (e.spec.q_size,)), L["w_o"], e.x),
                         dict(use_pdl=e.pdl, cfg=e.cfg("o_proj_residual", L["w_o"])))


def _rms_gate_up_swiglu(e, li: int) -> list[Launch]:
    s, L = e.spec, e.W["layers"][li]
    return [Launch("rms_gate_up_swiglu", li, K.rms_gate_up_swiglu.rms_gate_up_swiglu,
                   _nbytes(L["post_norm"], L["w_gate_up"]),
                   args=(e.x, L["post_norm"], L["w_gate_up"], e.buf("h", (s.intermediate,)),
                         s.rms_eps),
                   kwargs=dict(use_pdl=e.pdl, cfg=e.cfg("rms_gate_up_swiglu", L["w_gate_up"])))]


def _down_residual(e, li: int) -> list[Launch]:
    s, L = e.spec, e.W["layers"][li]
    h = e.buf("h", (s.intermediate,))
    scratch = e.buf("down_scratch", (16 * s.hidden,), F32)          # [SPLIT_K, N], SPLIT_K <= 16
    counter = e.buf("down_counter", (s.hidden,), I32)
    return into_residual(e, "down_residual", li, _nbytes(L["w_down"]),
                         K.down_residual.down_residual, (h, L["w_down"], e.x, scratch, counter),
                         dict(use_pdl=e.pdl, cfg=e.cfg("down_residual", L["w_down"])))


def layer_persistent(e, li: int) -> list[Launch]:
    """The whole layer in one launch (``kernels/layer_persistent.py``): the phases of
    ``attention`` + ``dense_mlp`` (or ``moe_mlp``: router, experts' gate/up, experts'
    down) separated by grid barriers, in the same buffers. Its bytes are what those
    blocks claim (they are built here for that, never launched)."""
    s, L = e.spec, e.W["layers"][li]
    unfused = attention(e, li) + (moe_mlp(e, li) if s.is_moe else dense_mlp(e, li))
    cfgs = persistent_cfgs(e, li)
    moe = None
    if s.is_moe:                                    # the buffers moe_mlp made, by name
        log = e.buf("expert_log", (e.max_ctx + 1, s.layers, s.top_k), I32)
        moe = dict(logits=e.buf("router_logits", (s.experts,), F32),
                   ids=e.buf("expert_ids", (s.top_k,), I32),
                   weights=e.buf("expert_weights", (s.top_k,), F32), log=log,
                   log_row=log.stride(0), log_offset=li * log.stride(1),
                   h=e.buf("expert_h", (s.top_k, s.intermediate)))
    pm, pl, po = e.partials()
    bar = e.buf("layer_barrier", (2,), I32)                     # arrivals, exits: zeros
    kc, vc = e.k_cache[li], e.v_cache[li]
    # dense only (the MoE phases do not read them)
    h, scratch, counter = ((e.qkv,) * 3 if s.is_moe
                           else (e.h, e.down_scratch, e.down_counter))
    clock = layer_clock(e, li, cfgs)        # None but in a clock measurement
    return [Launch("layer_persistent", li, K.layer_persistent.layer_persistent,
                   sum(u.weight_bytes for u in unfused),
                   sum(u.kv_bytes_per_ctx for u in unfused),
                   args=(e.x, L, e.qkv, e.q, e.attn, h, kc, vc, e.cos, e.sin, e.pos, po, pm,
                         pl, scratch, counter, bar, s.heads, s.kv_heads, s.head_dim,
                         s.rms_eps, e.chunk, cfgs),
                   kwargs=dict(use_pdl=e.pdl, live_cap=e.live_cap, moe=moe, clock=clock,
                               persist=e.persist))]


def layer_clock(e, li: int, cfgs: dict):
    """With ``PersistentOptions(clock=True)`` (a measurement, ``lab/persistent_check.py``,
    ``profile.phase_rows``): layer ``li``'s rows of the int64 buffer [layers, grid,
    2 x phases] where each program of the persistent layer stamps its phases' start and
    end (``measure.profile.clock_phases``)."""
    if not e.persist.clock:
        return None
    LP = K.layer_persistent
    s = e.spec
    P = LP.grid_size(e.device, cfgs["layer_persistent"], e.persist)
    slots = 2 * (LP.LAST_PHASE + 1 + s.is_moe)
    return e.buf("layer_clock", (s.layers, P, slots), torch.int64)[li]


def persistent_cfgs(e, li: int = 0) -> dict:
    """The launch configurations the persistent layer runs: the unfused ops' tiles, all at
    the persistent kernel's num_warps (one kernel has one; a reduction's order can depend
    on it). An engine built with ``cfgs=persistent_cfgs(e)`` runs the same tiles unfused:
    the bit-for-bit reference of the persistent rung."""
    L = e.W["layers"][li]
    c_p = K.layer_persistent.entry(dict(config.get("layer_persistent", e.device),
                                        **e.cfgs.get("layer_persistent", {})),
                                   e.persist)
    mlp = ((("moe_router", L["w_router"]), ("moe_gate_up_swiglu", L["w_experts_gate_up"]),
            ("moe_down_residual", L["w_experts_down"])) if e.spec.is_moe
           else (("rms_gate_up_swiglu", L["w_gate_up"]), ("down_residual", L["w_down"])))
    ops = {op: e.cfg(op, w) for op, w in (("rms_qkv", L["w_qkv"]), ("o_proj_residual", L["w_o"]),
                                           *mlp, ("attention_splitk", None))}
    return persistent_tiles(c_p, ops)


def persistent_tiles(c_p: dict, ops: dict) -> dict:
    """The unfused ops' configs ``ops`` as the persistent kernel ``c_p`` runs them: at its
    num_warps; streamed (STAGES > 0), the GEMVs at its TILE (``BNxBK``, else their own)
    with whole rows for down (SPLIT_K 1)."""
    out = {"layer_persistent": c_p}
    for op, c in ops.items():
        out[op] = dict(c, num_warps=c_p["num_warps"])
        if c_p.get("STAGES") and op != "attention_splitk":
            bn, bk = (int(v) for v in c_p.get("TILE", "0x0").split("x"))
            out[op].update(PREFETCH=1, **({"BLOCK_N": bn, "BLOCK_K": bk} if bn else {}))
            if op == "down_residual":
                out[op]["SPLIT_K"] = 1
    out["attention_splitk"]["reduce_warps"] = c_p["num_warps"]          # the merge too
    return out


def moe_mlp(e, li: int) -> list[Launch]:
    """Router (RMSNorm + GEMV + softmax + top-k), then the chosen experts by id."""
    return launches(e, li, MLP_OPS["moe_mlp"])


def _moe_bufs(e) -> dict:                        # the buffers the MoE ops share
    s = e.spec
    k, E, I, H = s.top_k, s.experts, s.intermediate, s.hidden
    return dict(xn=e.buf("xn", (H,)),                                # rmsnorm(x) * g
                logits=e.buf("router_logits", (E,), F32),
                ids=e.buf("expert_ids", (k,), I32),                  # the router's choice
                wts=e.buf("expert_weights", (k,), F32),
                log=e.buf("expert_log", (e.max_ctx + 1, s.layers, k), I32),  # every position's
                h=e.buf("expert_h", (k, I)))                         # SwiGLU of each slot


def _moe_router(e, li: int) -> list[Launch]:
    s, L, b = e.spec, e.W["layers"][li], _moe_bufs(e)
    rcount = e.buf("router_counter", (1,), I32)
    return [Launch("moe_router", li, K.moe_router.moe_router,
                   _nbytes(L["post_norm"], L["w_router"]),
                   args=(e.x, L["post_norm"], L["w_router"], b["xn"], b["logits"], b["ids"],
                         b["wts"], rcount, e.pos, s.rms_eps),
                   kwargs=dict(log=b["log"], layer=li, use_pdl=e.pdl,
                               cfg=e.cfg("moe_router", L["w_router"])))]


def _moe_gate_up_swiglu(e, li: int) -> list[Launch]:
    s, L, b = e.spec, e.W["layers"][li], _moe_bufs(e)
    w = L["w_experts_gate_up"]
    return [Launch("moe_gate_up_swiglu", li, K.moe_experts.moe_gate_up_swiglu,
                   s.top_k * _nbytes(w[0]), args=(b["xn"], w, b["ids"], b["h"]),
                   kwargs=dict(use_pdl=e.pdl, cfg=e.cfg("moe_gate_up_swiglu", w)))]


def _moe_down_residual(e, li: int) -> list[Launch]:
    s, L, b = e.spec, e.W["layers"][li], _moe_bufs(e)
    w = L["w_experts_down"]
    scratch = e.buf("moe_scratch", (s.top_k * s.hidden,), F32)     # [top_k, H] slot rows
    counter = e.buf("moe_counter", (s.hidden,), I32)
    return into_residual(e, "moe_down_residual", li, s.top_k * _nbytes(w[0]),
                         K.moe_experts.moe_down_residual,
                         (b["h"], w, b["ids"], b["wts"], e.x, scratch, counter),
                         dict(use_pdl=e.pdl, cfg=e.cfg("moe_down_residual", w)))


OP_LAUNCHES = {"rms_qkv": _rms_qkv, "rope_kv_write": _rope_kv_write, "attention": _attention,
               "attention_partial": _attention_partial, "attention_reduce": _attention_reduce,
               "o_proj_residual": _o_proj_residual, "rms_gate_up_swiglu": _rms_gate_up_swiglu,
               "down_residual": _down_residual, "moe_router": _moe_router,
               "moe_gate_up_swiglu": _moe_gate_up_swiglu,
               "moe_down_residual": _moe_down_residual}   # a layer's op -> its launches


def head(e) -> list[Launch]:
    """Final RMSNorm + LM head + argmax; the last program also advances the position.
    Under TP each rank holds a slice of the vocabulary: its best (logit, index) meets the
    other ranks' in the fused merge, or through an all-reduce and ``argmax_merge``."""
    s, W, tp = e.spec, e.W, e.tp
    c = e.cfg("lm_head_argmax", W["lm_head"])
    V = W["lm_head"].shape[0]                          # this rank's rows (all of them at TP=1)
    n_prog = -(-V // c["BLOCK_N"])
    logits = e.buf("logits", (V,), F32)
    val, idx = e.buf("lm_val", (n_prog,), F32), e.buf("lm_idx", (n_prog,), I32)
    counter = e.buf("lm_counter", (1,), I32)
    nbytes = _nbytes(W["norm"], W["lm_head"])
    lm_args = (e.x, W["norm"], W["lm_head"], logits, val, idx, counter, e.seq, e.pos,
               e.prompt_len, s.rms_eps)
    lm_kw = dict(use_pdl=e.pdl, cfg=c, argmax=e.argmax)
    lm_head = lambda **more: Launch("lm_head_argmax", None, K.lm_head_argmax.lm_head_argmax,
                                    nbytes, args=lm_args, kwargs=dict(lm_kw, **more))
    if tp is None or tp.rung == "none":               # none: the rank's own best (timing only)
        return [lm_head()]
    where = dict(vocab_offset=tp.vocab_offset(), rank=tp.rank, world=tp.world)
    if tp.fused or tp.rung == "p2p":
        return [lm_head(peer=tp.site(), **where)]
    keys = tp.buffer(e, "lm_keys", (2 * tp.world,))    # (max, index) per rank, zeros elsewhere
    reduce, sum_args, total = tp.allreduce(e, keys)
    return [lm_head(keys=keys, **where),
            Launch("all_reduce", None, reduce, 0, args=sum_args),
            Launch("argmax_merge", None, K.tp_ops.argmax_merge, 0,
                   args=(total, e.seq, e.pos, e.prompt_len, tp.world),
                   kwargs=dict(use_pdl=e.pdl, argmax=e.argmax))]


# ---- tensor parallelism: where partial sums meet ---------------------------------------
def into_residual(e, op: str, li: int, weight_bytes: int, fn, args: tuple,
                  kwargs: dict) -> list[Launch]:
    """A row-parallel GEMV whose output is added to the residual stream x: the launcher
    ``fn(*args, **kwargs)``; at TP=1 it adds into x itself. Under TP (``e.tp``, see
    ``tp/``) the rung decides: ``fused`` passes a peer call site (the program that
    finishes a row tile exchanges it with the other ranks and adds the sum); the others
    write the rank's fp32 partial (``out=``), all-reduce it (one more launch) and add it
    to x (one more); ``p2p`` exchanges in a launch of its own (``allreduce_residual``).
    An all-reduce launch calls what the group's rung sums with (``tp.Group.allreduce``)."""
    tp = e.tp
    gemv = lambda **more: Launch(op, li, fn, weight_bytes, args=args,
                                 kwargs=dict(kwargs, **more))
    if tp is None or tp.rung == "none":  # none: the rank's partial alone (timing only)
        return [gemv()]
    if tp.fused:
        return [gemv(peer=tp.site())]
    part = tp.buffer(e, "tp_partial", (e.spec.hidden,))
    out = [gemv(out=part)]
    if tp.rung == "p2p":                 # the peer exchange as a launch of its own
        return out + [Launch("allreduce_residual", li, K.tp_ops.allreduce_residual, 0,
                             args=(part, e.x, tp.site()), kwargs=dict(use_pdl=e.pdl))]
    reduce, sum_args, total = tp.allreduce(e, part)
    return out + [Launch("all_reduce", li, reduce, 0, args=sum_args),
                  Launch("residual_add", li, K.tp_ops.residual_add, 0,
                         args=(total, e.x), kwargs=dict(use_pdl=e.pdl))]


def qk_sumsq(e, li: int, qkv) -> tuple[list[Launch], torch.Tensor]:
    """OLMoE under TP: q/k RMSNorm spans all heads, so the ranks' sums of squares of q and
    k are added first (2 floats; fused: inside the same launch)."""
    s, tp = e.spec, e.tp
    if tp.rung in ("fused", "p2p", "none"):           # none: the rank's own sums (timing only)
        ss = e.buf("qk_ss", (2,), F32)
        peer = {} if tp.rung == "none" else {"peer": tp.site()}
        return [Launch("qk_sumsq", li, K.tp_ops.qk_sumsq, 0,
                       args=(qkv, ss, s.q_size, s.kv_size),
                       kwargs=dict(use_pdl=e.pdl, **peer))], ss
    ss = tp.buffer(e, "qk_ss", (2,))
    reduce, sum_args, total = tp.allreduce(e, ss)
    return [Launch("qk_sumsq", li, K.tp_ops.qk_sumsq, 0,
                   args=(qkv, ss, s.q_size, s.kv_size), kwargs=dict(use_pdl=e.pdl)),
            Launch("all_reduce", li, reduce, 0, args=sum_args)], total


def build(e) -> list[Launch]:
    """The whole step for engine ``e``: the blocks its spec picks, in order."""
    mlp = moe_mlp if e.spec.is_moe else dense_mlp
    plan = embedding(e)
    for li in range(e.spec.layers):
        if getattr(e, "persistent", False):
            plan += layer_persistent(e, li)
        else:
            plan += attention(e, li) + mlp(e, li)
    return plan + head(e)


# ---- reading a plan ---------------------------------------------------------------------
def table(plan: list[Launch], ctx: int = 0) -> list[dict]:
    """One row per op: launches per step and bytes read per step at context ``ctx``."""
    rows: dict[str, dict] = {}
    for L in plan:
        r = rows.setdefault(L.op, {"op": L.op, "launches": 0, "bytes": 0})
        r["launches"] += 1
        r["bytes"] += L.bytes_at(ctx)
    return list(rows.values())


def bytes_per_step(plan: list[Launch], ctx: int = 0) -> int:
    return sum(L.bytes_at(ctx) for L in plan)


def weight_shape(spec, op: str) -> tuple[int, int]:
    """(N, K) of the weight GEMV ``op`` reads in one layer (one expert's for the MoE
    ops): the shape its launch configuration is keyed by (``kernels/tuned.py``)."""
    s = spec
    return {"rms_qkv": (s.qkv_size, s.hidden), "o_proj_residual": (s.hidden, s.q_size),
            "rms_gate_up_swiglu": (2 * s.intermediate, s.hidden),
            "down_residual": (s.hidden, s.intermediate),
            "lm_head_argmax": (s.vocab, s.hidden), "moe_router": (s.experts, s.hidden),
            "moe_gate_up_swiglu": (2 * s.intermediate, s.hidden),
            "moe_down_residual": (s.hidden, s.intermediate)}[op]


def default_cfg(op: str, device, weight: torch.Tensor | None = None) -> dict:
    shape = None if weight is None else tuple(weight.shape[-2:])
    return config.get(op, device, shape)
