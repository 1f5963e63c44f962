"""The host side of the one-launch step (``gluon_step.py`` is its device code): the
schedule it runs, the weights stacked one tensor a kind with their TMA descriptors, the
buffers it shares with an ``Engine`` (x, the caches, seq, pos, argmax), one launch, the
stall check and the per-instruction clock; and a compile for sm_90 that needs no GPU.

    e = Engine(spec, weights, pdl=True)
    mk = MegaStep(e)                          # plans at ctx 512 on every SM
    e.plan = [mk.launch()]                    # the engine's step is now one launch
    e.teacher_forced(prompt, forced)          # graph capture, replays: as before

    python -m onelaunch.megakernel.step --aot      # any machine: compile for sm_90
    python -m onelaunch.megakernel.step --aot --model olmoe-1b-7b    # the MoE kernel

A mixture of experts (OLMoE) runs ``gluon_moe.moe_step_kernel`` (the dense kernel is
left as it was): the "four" attention (its RoPE holds the q/k norm), the router, the
top-k, the experts addressed by the router's ids (stacked [layers * experts, ...], one
TMA descriptor a kind), a ring of MOE_STAGES stages and HOLD_STAGES held ones.
"""
from __future__ import annotations

import argparse
import sys

import torch
import triton
from triton.experimental.gluon import language as gl

from . import isa, schedule
from .gluon_moe import moe_step_kernel
from .gluon_step import step_kernel
from .mlp_stream import (KB, TK, TN, box_view, compile_sm90, down_boxes, gate_up_boxes,
                         raise_on_stall, smem_layout)

ERR = 4                    # err[pid] = (instruction + 1, counter, value seen, target)
BT = 16                    # keys an attention partial takes a block
SB = 64                    # splits a merge takes a chunk
SBF = 16                   # splits a fused merge takes a chunk (all G heads at once)
EB = 1024                  # columns an embedding copy takes a block
TIMEOUT_NS = 200_000_000   # a counter wait's bound: 0.2 s
ATT_STAGES = {"four": 4, "three": 3, "two": 2}    # the kernel's ATT: stages after QKV
ATTENTION = "three"        # the engine's form of the attention (measured: NOTES 31)
POLL = 1                   # a counter wait polls: 0 by one thread's acquire load broadcast
                           # to the CTA, 1 by every thread's own (NOTES 34)
STAGES = 6                 # the ring's shared-memory stages, each two [TN, KB, TK] boxes
MOE_STAGES = 5             # the MoE kernel's ring (its h and held stages share the memory)
HOLD_STAGES = 1            # the MoE kernel's held stages (the loader's hoist before its wait)
MOE_ATTENTION = "four"     # the q/k norm is in ROPE_KV: the MoE step's attention form
QSB = 128                  # QKV blocks' q/k squares a RoPE sums a chunk
SMEM_MAX = 232448          # an sm_90 CTA's shared memory (227 KB)


def device_refusal(device) -> str | None:
    """Why the one-launch step cannot run on ``device`` (None: it can): it needs
    Hopper's TMA and warp specialisation (sm_90)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return ("the one-launch step is a Gluon kernel for a Hopper GPU (sm_90); it does "
                "not run in Triton's interpreter: use megakernel=False on the CPU")
    cap = torch.cuda.get_device_capability(device)
    if cap[0] != 9:
        return (f"the one-launch step needs Hopper (sm_90: TMA, warp specialisation); this "
                f"GPU is sm_{cap[0]}{cap[1]}: the chain of kernels runs here "
                f"(megakernel=False)")
    return None


def refusal(spec, max_ctx: int | None = None) -> str | None:
    """Why the one-launch step cannot run ``spec`` (with a cache of ``max_ctx``
    positions; None: it can)."""
    if spec.is_moe:
        why = moe_refusal(spec)
        if why:
            return why
    elif spec.qk_norm:
        return "the one-launch step has no q/k norm for dense models yet"
    if spec.hidden % TK or spec.intermediate % TK or spec.hidden > KB * TK:
        return (f"the one-launch step needs hidden and intermediate in whole {TK}-column "
                f"tiles, hidden at most {KB * TK}")
    if spec.q_size != spec.hidden:
        return "the one-launch step's O projection needs heads x head_dim == hidden"
    if spec.head_dim & (spec.head_dim - 1):
        return "the one-launch step needs a power-of-two head_dim"
    if spec.vocab % TN or spec.qkv_size % TN:
        return f"the one-launch step needs the vocabulary and QKV rows in whole {TN}-row tiles"
    if max_ctx and spec.layers * spec.kv_heads * max_ctx * spec.head_dim >= 2 ** 31:
        return ("the one-launch step indexes the KV cache with 32-bit offsets: build the "
                f"engine with max_ctx < {2 ** 31 // (spec.layers * spec.kv_heads * spec.head_dim)}")
    return None


def moe_refusal(spec) -> str | None:
    """Why the MoE kernel cannot run ``spec`` (None: it can), past the dense checks."""
    if not spec.qk_norm or spec.qkv_bias:
        return ("the one-launch MoE step is OLMoE's: its RoPE holds the q/k norm, its QKV "
                "has no bias")
    ke = spec.intermediate // TK
    if spec.intermediate % TK or ke & (ke - 1) or not 4 <= ke <= 2 * KB:
        return (f"the one-launch MoE step takes an expert's down rows in one box: "
                f"intermediate a power of two of {TK}-column tiles, 4 to {2 * KB} of them")
    if spec.top_k * ke % 4:
        return "the one-launch MoE step stages h 4 tiles a time: top_k x tiles a multiple of 4"
    if moe_smem(spec) > SMEM_MAX:
        return (f"the one-launch MoE step needs {moe_smem(spec)} bytes of shared memory, "
                f"more than sm_90's {SMEM_MAX}")
    return None


def moe_smem(spec, stages: int = MOE_STAGES, hold: int = HOLD_STAGES) -> int:
    """The MoE kernel's shared memory: its ring and held stages, every slot's h (bf16)
    and the barriers."""
    return ring_bytes(stages + hold) + spec.top_k * spec.intermediate * 2 + 16 * (stages + hold)


def plan_schedule(spec, P: int, ctx: int, attention: str | None = None) -> schedule.Schedule:
    """The lists the kernel runs (and the VM checks): ``schedule.build`` with the
    kernel's tiles (TN rows), planned at ``ctx`` or at least ``plan_ctx`` (every split SM
    pair gets MIN_UNIT keys, so a short context gives each split one block of keys); the
    kernel's down projection takes all of K an instruction, so it must not be split.
    ``attention``: the attention's form (``schedule.FORMS``: "four" stages a layer
    after QKV, "three" with RoPE inside the partials, "two" with the merge too; None:
    ATTENTION, or MOE_ATTENTION for an MoE spec). An MoE's expert down must take every
    slot an instruction (one group) and a loader's hoist must fit its held stages."""
    attention = attention or (MOE_ATTENTION if spec.is_moe else ATTENTION)
    # MoE: a loader holds HOLD_STAGES whole stages, each a GEMV pair of 2 x hidden / TK
    # of the VM's tiles, so the lists' HOIST counts those (``loads.stream`` = the kernel's)
    hold = dict(hold=HOLD_STAGES * 2 * (spec.hidden // TK)) if spec.is_moe else {}
    sched = schedule.build(spec, P, max(ctx, plan_ctx(spec, P)), tile_n=TN, tile_k=TK,
                           attention=attention, **hold)
    rows = sched.instr.view(-1, isa.WIDTH)
    down = rows[rows[:, isa.OP] == isa.OP_DOWN]
    if (down[:, isa.KLEN] != spec.intermediate).any():
        raise schedule.ScheduleError("the one-launch kernel's down takes all of K")
    edown = rows[rows[:, isa.OP] == isa.OP_EXPERT_DOWN]
    if (edown[:, isa.SPLITS] != 1).any():
        raise schedule.ScheduleError("the one-launch kernel's expert down takes every slot "
                                     "an instruction (one group)")
    if sched.hold * TN * TK > HOLD_STAGES * 2 * TN * KB * TK:
        raise schedule.ScheduleError(f"a hoist of {sched.hold} tiles does not fit "
                                     f"{HOLD_STAGES} held stages")
    return sched


def ring_bytes(stages: int = STAGES) -> int:
    """An SM's ring of weight tiles in shared memory (``gluon_step``'s ``ring``):
    ``stages`` stages of two [TN, KB, TK] bf16 boxes."""
    return 2 * stages * TN * KB * TK * 2


def plan_ctx(spec, P: int) -> int:
    """The shortest context the schedule is planned at: every (kv head, split) pair of
    the P SMs gets a split of MIN_UNIT keys."""
    return schedule.MIN_UNIT * (P // spec.kv_heads)


def stacked(W: dict, key: str) -> torch.Tensor:
    """The layers' ``key`` weights as one [L * rows, K] tensor (a copy); the experts'
    [E, rows, K] as [L * E * rows, K] (row (l * E + expert) * rows + r)."""
    t = torch.cat([L[key] for L in W["layers"]])
    return t.reshape(-1, t.shape[-1]).contiguous()


class MegaStep:
    """One decode step of an engine's model as one persistent launch over its buffers
    (a dense model: ``gluon_step``; an MoE: ``gluon_moe``, its ids also into the
    engine's ``expert_log``); ``run()`` launches it (it reads seq/pos and writes
    argmax/seq/pos as the chain's last kernel does). ``stages`` and ``attention``: None
    picks STAGES and ATTENTION, or MOE_STAGES and MOE_ATTENTION for an MoE. An MoE's
    expert weights are copied once, stacked over layers (the engine keeps its own)."""

    def __init__(self, engine, P: int | None = None, ctx: int = 512, stages: int | None = None,
                 num_warps: int = 4, timeout_ns: int = TIMEOUT_NS, clock: bool = False,
                 attention: str | None = None, poll: int = POLL, bt: int | None = None):
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
        e, s = engine, engine.spec
        why = refusal(s)
        if why:
            raise ValueError(why)
        dev = e.device
        self.moe = s.is_moe
        stages = stages or (MOE_STAGES if self.moe else STAGES)
        attention = attention or (MOE_ATTENTION if self.moe else ATTENTION)
        self.P = P or torch.cuda.get_device_properties(dev).multi_processor_count
        self.sched = plan_schedule(s, self.P, ctx, attention)
        self.prog = self.sched.instr.to(dev)
        self.n_instr = self.prog.shape[1]
        self.n_ctr = len(self.sched.counters)
        self.e, self.stages, self.num_warps, self.timeout_ns = e, stages, num_warps, timeout_ns
        self.clock, self.attention, self.poll = clock, attention, poll
        self.bt = bt or BT      # an MoE's: 32 and 64 measured slower (NOTES 38)
        W = e.W
        if self.moe:
            self._moe_init(W, dev)
            return
        self.w = {"qkv": stacked(W, "w_qkv"), "o": stacked(W, "w_o"),
                  "gu": stacked(W, "w_gate_up"), "dn": stacked(W, "w_down")}
        self.g_in = torch.stack([L["input_norm"] for L in W["layers"]]).contiguous()
        self.g_post = torch.stack([L["post_norm"] for L in W["layers"]]).contiguous()
        self.b_qkv = (torch.cat([L["b_qkv"] for L in W["layers"]]).contiguous()
                      if s.qkv_bias else self.g_in)          # unread without a bias
        lay = smem_layout()
        box = lambda t, kb: TensorDescriptor.from_tensor(box_view(t), [TN, kb, TK], lay)
        self.kg, self.gt = gate_up_boxes(s.hidden // TK, KB)
        self.nf, self.tail = down_boxes(s.intermediate // TK, 2 * KB, True, num_warps)
        self.d = [box(self.w["qkv"], KB), box(self.w["o"], KB), box(self.w["gu"], KB),
                  box(self.w["dn"], 2 * KB), box(self.w["dn"], self.tail or 2 * KB),
                  box(W["lm_head"], KB)]
        rows = self.sched.instr.view(-1, isa.WIDTH)
        part = torch.isin(rows[:, isa.OP], torch.tensor([isa.OP_ATTN_PARTIAL, isa.OP_ATTN_FUSED]))
        self.spmax = splits = int(rows[part, isa.SPLITS].max())
        f32 = torch.float32
        z = lambda *shape, dt=torch.bfloat16: torch.zeros(shape, dtype=dt, device=dev)
        self.qkv, self.q, self.attn = z(s.qkv_size), z(s.q_size), z(s.q_size)
        self.h = z(s.intermediate)
        self.part_m = z(s.heads, splits, dt=f32)
        self.part_l = z(s.heads, splits, dt=f32)
        self.part_o = z(s.heads, splits, s.head_dim, dt=f32)
        self.lm_val, self.lm_idx = z(self.P, dt=f32), z(self.P, dt=torch.int32)
        self.ctr = z(self.n_ctr + 1, dt=torch.int32)
        self.err = z(self.P, ERR, dt=torch.int32)
        # per instruction: start, counters in, end (globaltimer ns), and when the loader
        # asked for its last weight tile (0: an instruction with no tiles)
        self.clk = z(self.P, self.n_instr, 4, dt=torch.int64)

    def _moe_init(self, W, dev):
        """The MoE kernel's weights (the experts stacked over layers, addressed by id),
        descriptors and buffers."""
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
        s = self.e.spec
        self.w = {"qkv": stacked(W, "w_qkv"), "o": stacked(W, "w_o"),
                  "rt": stacked(W, "w_router"), "egu": stacked(W, "w_experts_gate_up"),
                  "edn": stacked(W, "w_experts_down")}
        self.g_in = torch.stack([L["input_norm"] for L in W["layers"]]).contiguous()
        self.g_post = torch.stack([L["post_norm"] for L in W["layers"]]).contiguous()
        self.q_norm = torch.stack([L["q_norm"] for L in W["layers"]]).contiguous()
        self.k_norm = torch.stack([L["k_norm"] for L in W["layers"]]).contiguous()
        lay = smem_layout()
        box = lambda t, kb: TensorDescriptor.from_tensor(box_view(t), [TN, kb, TK], lay)
        self.kg, self.gt = gate_up_boxes(s.hidden // TK, KB)
        self.nf = self.tail = 0
        self.ke = s.intermediate // TK
        self.d = [box(self.w["qkv"], KB), box(self.w["o"], KB), box(self.w["rt"], KB),
                  box(self.w["egu"], KB), box(self.w["edn"], self.ke), box(W["lm_head"], KB)]
        kv = lambda t: TensorDescriptor.from_tensor(t.view(-1, s.head_dim),
                                                    [kv_keys(s), s.head_dim], kv_layout())
        self.d += [kv(self.e.k_cache), kv(self.e.v_cache)]
        rows = self.sched.instr.view(-1, isa.WIDTH)
        self.spmax = splits = int(rows[rows[:, isa.OP] == isa.OP_ATTN_PARTIAL, isa.SPLITS].max())
        n_qkv = int(((rows[:, isa.OP] == isa.OP_RMS_QKV) & (rows[:, isa.LAYER] == 0)).sum())
        f32, i32 = torch.float32, torch.int32
        z = lambda *shape, dt=torch.bfloat16: torch.zeros(shape, dtype=dt, device=dev)
        self.qkv, self.q, self.attn = z(s.qkv_size), z(s.q_size), z(s.q_size)
        self.h = z(s.top_k * s.intermediate)                  # per (slot, row)
        self.part_m = z(s.heads, splits, dt=f32)
        self.part_l = z(s.heads, splits, dt=f32)
        self.part_o = z(s.heads, splits, s.head_dim, dt=f32)
        self.qk_ss = z(n_qkv, 2, dt=f32)                      # the QKV blocks' squares
        self.router_logits = z(s.experts, dt=f32)
        self.route_ids = z(s.layers, s.top_k, dt=i32)         # per layer: never reused
        self.route_w = z(s.layers, s.top_k, dt=f32)
        # every step's ids at row pos, in the engine's log as the chain's router writes it
        shape = (self.e.max_ctx + 1, s.layers, s.top_k)
        self.expert_log = (self.e.buf("expert_log", shape, i32) if hasattr(self.e, "buf")
                           else z(*shape, dt=i32))
        self.lm_val, self.lm_idx = z(self.P, dt=f32), z(self.P, dt=i32)
        self.ctr = z(self.n_ctr + 1, dt=i32)
        self.err = z(2 * self.P, ERR, dt=i32)                 # computes', then loaders' rows
        self.clk = z(self.P, self.n_instr, 4, dt=torch.int64)

    def weight_bytes(self) -> int:
        """The weight bytes a step reads (MoE: the top-k experts of each layer)."""
        W, s = self.e.W, self.e.spec
        lm = W["lm_head"].numel() * W["lm_head"].element_size()
        if self.moe:
            dense = sum(self.w[k].numel() * self.w[k].element_size() for k in ("qkv", "o", "rt"))
            return dense + lm + s.layers * s.top_k * 3 * s.intermediate * s.hidden * 2
        return sum(t.numel() * t.element_size() for t in self.w.values()) + lm

    def run(self):
        e, s = self.e, self.e.spec
        if self.moe:
            moe_step_kernel[(self.P,)](
                self.prog, self.n_instr, *self.d, e.x, self.qkv, self.q, self.attn, self.h,
                e.k_cache, e.v_cache, e.cos, e.sin, self.part_m, self.part_l, self.part_o,
                self.lm_val, self.lm_idx, e.seq, e.argmax, e.pos, e.prompt_len,
                e.W["embed"], self.g_in, self.g_post, e.W["norm"], self.q_norm, self.k_norm,
                self.qk_ss, self.router_logits, self.route_ids, self.route_w,
                self.expert_log, self.ctr,
                self.err, self.clk, s.layers, s.hidden, s.intermediate, s.qkv_size, s.q_size,
                s.kv_size, s.vocab, s.experts, self.spmax, e.max_ctx, s.rms_eps,
                s.head_dim ** -0.5, self.timeout_ns, self.n_ctr, **self.constexprs())
            return
        step_kernel[(self.P,)](
            self.prog, self.n_instr, *self.d, e.x, self.qkv, self.q, self.attn, self.h,
            e.k_cache, e.v_cache, e.cos, e.sin, self.part_m, self.part_l, self.part_o,
            self.lm_val, self.lm_idx, e.seq, e.argmax, e.pos, e.prompt_len, e.W["embed"],
            self.g_in, self.g_post, e.W["norm"], self.b_qkv, self.ctr, self.err, self.clk,
            s.layers, s.hidden, s.intermediate, s.qkv_size, s.q_size, s.kv_size, s.vocab,
            self.spmax, e.max_ctx, s.rms_eps, s.head_dim ** -0.5, self.timeout_ns, self.n_ctr,
            **self.constexprs())

    def constexprs(self) -> dict:
        s = self.e.spec
        if self.moe:
            return moe_constexprs(s, self.P, self.n_ctr, self.stages, self.num_warps,
                                  self.clock, self.kg, self.gt, self.poll, self.bt)
        return constexprs(s, self.P, self.n_ctr, self.stages, self.num_warps, self.clock,
                          self.kg, self.gt, self.nf, self.tail, self.attention, self.poll)

    def launch(self):
        """This step as the engine plan's one entry."""
        from ..plan import Launch
        s = self.e.spec
        kv = 2 * s.kv_heads * s.head_dim * self.e.k_cache.element_size() * s.layers
        return Launch("megakernel", None, self.run, self.weight_bytes(), kv)

    def check_stalls(self):
        """Raise, naming the SM and counter, if any wait timed out (MoE: the loaders'
        waits on the router's counters too, their rows after the computes')."""
        P = self.sched.P
        raise_on_stall(self.err[:P], self.sched.counters)
        if self.err.shape[0] > P:
            try:
                raise_on_stall(self.err[P:], self.sched.counters)
            except RuntimeError as ex:
                raise RuntimeError(str(ex).replace("stalled: SM", "stalled: the loader of SM",
                                                   1)) from None


def constexprs(s, P, n_ctr, stages, num_warps, clock, kg, gt, nf, tail, attention,
               poll=POLL) -> dict:
    if poll not in (0, 1):
        raise ValueError(f"poll {poll!r}: 0 or 1")
    g = s.heads // s.kv_heads
    return dict(KB_=KB, KG=kg, GT=gt, NF=nf, TAIL=tail, STAGES=stages, WIDTH=isa.WIDTH, G=g,
                GP=triton.next_power_of_2(g), D=s.head_dim, HKV=s.kv_heads, BT=BT, SB=SB,
                SBF=SBF, NPB=triton.next_power_of_2(P), EB=EB, BIAS=int(s.qkv_bias),
                ATT=ATT_STAGES[attention],
                CTR_BLOCK=triton.next_power_of_2(n_ctr + 1),
                CLOCK=int(clock), POLL=int(poll), num_warps=num_warps)


def kv_layout():
    """A K or V box of the MoE kernel's ring: [keys, head_dim] unswizzled, as the weights'."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=2)


def kv_keys(s) -> int:
    """Keys a K box holds: a ring stage (two boxes) is a K box and a V box."""
    return TN * KB * TK // s.head_dim


def moe_constexprs(s, P, n_ctr, stages, num_warps, clock, kg, gt, poll=POLL,
                   bt=BT) -> dict:
    if poll not in (0, 1):
        raise ValueError(f"poll {poll!r}: 0 or 1")
    g = s.heads // s.kv_heads
    return dict(KB_=KB, KG=kg, GT=gt, KE=s.intermediate // TK, TOPK=s.top_k,
                EP=triton.next_power_of_2(s.experts), QSB=QSB, STAGES=stages,
                HOLD=HOLD_STAGES, WIDTH=isa.WIDTH, G=g, GP=triton.next_power_of_2(g),
                D=s.head_dim, HKV=s.kv_heads, BT=bt, SB=SB, NPB=triton.next_power_of_2(P),
                EB=EB, CTR_BLOCK=triton.next_power_of_2(n_ctr + 1), CLOCK=int(clock),
                POLL=int(poll), num_warps=num_warps)


def aot_moe(s, P: int = 132, stages: int | None = None, num_warps: int = 4,
            poll: int = POLL, bt: int = BT) -> dict:
    """The MoE kernel (``gluon_moe``) for sm_90 on any machine: layouts, TMA, barriers."""
    stages = stages or MOE_STAGES
    lay = smem_layout()
    kg, gt = gate_up_boxes(s.hidden // TK, KB)
    desc = lambda kb: f"tensordesc<bf16[{TN},{kb},{TK}],{lay!r}>"
    kvd = f"tensordesc<bf16[{kv_keys(s)},{s.head_dim}],{kv_layout()!r}>"
    ptrs = dict(prog_ptr="*i32", n_instr="i32", d_qkv=desc(KB), d_o=desc(KB), d_rt=desc(KB),
                d_egu=desc(KB), d_edn=desc(s.intermediate // TK), d_lm=desc(KB), d_kc=kvd,
                d_vc=kvd)
    for name in ("x", "qkv", "q", "attn", "h", "kc", "vc", "cos", "sin"):
        ptrs[f"{name}_ptr"] = "*bf16"
    for name in ("pm", "pl", "po", "val"):
        ptrs[f"{name}_ptr"] = "*fp32"
    for name in ("idx", "seq", "amax", "pos", "plen"):
        ptrs[f"{name}_ptr"] = "*i32"
    for name in ("emb", "gin", "gpost", "gfin", "qn", "kn"):
        ptrs[f"{name}_ptr"] = "*bf16"
    ptrs.update(ss_ptr="*fp32", rl_ptr="*fp32", ids_ptr="*i32", rw_ptr="*fp32",
                log_ptr="*i32")
    ptrs.update(ctr_ptr="*i32", err_ptr="*i32", clk_ptr="*i64")
    ptrs.update({k: "i32" for k in ("L", "H", "I", "QKV", "HQ", "KVS", "V", "E", "SPMAX",
                                    "MAXCTX")})
    ptrs.update(eps="fp32", scale="fp32", timeout_ns="i64", n_ctr="i32")
    n_ctr = len(plan_schedule(s, P, 512).counters)
    consts = moe_constexprs(s, P, n_ctr, stages, num_warps, True, kg, gt, poll, bt)
    sig = dict(ptrs, **{k: "constexpr" for k in consts})
    aligned = [i for i, v in enumerate(ptrs.values()) if v.startswith("*")]
    return compile_sm90(moe_step_kernel, sig, consts, aligned, num_warps)


def aot(spec_name: str = "qwen2.5-1.5b", P: int = 132, stages: int | None = None,
        num_warps: int = 4, attention: str = ATTENTION, poll: int = POLL) -> dict:
    """Compile for sm_90 on any machine (no GPU): the layouts, TMA and barriers hold
    (an MoE spec: the MoE kernel, its one attention form; ``attention`` is unused)."""
    from ..specs import get_spec
    s = get_spec(spec_name)
    if s.is_moe:
        return aot_moe(s, P, stages, num_warps, poll)
    stages = stages or STAGES
    lay = smem_layout()
    kg, gt = gate_up_boxes(s.hidden // TK, KB)
    nf, tail = down_boxes(s.intermediate // TK, 2 * KB, True, num_warps)
    desc = lambda kb: f"tensordesc<bf16[{TN},{kb},{TK}],{lay!r}>"
    ptrs = dict(prog_ptr="*i32", n_instr="i32", d_qkv=desc(KB), d_o=desc(KB), d_gu=desc(KB),
                d_dn=desc(2 * KB), d_dt=desc(tail or 2 * KB), d_lm=desc(KB))
    for name in ("x", "qkv", "q", "attn", "h", "kc", "vc", "cos", "sin"):
        ptrs[f"{name}_ptr"] = "*bf16"
    for name in ("pm", "pl", "po", "val"):
        ptrs[f"{name}_ptr"] = "*fp32"
    for name in ("idx", "seq", "amax", "pos", "plen"):
        ptrs[f"{name}_ptr"] = "*i32"
    for name in ("emb", "gin", "gpost", "gfin", "bqkv"):
        ptrs[f"{name}_ptr"] = "*bf16"
    ptrs.update(ctr_ptr="*i32", err_ptr="*i32", clk_ptr="*i64")
    ptrs.update({k: "i32" for k in ("L", "H", "I", "QKV", "HQ", "KVS", "V", "SPMAX",
                                    "MAXCTX")})
    ptrs.update(eps="fp32", scale="fp32", timeout_ns="i64", n_ctr="i32")
    n_ctr = len(plan_schedule(s, P, 512, attention).counters)
    consts = constexprs(s, P, n_ctr, stages, num_warps, True, kg, gt, nf, tail, attention,
                        poll)
    sig = dict(ptrs, **{k: "constexpr" for k in consts})
    aligned = [i for i, v in enumerate(ptrs.values()) if v.startswith("*")]
    return compile_sm90(step_kernel, sig, consts, aligned, num_warps)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m onelaunch.megakernel.step",
                                 description="compile the one-launch step for sm_90 (no GPU)")
    ap.add_argument("--aot", action="store_true", required=True)
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
    a = ap.parse_args(argv)
    from ..specs import get_spec
    moe = get_spec(a.model).is_moe
    default = MOE_STAGES if moe else STAGES
    forms = [MOE_ATTENTION] if moe else a.attention.split(",")
    for st in (int(v) for v in (a.stages or str(default)).split(",")):
        for f in forms:
            for pl in (int(v) for v in a.poll.split(",")):
                print(f"[{'gluon_moe' if moe else 'gluon_step'}] sm_90 STAGES {st} "
                      f"attention {f} poll {pl}: "
                      f"{aot(a.model, stages=st, attention=f, poll=pl)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
