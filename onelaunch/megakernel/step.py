"""The host side of the one-launch step (device code: ``gluon/dense.py``, ``gluon/moe.py``):
the schedule it runs, the weights stacked one tensor a kind with their TMA descriptors,
the buffers it shares with an ``Engine`` (x, the caches, seq, pos, argmax), one launch,
the stall check and the per-instruction clock. ``aot.py`` compiles it for sm_90 without
a GPU.

    e = Engine(spec, weights, pdl=True)
    mk = MegaStep(e)                          # plans at ctx 512 on every SM
    e.plan = [mk.launch()]                    # the engine's step is now one launch
    e.teacher_forced(prompt, forced)          # graph capture, replays: as before

``MegaStep(engine)`` is a ``DenseStep`` for a dense model and an ``MoEStep`` for a
mixture of experts (OLMoE: the "four" attention, whose RoPE holds the q/k norm, the
router, the top-k, the experts addressed by the router's ids, stacked [layers * experts,
...] one TMA descriptor a kind, a ring of MOE_STAGES stages and HOLD_STAGES held ones).
"""
from __future__ import annotations

import torch
import triton

from . import isa, l2stage, schedule
from .boxes import KB, TK, TN, box_view, down_boxes, gate_up_boxes, smem_layout
from .gluon.args import (Acts, Cache, Consts, Gains, MoEConsts, MoEGains, MoESizes,
                         Partials, Route, Sizes, Sync, Token)
from .gluon.dense import step_kernel
from .gluon.moe import moe_step_kernel

ERR = 4                    # err[pid] = (instruction + 1, counter, value seen, target)
BT = 16                    # keys an attention partial takes a block
SB = 64                    # splits a merge takes a chunk
SBF = 16                   # splits a fused merge takes a chunk (all G heads at once)
EB = 1024                  # columns an embedding copy takes a block
TIMEOUT_NS = 200_000_000   # a counter wait's bound: 0.2 s
ATT_STAGES = {"four": 4, "three": 3, "two": 2}    # the kernel's ATT: stages after QKV
ATTENTION = "three"        # the engine's form of the attention: 1.301 ms a token at ctx
                           # 512 against "four"'s 1.327 (v10_512.json)
POLL = 1                   # a counter wait polls: 0 by one thread's acquire load broadcast
                           # to the CTA, 1 by every thread's own (both timed: s16a.json)
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
    """An SM's ring of weight tiles in shared memory (``gluon/dense.py``'s ``ring``):
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


def per_layer(W: dict, key: str) -> torch.Tensor:
    """The layers' ``key`` vectors (a norm's gains) as one [L, n] tensor."""
    return torch.stack([L[key] for L in W["layers"]]).contiguous()


def raise_on_stall(err: torch.Tensor, names=None) -> None:
    """Raise in one line if a kernel's ``err`` ([P, 4]: instruction + 1, counter, value
    seen, target) records a wait that timed out: the first stalled SM, its instruction
    and counter (``names``: the counters' names), and how many SMs stalled."""
    e = err.cpu()
    bad = (e[:, 0] > 0).nonzero().flatten().tolist()
    if bad:
        p = bad[0]
        i, c, v, t = e[p].tolist()
        name = f"{names[c]}: " if names is not None and 0 <= c < len(names) else ""
        raise RuntimeError(f"megakernel stalled: SM {p} instruction {i - 1} waited on "
                           f"counter {c} ({name}saw {v}, needs {t}); {len(bad)} SMs stalled")


def check_poll(poll) -> None:
    if poll not in (0, 1):
        raise ValueError(f"poll {poll!r}: 0 or 1")


class MegaStep:
    """One decode step of an engine's model as one persistent launch over its buffers;
    ``run()`` launches it (it reads seq/pos and writes argmax/seq/pos as the chain's last
    kernel does). ``MegaStep(engine, ...)`` builds the subclass for the engine's model:
    ``DenseStep`` or ``MoEStep``. ``stages`` and ``attention``: None picks the
    subclass's STAGES and ATTENTION. ``l2_prefetch_mb`` (a dense model's; 0: off): MB a
    layer of the next gate/up the loaders ask the L2 for while they wait on a full ring
    in the attention (``l2stage.py``), under an evict-last policy with
    ``l2_evict_last``."""
    moe = False
    STAGES = STAGES
    ATTENTION = ATTENTION

    def __new__(cls, engine, *args, **kwargs):
        if cls is MegaStep:
            cls = MoEStep if engine.spec.is_moe else DenseStep
        return super().__new__(cls)

    def __init__(self, engine, P: int | None = None, ctx: int = 512, stages: int | None = None,
                 num_warps: int = 4, timeout_ns: int = TIMEOUT_NS, clock: bool = False,
                 attention: str | None = None, poll: int = POLL, bt: int | None = None,
                 l2_prefetch_mb: float = 0, l2_evict_last: bool = False):
        e, s = engine, engine.spec
        why = refusal(s)
        if why:
            raise ValueError(why)
        self.P = P or torch.cuda.get_device_properties(e.device).multi_processor_count
        self.e, self.num_warps, self.timeout_ns = e, num_warps, timeout_ns
        self.stages = stages or self.STAGES
        self.attention = attention or self.ATTENTION
        self.clock, self.poll = clock, poll
        if l2_prefetch_mb < 0 or (l2_prefetch_mb and self.moe):
            raise ValueError(f"l2_prefetch_mb {l2_prefetch_mb}: MB >= 0, a dense model's")
        self.l2_mb, self.l2_last = l2_prefetch_mb, l2_evict_last
        self.bt = bt or BT      # an MoE's: 32 and 64 measured slower (moe_bt.json)
        self.sched = plan_schedule(s, self.P, ctx, self.attention)
        self.prog = self.sched.instr.to(e.device)
        self.n_instr = self.prog.shape[1]
        self.n_ctr = len(self.sched.counters)
        self.kg, self.gt = gate_up_boxes(s.hidden // TK, KB)
        self.w = self.stack(e.W)
        self.g_in = per_layer(e.W, "input_norm")
        self.g_post = per_layer(e.W, "post_norm")
        self.rows = self.sched.instr.view(-1, isa.WIDTH)
        self.spmax = int(self.rows[torch.isin(self.rows[:, isa.OP], torch.tensor(
            [isa.OP_ATTN_PARTIAL, isa.OP_ATTN_FUSED])), isa.SPLITS].max())
        z = self.zeros
        self.qkv, self.q, self.attn = z(s.qkv_size), z(s.q_size), z(s.q_size)
        self.part_m = z(s.heads, self.spmax, dt=torch.float32)
        self.part_l = z(s.heads, self.spmax, dt=torch.float32)
        self.part_o = z(s.heads, self.spmax, s.head_dim, dt=torch.float32)
        self.lm_val, self.lm_idx = z(self.P, dt=torch.float32), z(self.P, dt=torch.int32)
        self.ctr = z(self.n_ctr + 1, dt=torch.int32)
        # per instruction: start, counters in, end (globaltimer ns), and when the loader
        # asked for its last weight tile (0: an instruction with no tiles)
        self.clk = z(self.P, self.n_instr, 4, dt=torch.int64)
        self.init_model()

    def zeros(self, *shape, dt=torch.bfloat16) -> torch.Tensor:
        return torch.zeros(shape, dtype=dt, device=self.e.device)

    def box(self, t: torch.Tensor, kb: int):
        """A TMA descriptor of [TN, kb, TK] boxes over the [rows, K] weights ``t``."""
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
        return TensorDescriptor.from_tensor(box_view(t), [TN, kb, TK], smem_layout())

    def stack(self, W: dict) -> dict:
        """The weights the kernel streams, stacked over the layers (a kind a tensor)."""
        raise NotImplementedError

    def init_model(self) -> None:
        """The model's own descriptors (``self.d``), gains and buffers."""
        raise NotImplementedError

    def args(self) -> tuple:
        """The kernel's arguments before the constexprs."""
        raise NotImplementedError

    def constexprs(self):
        """The kernel's ``C``: its compile-time constants (``args.Consts``, ``MoEConsts``)."""
        raise NotImplementedError

    def run(self):
        self.kernel[(self.P,)](*self.args(), C=self.constexprs(), num_warps=self.num_warps)

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

    def _engine_args(self) -> tuple:
        """The arguments both kernels open with: the lists, the descriptors, then the
        activations, the cache and the partials, the step's token."""
        e = self.e
        return (self.prog, self.n_instr, *self.d, Acts(e.x, self.qkv, self.q, self.attn, self.h),
                Cache(e.k_cache, e.v_cache, e.cos, e.sin),
                Partials(self.part_m, self.part_l, self.part_o),
                Token(self.lm_val, self.lm_idx, e.seq, e.argmax, e.pos, e.prompt_len))


class DenseStep(MegaStep):
    """A dense model's step (``gluon/dense.py``'s ``step_kernel``)."""
    kernel = step_kernel

    def stack(self, W):
        return {"qkv": stacked(W, "w_qkv"), "o": stacked(W, "w_o"),
                "gu": stacked(W, "w_gate_up"), "dn": stacked(W, "w_down")}

    def init_model(self):
        s, W = self.e.spec, self.e.W
        self.b_qkv = (torch.cat([L["b_qkv"] for L in W["layers"]]).contiguous()
                      if s.qkv_bias else self.g_in)          # unread without a bias
        self.nf, self.tail = down_boxes(s.intermediate // TK, 2 * KB, True, self.num_warps)
        self.d = [self.box(self.w["qkv"], KB), self.box(self.w["o"], KB),
                  self.box(self.w["gu"], KB), self.box(self.w["dn"], 2 * KB),
                  self.box(self.w["dn"], self.tail or 2 * KB), self.box(W["lm_head"], KB)]
        self.h = self.zeros(s.intermediate)
        self.err = self.zeros(self.P, ERR, dt=torch.int32)
        self.l2_tab = None                                   # the L2 prefetch off
        if self.l2_mb:
            tab = l2stage.table(self.sched, s, self.l2_mb, self.stages)
            self.l2_tab = l2stage.addresses(tab, self.w["gu"].data_ptr()).to(self.e.device)

    def weight_bytes(self) -> int:
        """The weight bytes a step reads."""
        lm = self.e.W["lm_head"]
        return (sum(t.numel() * t.element_size() for t in self.w.values())
                + lm.numel() * lm.element_size())

    def args(self):
        e, s = self.e, self.e.spec
        return (*self._engine_args(),
                Gains(e.W["embed"], self.g_in, self.g_post, e.W["norm"], self.b_qkv),
                Sync(self.ctr, self.err, self.clk),
                Sizes(s.layers, s.hidden, s.intermediate, s.qkv_size, s.q_size, s.kv_size,
                      s.vocab, self.spmax, e.max_ctx),
                s.rms_eps, s.head_dim ** -0.5, self.timeout_ns, self.n_ctr, self.l2_tab)

    def constexprs(self):
        l2 = 0 if self.l2_tab is None else 2 if self.l2_last else 1
        return constexprs(self.e.spec, self.P, self.n_ctr, self.stages, self.clock, self.kg,
                          self.gt, self.nf, self.tail, self.attention, self.poll, l2)


class MoEStep(MegaStep):
    """A mixture of experts' step (``gluon/moe.py``'s ``moe_step_kernel``): its ids also
    into the engine's ``expert_log``. The experts' weights are copied once, stacked over
    layers (the engine keeps its own)."""
    kernel = moe_step_kernel
    moe = True
    STAGES = MOE_STAGES
    ATTENTION = MOE_ATTENTION

    def stack(self, W):
        return {"qkv": stacked(W, "w_qkv"), "o": stacked(W, "w_o"),
                "rt": stacked(W, "w_router"), "egu": stacked(W, "w_experts_gate_up"),
                "edn": stacked(W, "w_experts_down")}

    def init_model(self):
        s, W = self.e.spec, self.e.W
        self.q_norm = per_layer(W, "q_norm")
        self.k_norm = per_layer(W, "k_norm")
        self.nf = self.tail = 0
        self.ke = s.intermediate // TK
        self.d = [self.box(self.w["qkv"], KB), self.box(self.w["o"], KB),
                  self.box(self.w["rt"], KB), self.box(self.w["egu"], KB),
                  self.box(self.w["edn"], self.ke), self.box(W["lm_head"], KB)]
        rows, z, i32 = self.rows, self.zeros, torch.int32
        n_qkv = int(((rows[:, isa.OP] == isa.OP_RMS_QKV) & (rows[:, isa.LAYER] == 0)).sum())
        self.h = z(s.top_k * s.intermediate)                  # per (slot, row)
        self.qk_ss = z(n_qkv, 2, dt=torch.float32)            # the QKV blocks' squares
        self.router_logits = z(s.experts, dt=torch.float32)
        self.route_ids = z(s.layers, s.top_k, dt=i32)         # per layer: never reused
        self.route_w = z(s.layers, s.top_k, dt=torch.float32)
        # every step's ids at row pos, in the engine's log as the chain's router writes it
        shape = (self.e.max_ctx + 1, s.layers, s.top_k)
        self.expert_log = (self.e.buf("expert_log", shape, i32) if hasattr(self.e, "buf")
                           else z(*shape, dt=i32))
        self.err = z(2 * self.P, ERR, dt=i32)                 # computes', then loaders' rows

    def weight_bytes(self) -> int:
        """The weight bytes a step reads: the top-k experts of each layer."""
        W, s = self.e.W, self.e.spec
        lm = W["lm_head"].numel() * W["lm_head"].element_size()
        dense = sum(self.w[k].numel() * self.w[k].element_size() for k in ("qkv", "o", "rt"))
        return dense + lm + s.layers * s.top_k * 3 * s.intermediate * s.hidden * 2

    def args(self):
        e, s = self.e, self.e.spec
        return (*self._engine_args(),
                MoEGains(e.W["embed"], self.g_in, self.g_post, e.W["norm"], self.q_norm,
                         self.k_norm),
                Route(self.qk_ss, self.router_logits, self.route_ids, self.route_w,
                      self.expert_log),
                Sync(self.ctr, self.err, self.clk),
                MoESizes(s.layers, s.hidden, s.intermediate, s.qkv_size, s.q_size, s.kv_size,
                         s.vocab, s.experts, self.spmax, e.max_ctx),
                s.rms_eps, s.head_dim ** -0.5, self.timeout_ns, self.n_ctr)

    def constexprs(self):
        return moe_constexprs(self.e.spec, self.P, self.n_ctr, self.stages, self.clock,
                              self.kg, self.gt, self.poll, self.bt)


def constexprs(s, P, n_ctr, stages, clock, kg, gt, nf, tail, attention,
               poll=POLL, l2=0) -> Consts:
    """The dense kernel's compile-time constants (``l2``: the L2 prefetch, ``Consts.L2PF``)."""
    check_poll(poll)
    g = s.heads // s.kv_heads
    return Consts(KB_=KB, KG=kg, GT=gt, NF=nf, TAIL=tail, STAGES=stages, WIDTH=isa.WIDTH, G=g,
                  GP=triton.next_power_of_2(g), D=s.head_dim, HKV=s.kv_heads, BT=BT, SB=SB,
                  SBF=SBF, NPB=triton.next_power_of_2(P), EB=EB, BIAS=int(s.qkv_bias),
                  ATT=ATT_STAGES[attention], CTR_BLOCK=triton.next_power_of_2(n_ctr + 1),
                  CLOCK=int(clock), POLL=int(poll), L2PF=l2)


def moe_constexprs(s, P, n_ctr, stages, clock, kg, gt, poll=POLL, bt=BT) -> MoEConsts:
    """The MoE kernel's compile-time constants."""
    check_poll(poll)
    g = s.heads // s.kv_heads
    return MoEConsts(KB_=KB, KG=kg, GT=gt, KE=s.intermediate // TK, TOPK=s.top_k,
                     EP=triton.next_power_of_2(s.experts), QSB=QSB, STAGES=stages,
                     HOLD=HOLD_STAGES, WIDTH=isa.WIDTH, G=g, GP=triton.next_power_of_2(g),
                     D=s.head_dim, HKV=s.kv_heads, BT=bt, SB=SB,
                     NPB=triton.next_power_of_2(P), EB=EB,
                     CTR_BLOCK=triton.next_power_of_2(n_ctr + 1), CLOCK=int(clock),
                     POLL=int(poll))
