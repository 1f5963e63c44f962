"""The plan's ops as the megakernel's stages: each a list of instruction rows (``isa.py``),
chained through counters (the chain: ``schedule.py``).

The stages come from the engine's plan: ``plan.step_ops(spec)`` (the embedding's op, each
layer's ops in the order the block builders launch them, the head's) walked block by
block, each run of its ops mapped to the stages that run it (``RUNS``, and per attention
form ``ATTENTION_RUNS``): rms_qkv -> RMS+QKV row blocks, rope_kv_write -> RoPE+KV,
attention_partial -> partials, attention_reduce -> merges (or, in the fused forms,
rope_kv_write + attention_partial [+ attention_reduce] -> ATTN_FUSED partials),
o_proj_residual -> O, rms_gate_up_swiglu / down_residual -> gate/up and down,
moe_router / moe_gate_up_swiglu / moe_down_residual -> router and top-k, the experts'
gate/up and down, lm_head_argmax -> LM head and ARGMAX. So a change to the plan's ops
reaches the schedule; an op with no instructions (plain attention, a TP exchange), or
one before the op whose output it reads (``NEEDS``), is a ScheduleError naming it.
"""
from __future__ import annotations

from .. import plan
from .isa import (NONE, OP_GATE_UP, OP_LM_HEAD, OP_O_PROJ, OP_RMS_QKV, OP_ROUTER, Argmax,
                  AttnFused, AttnMerge, AttnPartial, Down, Embed, ExpertDown, ExpertGateUp,
                  Gemv, RopeKv, Topk)
from .lists import ScheduleError, cdiv

MIN_UNIT = 16         # fewest positions a split's share is counted in
INSTR_TILES = 2       # an instruction's fixed cost, in weight tiles (``down_splits``)


# ---- counters and blocks -------------------------------------------------------------------
def counter(ctr: dict, name: str) -> int:
    """The index of counter ``name`` (allocated on first use)."""
    return ctr.setdefault(name, len(ctr))


def blocks(n: int, parts: int, tile: int) -> list[tuple[int, int]]:
    """Rows [0, n) as at most ``parts`` blocks of whole tiles, their tile counts differing
    by at most one (the larger blocks first)."""
    t = cdiv(n, tile)
    parts = max(1, min(parts, t))
    out, r0 = [], 0
    for i in range(parts):
        rows = min(n - r0, (t // parts + (i < t % parts)) * tile)
        out.append((r0, rows))
        r0 += rows
    return out


def attention_split(ctx: int, P: int, kv_heads: int) -> tuple[int, int]:
    """(splits per kv head, unit): kv_heads x splits fills P at ``ctx`` keys, one unit
    (a multiple of MIN_UNIT positions) a split."""
    splits = max(1, min(P // kv_heads, cdiv(ctx, MIN_UNIT)))
    unit = cdiv(cdiv(ctx, splits), MIN_UNIT) * MIN_UNIT
    return splits, unit


def down_splits(n_blocks: int, row_tiles: int, k_tiles: int, P: int, unit: int = 1) -> int:
    """K splits of the down projection that minimise the busiest SM's work: ceil(blocks x
    splits / P) instructions of row_tiles x ceil(k_tiles / splits) x ``unit`` tiles (the
    experts' down: k_tiles slots of ``unit`` K tiles each), each costing INSTR_TILES more
    (its waits, its bump, an fp32 partial stored and read back)."""
    cost = lambda s: cdiv(n_blocks * s, P) * (row_tiles * cdiv(k_tiles, s) * unit + INSTR_TILES)
    return min(range(1, k_tiles + 1), key=lambda s: (cost(s), s))


def slot_blocks(k: int, I: int, parts: int, tile: int) -> list[tuple[int, int]]:
    """The (slot, row) space of k slots of I rows (row slot * I + r) as at most ``parts``
    blocks of whole (slot, row-tile) units, their unit counts differing by at most one: a
    block may run from one slot into the next."""
    per = cdiv(I, tile)                                  # row tiles a slot
    at = lambda u: (u // per) * I + (u % per) * tile
    return [(at(u0), at(u0 + n) - at(u0)) for u0, n in blocks(k * per, parts, 1)]



# ---- the stages, one maker a run of the plan's ops -----------------------------------------
class Walk:
    """The schedule built so far, as the next op's stages need it: ``after``, the wait on
    the whole last stage (None after RoPE or the partials, which leave ``by_head``: a
    kv head's wait), and the current layer's facts (its ops so far, its QKV blocks, the
    router's counter)."""

    def __init__(self, spec, P, ctx, tile_n, tile_k, ctr, attention="four"):
        self.spec, self.P, self.ctx, self.ctr, self.attention = spec, P, ctx, ctr, attention
        self.tile_n, self.tile_k = tile_n, tile_k
        self.after, self.layer = None, None
        self.begin(NONE)

    def begin(self, layer) -> None:
        """A new block of the plan: layer ``layer``'s (NONE: the embedding's, the head's)."""
        if layer != self.layer:
            self.layer, self.seen, self.qkv_blocks, self.route = layer, [], 0, None
        self.by_head = None

    def whole(self, op: str):
        """The wait of a stage that reads all of the last stage's output."""
        if self.after is None:
            raise ScheduleError(f"the plan's {op!r} (layer {self.layer}) follows "
                                f"{self.seen[-1]!r}, whose output the one-launch step "
                                f"leaves per kv head: it waits on whole stages only")
        return self.after

    def parts_done(self, splits: int) -> None:
        """After the partials: a merge waits on its kv head's ``splits`` partials."""
        l = self.layer
        self.after, self.by_head = None, lambda kh: (self.c(f"part.{l}.{kh}"), splits)

    def head_wait(self, kh: int):
        return self.by_head(kh) if self.by_head else self.whole("attention_partial")

    def c(self, name: str) -> int:
        return counter(self.ctr, name)


def gemv_stage(op, layer, n, K, P, tile_n, ctr, name, after) -> list[list[int]]:
    """Row blocks of a GEMV over all of K, each waiting on ``after``, bumping ``name``."""
    c = counter(ctr, name)
    return [Gemv(op=op, layer=layer, row0=r0, rows=rows, klen=K, idx=i, waits=[after],
                 bump=c).row() for i, (r0, rows) in enumerate(blocks(n, P, tile_n))]


def gemv(w: Walk, op: str, code: int, n: int, K: int, name: str) -> list[list[int]]:
    """The GEMV stage of the plan's ``op``: waits on the last stage, then ``after`` is it."""
    st = gemv_stage(code, w.layer, n, K, w.P, w.tile_n, w.ctr, name, w.whole(op))
    w.after = (w.c(name), len(st))
    return st


def embed_stage(w):
    w.after = (w.c("embed"), 1)
    return [[Embed(row0=0, rows=w.spec.hidden, bump=w.c("embed")).row()]]


def qkv_stage(w):
    """RMS+QKV row blocks (an MoE's also store their q and k sums of squares)."""
    st = gemv(w, "rms_qkv", OP_RMS_QKV, w.spec.qkv_size, w.spec.hidden, f"qkv.{w.layer}")
    w.qkv_blocks = len(st)
    return [st]


def split(w, make, kh, sp, wait, **kw):
    """Attention split ``sp`` of kv head ``kh`` (``make``: AttnPartial or AttnFused)."""
    s, (splits, unit) = w.spec, attention_split(w.ctx, w.P, w.spec.kv_heads)
    return make(layer=w.layer, kv_head=kh, heads=s.heads // s.kv_heads, split=sp,
                idx=kh * splits + sp, splits=splits, unit=unit, waits=[wait],
                bump=w.c(f"part.{w.layer}.{kh}"), **kw).row()


def rope_stage(w):
    """RoPE + KV write a kv head (with the q/k norm: over the QKV blocks' squares)."""
    s, l = w.spec, w.layer
    done = w.whole("rope_kv_write")
    rope = [RopeKv(layer=l, kv_head=kh, idx=kh, splits=w.qkv_blocks if s.qk_norm else 0,
                   waits=[done], bump=w.c(f"rope.{l}.{kh}")).row() for kh in range(s.kv_heads)]
    w.after, w.by_head = None, lambda kh: (w.c(f"rope.{l}.{kh}"), 1)
    return [rope]


def partial_stage(w):
    """Partials a (kv head, split), each after its kv head's RoPE."""
    s = w.spec
    splits, _ = attention_split(w.ctx, w.P, s.kv_heads)
    part = [split(w, AttnPartial, kh, sp, w.head_wait(kh))
            for kh in range(s.kv_heads) for sp in range(splits)]
    w.parts_done(splits)
    return [part]


def fused_stage(w, merge: bool = False):
    """Partials that RoPE their own queries and key (ATTN_FUSED); ``merge``: the last
    split of a kv head also merges its heads (BUMP2)."""
    s, l = w.spec, w.layer
    if s.qk_norm:
        raise ScheduleError(f"the {w.attention}-stage attention (ATTN_FUSED) has no q/k norm")
    splits, _ = attention_split(w.ctx, w.P, s.kv_heads)
    done = w.whole("rope_kv_write")
    part = [split(w, AttnFused, kh, sp, done, bump2=w.c(f"merge.{l}") if merge else NONE)
            for kh in range(s.kv_heads) for sp in range(splits)]
    if merge:
        w.after = (w.c(f"merge.{l}"), s.kv_heads)
    else:
        w.parts_done(splits)
    return [part]


def merge_stage(w):
    """Merges a query head, each after its kv head's splits."""
    s, l = w.spec, w.layer
    g, (splits, unit) = s.heads // s.kv_heads, attention_split(w.ctx, w.P, s.kv_heads)
    if w.by_head is None:
        raise ScheduleError(f"the plan's 'attention_reduce' (layer {l}) must follow the "
                            f"partials: the one-launch step merges them a query head")
    merge = [AttnMerge(layer=l, head=h, idx=h, splits=splits, unit=unit,
                       waits=[w.by_head(h // g)], bump=w.c(f"merge.{l}")).row()
             for h in range(s.heads)]
    w.after = (w.c(f"merge.{l}"), s.heads)
    return [merge]


def o_stage(w):
    s = w.spec
    return [gemv(w, "o_proj_residual", OP_O_PROJ, s.hidden, s.q_size, f"o.{w.layer}")]


def gate_up_stage(w):
    s = w.spec
    return [gemv(w, "rms_gate_up_swiglu", OP_GATE_UP, s.intermediate, s.hidden,
                 f"gu.{w.layer}")]


def down_stage(w):
    """Down's earlier K splits, then its last splits (+ residual)."""
    s, l, P, tile_n, tile_k = w.spec, w.layer, w.P, w.tile_n, w.tile_k
    done = w.whole("down_residual")
    rb = blocks(s.hidden, P, tile_n)
    S = down_splits(len(rb), cdiv(rb[0][1], tile_n), cdiv(s.intermediate, tile_k), P)
    ks = blocks(s.intermediate, S, tile_k)
    S = len(ks)
    early, last = [], []
    for b, (r0, rows) in enumerate(rb):
        part = w.c(f"dpart.{l}.{b}") if S > 1 else NONE
        for sp, (k0, kl) in enumerate(ks[:-1]):
            early.append(Down(layer=l, row0=r0, rows=rows, k0=k0, klen=kl, split=sp,
                              idx=b * S + sp, splits=S, waits=[done], bump=part).row())
        waits = [done] + ([(part, S - 1)] if S > 1 else [])
        last.append(Down(layer=l, row0=r0, rows=rows, k0=ks[-1][0], klen=ks[-1][1],
                         split=S - 1, idx=b * S + S - 1, splits=S, waits=waits,
                         bump=w.c(f"down.{l}")).row())
    w.after = (w.c(f"down.{l}"), len(last))
    return [early, last]


def router_stage(w):
    """Router row blocks (RMS + GEMV), then the top-k (softmax, ids, weights)."""
    s, l = w.spec, w.layer
    router = gemv(w, "moe_router", OP_ROUTER, s.experts, s.hidden, f"router.{l}")
    w.route = w.after = (w.c(f"route.{l}"), 1)
    topk = [Topk(layer=l, experts=s.experts, bump=w.route[0],
                 waits=[(w.c(f"router.{l}"), len(router))]).row()]
    return [router, topk]


def expert_gate_up_stage(w):
    """The experts' gate/up (+ SwiGLU) over (slot, row) blocks."""
    s, l = w.spec, w.layer
    after = w.whole("moe_gate_up_swiglu")
    gu = [ExpertGateUp(layer=l, row0=r0, rows=rows, klen=s.hidden, idx=i, lwait=w.route,
                       waits=[after], bump=w.c(f"gu.{l}")).row()
          for i, (r0, rows) in enumerate(slot_blocks(s.top_k, s.intermediate, w.P, w.tile_n))]
    w.after = (w.c(f"gu.{l}"), len(gu))
    return [gu]


def expert_down_stage(w):
    """The experts' down over (row block, slot group): earlier groups' partials, then the
    last group's sum in slot order (+ residual)."""
    s, l, P = w.spec, w.layer, w.P
    k, I, H = s.top_k, s.intermediate, s.hidden
    done = w.whole("moe_down_residual")
    rb = blocks(H, P, w.tile_n)
    S = down_splits(len(rb), cdiv(rb[0][1], w.tile_n), k, P, cdiv(I, w.tile_k))
    groups = blocks(k, S, 1)                       # (first slot, slots)
    S = len(groups)
    early, last = [], []
    for b, (r0, rows) in enumerate(rb):
        part = w.c(f"dpart.{l}.{b}") if S > 1 else NONE
        for g, (j0, n) in enumerate(groups):
            waits = [done] + ([(part, S - 1)] if S > 1 and g == S - 1 else [])
            bump = part if g < S - 1 else w.c(f"down.{l}")
            (early if g < S - 1 else last).append(ExpertDown(
                layer=l, row0=r0, rows=rows, k0=j0 * I, klen=n * I, group=g, idx=b * S + g,
                splits=S, lwait=w.route, waits=waits, bump=bump).row())
    w.after = (w.c(f"down.{l}"), len(last))
    return [early, last]


def head_stage(w):
    """LM-head row blocks (each its best), then the one ARGMAX that resets the counters."""
    s = w.spec
    lm = gemv(w, "lm_head_argmax", OP_LM_HEAD, s.vocab, s.hidden, "lm")
    return [lm, [Argmax(n_best=len(lm), waits=[w.after]).row()]]


# ---- the plan's ops -> the stages ----------------------------------------------------------
RUNS = {                 # a run of the plan's ops (``plan.step_ops``) -> its stages' maker
    ("embed",): embed_stage, ("rms_qkv",): qkv_stage, ("o_proj_residual",): o_stage,
    ("rms_gate_up_swiglu",): gate_up_stage, ("down_residual",): down_stage,
    ("moe_router",): router_stage, ("moe_gate_up_swiglu",): expert_gate_up_stage,
    ("moe_down_residual",): expert_down_stage, ("lm_head_argmax",): head_stage}
ATTENTION_RUNS = {       # the attention's forms: how the plan's RoPE, partials, merges run
    "four": {("rope_kv_write",): rope_stage, ("attention_partial",): partial_stage,
             ("attention_reduce",): merge_stage},
    "three": {("rope_kv_write", "attention_partial"): fused_stage,
              ("attention_reduce",): merge_stage},
    "two": {("rope_kv_write", "attention_partial", "attention_reduce"):
            lambda w: fused_stage(w, merge=True)}}
FORMS = tuple(ATTENTION_RUNS)            # the attention's forms
FORM_TEXT = {                            # each form's stages after RMS+QKV, in words
    "four": "RoPE and the KV write, partials, merges, O",
    "three": "partials that RoPE their own queries and key, merges, O",
    "two": "partials that RoPE their own queries and key, the last of a kv head's "
           "splits merging its heads, O"}
NEEDS = {                # an op -> the op of its layer whose output it reads, earlier
    "rope_kv_write": "rms_qkv", "attention_partial": "rope_kv_write",
    "attention_reduce": "attention_partial", "o_proj_residual": "attention_reduce",
    "down_residual": "rms_gate_up_swiglu", "moe_gate_up_swiglu": "moe_router",
    "moe_down_residual": "moe_gate_up_swiglu"}


def runs(attention: str) -> dict:
    """The runs of the plan's ops the one-launch step has instructions for, in ``attention``'s
    form."""
    if attention not in FORMS:
        raise ScheduleError(f"attention form {attention!r}: one of {', '.join(FORMS)}")
    return {**RUNS, **ATTENTION_RUNS[attention]}


def block_stages(w: Walk, layer: int, ops) -> list[list]:
    """The stages of one block of the plan (``layer``'s ``ops``, in order): each longest
    run of ops the form has a maker for, or a ScheduleError naming the op it cannot run."""
    table, out, i = runs(w.attention), [], 0
    w.begin(layer)
    while i < len(ops):
        run = max((r for r in table if tuple(ops[i:i + len(r)]) == r), key=len, default=None)
        if run is None:
            raise ScheduleError(
                f"the one-launch step has no instructions for the plan's op {ops[i]!r} "
                f"(layer {layer}) in the {w.attention!r} attention form: it runs "
                + ", ".join(" + ".join(r) for r in table))
        for op in run:
            if NEEDS.get(op, op) not in w.seen + [op]:
                raise ScheduleError(f"the plan's {op!r} (layer {layer}) reads what "
                                    f"{NEEDS[op]!r} writes, which its layer has not run")
            w.seen.append(op)
        out += table[run](w)
        i += len(run)
    return out


def stages(spec, P: int, ctx: int, tile_n: int, tile_k: int, ctr: dict,
           attention: str = "four", ops=None) -> list[list]:
    """Every stage of the step in order, each a list of instruction rows: the plan's
    blocks (``ops``: ``plan.step_ops(spec)``, split-K attention), each run of their ops
    mapped to its stages."""
    runs(attention)
    w = Walk(spec, P, ctx, tile_n, tile_k, ctr, attention)
    steps = plan.step_ops(spec, "splitk") if ops is None else ops
    return [st for layer, block in steps
            for st in block_stages(w, NONE if layer is None else layer, block)]
