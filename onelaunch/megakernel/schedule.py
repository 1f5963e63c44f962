"""The decode step as per-SM instruction lists: the megakernel's schedule, as data.

    sched = build(spec, P=132, ctx=512)      # sched.instr: int32 [P, N, WIDTH] (isa.py)

What each instruction reads (its tiles, its bytes), each SM's loader program, the table
and the invariants are ``loads.py``.

The step is a chain of stages; each instruction of a stage waits on a counter that the
instructions it reads from bump, with the count of them as its target:

    embed                                    -> "embed"
    per layer l:
      RMS+QKV row blocks      wait x's writers  -> "qkv.l"
      RoPE+KV write per kv head  qkv.l = all    -> "rope.l.kh"
      partial (kv head, split)   rope.l.kh = 1  -> "part.l.kh"
      merge per query head       part.l.kh = splits -> "merge.l"
      O row blocks (+ x)         merge.l = heads    -> "o.l"
      gate/up row blocks (+SwiGLU)  o.l = all       -> "gu.l"
      down (row block, K split < last)  gu.l = all  -> "dpart.l.b"
      down (row block, last split: sums, + x)  gu.l, dpart.l.b  -> "down.l"
    LM head row blocks           down.L-1 = all  -> "lm"
    ARGMAX                       lm = all        -> resets every counter to zero

``build(attention=...)`` picks the attention's form (dense models): "four" above (RoPE,
partials, merges, O); "three", each partial an ATTN_FUSED that RoPEs its own queries and
the new key (no RoPE stage; the merges as above); "two", the fused partials' last split
of each kv head also merging its heads:

      RMS+QKV row blocks      wait x's writers  -> "qkv.l"
      fused (kv head, split)  qkv.l = all       -> "part.l.kh"; the one that brings it
                                                   to splits merges -> "merge.l"
      O row blocks (+ x)      merge.l = kv heads -> "o.l"

A mixture of experts (OLMoE) replaces the layer's MLP, and its QKV row blocks also store
their sums of squares of q and of k, which each RoPE sums in block order for the q/k
norm over the whole projection (the partial squares ride on the "qkv.l" counter):

      router row blocks (RMS + GEMV)  o.l = all        -> "router.l"
      top-k (softmax, ids, weights)   router.l = all   -> "route.l"
      expert gate/up (slot, rows)     route.l = 1      -> "gu.l"
      expert down (rows, slot group < last)  gu.l = all   -> "dpart.l.b"
      expert down (rows, last group: + x)    gu.l, dpart.l.b  -> "down.l"

The one wait of a loader: an expert's weights are addressed by the router's ids, so
every expert instruction names "route.l" in LWAIT, and its loader waits for it before
asking for its first tile (the compute waits too: gate/up on route.l, down through
gu.l). The ids and weights are per layer ([layers, top_k]), so a loader's late read of
one layer's ids can never meet the next layer's writes. Before the wait, the first
expert instruction of a run streams into HOIST held stages the first tiles of what
follows that does not depend on the router (the next layer's QKV, O and router rows,
the LM head's first tiles): ``loads.stream`` is each loader's program. The schedule
assigns (slot, row-tile) work, not experts, so the experts' bytes spread over the grid
the same way whatever the router picks; the down sums each row block's slots in slot
order in one place, so every interleaving gives the same bits.

Reset: every instruction precedes ARGMAX through the counters (``loads.check`` proves it
on the lists; the VM checks it when ARGMAX resets), so when ARGMAX zeroes the counters
nothing is left to wait on them, and the next launch starts from zeros: no host work.

Buffers updated in place: the residual x is read whole by every RMS (QKV, gate/up, LM
head) and written by row blocks (embed, O, down). It stays one buffer: every writer of a
stage waits, through the chain, on every reader of the stage before it (O waits on the
merges, which wait on the partials, on RoPE, on all of QKV), so no write can pass a read
(write after read). The same chain guards h, qkv, q, the partials, attn and the down
partials across layers. The VM's race detector checks this on every run.

Balance: within each stage, instructions (largest first) go to the SM with the fewest
bytes so far (weight bytes plus KV bytes at ``ctx``), so every SM's bytes are about equal
and each SM's list stays in stage order (so it cannot deadlock: an instruction waits
only on earlier stages). Attention is split so kv_heads x splits fills the P SMs at
``ctx``; the splits' key ranges come from pos at run time, so one schedule serves every
step (longer contexts give each split more units). The MoE adds opcodes whose tiles
depend on the router's ids; this module's stages and counters take them as they come.
"""
from __future__ import annotations

import heapq
from collections import Counter

import torch

from .isa import (NONE, OP_GATE_UP, OP_LM_HEAD, OP_O_PROJ, OP_RMS_QKV, OP_ROUTER, WIDTH,
                  Argmax, AttnFused, AttnMerge, AttnPartial, Down, Embed, ExpertDown,
                  ExpertGateUp, Gemv, RopeKv, Topk)
from .lists import Schedule, ScheduleError, cdiv, split_range  # noqa: F401  (re-exported)
from .loads import row_bytes, set_hoists

MIN_UNIT = 16         # fewest positions a split's share is counted in
INSTR_TILES = 2       # an instruction's fixed cost, in weight tiles (``down_splits``)
HOLD = 4              # held stages a loader fills before the router's wait
                      # (``loads.stream``)


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



# ---- the stages ----------------------------------------------------------------------------
def gemv_stage(op, layer, n, K, P, tile_n, ctr, name, after) -> list[list[int]]:
    """Row blocks of a GEMV over all of K, each waiting on ``after``, bumping ``name``."""
    c = counter(ctr, name)
    return [Gemv(op=op, layer=layer, row0=r0, rows=rows, klen=K, idx=i, waits=[after],
                 bump=c).row() for i, (r0, rows) in enumerate(blocks(n, P, tile_n))]


FORMS = ("four", "three", "two")         # the attention's forms (``attention_stages``)
FORM_TEXT = {                            # each form's stages after RMS+QKV, in words
    "four": "RoPE and the KV write, partials, merges, O",
    "three": "partials that RoPE their own queries and key, merges, O",
    "two": "partials that RoPE their own queries and key, the last of a kv head's "
           "splits merging its heads, O"}


def attention_stages(s, l, P, ctx, tile_n, ctr, after, attention="four"):
    """RMS+QKV, RoPE+KV, partials, merges, O (+ residual); and (O counter, count). With
    the q/k norm each RoPE sums the QKV blocks' partial squares (SPLITS of them).
    ``attention`` "three": RMS+QKV, partials that RoPE their own queries and key
    (ATTN_FUSED without BUMP2), merges, O; "two": the fused partials' last split of each
    kv head merges its heads (ATTN_FUSED with BUMP2), then O."""
    if attention not in FORMS:
        raise ScheduleError(f"attention form {attention!r}: one of {', '.join(FORMS)}")
    g = s.heads // s.kv_heads
    qkv = gemv_stage(OP_RMS_QKV, l, s.qkv_size, s.hidden, P, tile_n, ctr, f"qkv.{l}", after)
    done = (counter(ctr, f"qkv.{l}"), len(qkv))
    splits, unit = attention_split(ctx, P, s.kv_heads)
    merged = lambda: counter(ctr, f"merge.{l}")     # made in stage order (``loads.table``)
    split = lambda make, kh, sp, wait, **kw: make(
        layer=l, kv_head=kh, heads=g, split=sp, idx=kh * splits + sp, splits=splits,
        unit=unit, waits=[wait], bump=counter(ctr, f"part.{l}.{kh}"), **kw).row()
    if attention == "four":
        rope = [[RopeKv(layer=l, kv_head=kh, idx=kh, splits=len(qkv) if s.qk_norm else 0,
                        waits=[done], bump=counter(ctr, f"rope.{l}.{kh}")).row()
                 for kh in range(s.kv_heads)]]
        part = [split(AttnPartial, kh, sp, (counter(ctr, f"rope.{l}.{kh}"), 1))
                for kh in range(s.kv_heads) for sp in range(splits)]
    elif s.qk_norm:
        raise ScheduleError(f"the {attention}-stage attention (ATTN_FUSED) has no q/k norm")
    else:
        rope = []
        part = [split(AttnFused, kh, sp, done,
                      bump2=merged() if attention == "two" else NONE)
                for kh in range(s.kv_heads) for sp in range(splits)]
    if attention == "two":                       # the last split of a kv head merges
        merge, after_merge = [], (merged(), s.kv_heads)
    else:
        merge = [[AttnMerge(layer=l, head=h, idx=h, splits=splits, unit=unit,
                            waits=[(counter(ctr, f"part.{l}.{h // g}"), splits)],
                            bump=merged()).row() for h in range(s.heads)]]
        after_merge = (merged(), s.heads)
    o = gemv_stage(OP_O_PROJ, l, s.hidden, s.q_size, P, tile_n, ctr, f"o.{l}", after_merge)
    return [qkv, *rope, part, *merge, o], (counter(ctr, f"o.{l}"), len(o))


def mlp_stages(s, l, P, tile_n, tile_k, ctr, after):
    """gate/up (+ SwiGLU); down's earlier K splits, then its last splits (+
    residual)."""
    gu = gemv_stage(OP_GATE_UP, l, s.intermediate, s.hidden, P, tile_n, ctr, f"gu.{l}",
                    after)
    done = (counter(ctr, f"gu.{l}"), len(gu))
    rb = blocks(s.hidden, P, tile_n)
    S = down_splits(len(rb), cdiv(rb[0][1], tile_n), cdiv(s.intermediate, tile_k), P)
    ks = blocks(s.intermediate, S, tile_k)
    S = len(ks)
    early, last = [], []
    for b, (r0, rows) in enumerate(rb):
        part = counter(ctr, f"dpart.{l}.{b}") if S > 1 else NONE
        for sp, (k0, kl) in enumerate(ks[:-1]):
            early.append(Down(layer=l, row0=r0, rows=rows, k0=k0, klen=kl, split=sp,
                              idx=b * S + sp, splits=S, waits=[done], bump=part).row())
        waits = [done] + ([(part, S - 1)] if S > 1 else [])
        last.append(Down(layer=l, row0=r0, rows=rows, k0=ks[-1][0], klen=ks[-1][1],
                         split=S - 1, idx=b * S + S - 1, splits=S, waits=waits,
                         bump=counter(ctr, f"down.{l}")).row())
    return [gu, early, last], (counter(ctr, f"down.{l}"), len(last))


def moe_stages(s, l, P, tile_n, tile_k, ctr, after):
    """Router row blocks, the top-k, the experts' gate/up (+ SwiGLU) over (slot, row)
    blocks, the experts' down over (row block, slot group): earlier groups' partials, then
    the last group's sum in slot order (+ residual)."""
    k, I, H = s.top_k, s.intermediate, s.hidden
    router = gemv_stage(OP_ROUTER, l, s.experts, H, P, tile_n, ctr, f"router.{l}", after)
    route = (counter(ctr, f"route.{l}"), 1)
    topk = [Topk(layer=l, experts=s.experts, bump=route[0],
                 waits=[(counter(ctr, f"router.{l}"), len(router))]).row()]
    gu = [ExpertGateUp(layer=l, row0=r0, rows=rows, klen=H, idx=i, lwait=route,
                       waits=[route], bump=counter(ctr, f"gu.{l}")).row()
          for i, (r0, rows) in enumerate(slot_blocks(k, I, P, tile_n))]
    done = (counter(ctr, f"gu.{l}"), len(gu))
    rb = blocks(H, P, tile_n)
    S = down_splits(len(rb), cdiv(rb[0][1], tile_n), k, P, cdiv(I, tile_k))
    groups = blocks(k, S, 1)                       # (first slot, slots)
    S = len(groups)
    early, last = [], []
    for b, (r0, rows) in enumerate(rb):
        part = counter(ctr, f"dpart.{l}.{b}") if S > 1 else NONE
        for g, (j0, n) in enumerate(groups):
            waits = [done] + ([(part, S - 1)] if S > 1 and g == S - 1 else [])
            bump = part if g < S - 1 else counter(ctr, f"down.{l}")
            (early if g < S - 1 else last).append(ExpertDown(
                layer=l, row0=r0, rows=rows, k0=j0 * I, klen=n * I, group=g, idx=b * S + g,
                splits=S, lwait=route, waits=waits, bump=bump).row())
    return [router, topk, gu, early, last], (counter(ctr, f"down.{l}"), len(last))


def head_stages(s, P, tile_n, ctr, after):
    """LM-head row blocks (each its best), then the one ARGMAX that resets the counters."""
    lm = gemv_stage(OP_LM_HEAD, NONE, s.vocab, s.hidden, P, tile_n, ctr, "lm", after)
    return [lm, [Argmax(n_best=len(lm), waits=[(counter(ctr, "lm"), len(lm))]).row()]]


def stages(spec, P: int, ctx: int, tile_n: int, tile_k: int, ctr: dict,
           attention: str = "four") -> list[list]:
    """Every stage of the step in order, each a list of instruction rows."""
    out = [[Embed(row0=0, rows=spec.hidden, bump=counter(ctr, "embed")).row()]]
    after = (counter(ctr, "embed"), 1)
    for l in range(spec.layers):
        att, after = attention_stages(spec, l, P, ctx, tile_n, ctr, after, attention)
        mlp, after = (moe_stages if spec.is_moe else mlp_stages)(spec, l, P, tile_n, tile_k,
                                                                 ctr, after)
        out += att + mlp
    return out + head_stages(spec, P, tile_n, ctr, after)


def build(spec, P: int, ctx: int, tile_n: int = 16, tile_k: int = 256,
          hold: int = HOLD, attention: str = "four") -> Schedule:
    """The schedule of one decode step of ``spec`` on P SMs, planned at ``ctx`` keys;
    ``hold``: the held stages a loader fills before the router's wait (MoE);
    ``attention``: the attention's form (``FORMS``; "three" and "two" are ATTN_FUSED,
    run by the one-launch kernel only). The balance weighs each instruction's bytes and
    the loaders' hoists come from its tiles (``loads``)."""
    ctr: dict[str, int] = {}
    st = stages(spec, P, ctx, tile_n, tile_k, ctr, attention)
    sched = Schedule(spec, torch.zeros(0), list(ctr), ctx, tile_n, tile_k, hold)
    lists = assign(st, P, lambda r: row_bytes(sched, r))
    for rows in lists:
        set_hoists(sched, rows)
    N = max(len(x) for x in lists)
    t = torch.zeros((P, N, WIDTH), dtype=torch.int32)          # OP_END = 0 pads
    for sm, rows in enumerate(lists):
        if rows:
            t[sm, :len(rows)] = torch.tensor(rows, dtype=torch.int32)
    sched.instr = t
    return sched


def assign(stages_, P: int, cost) -> list[list[list[int]]]:
    """Per-SM lists: each stage's rows, largest first, to the SM with the fewest bytes so
    far (then the fewest instructions) among those holding fewer than ceil(rows / P) of
    the stage, so a stage spreads over the SMs and their bytes stay about equal. Every
    list keeps stage order."""
    lists = [[] for _ in range(P)]
    heap = [(0, 0, sm) for sm in range(P)]
    for stage in stages_:
        cap, used, held = cdiv(len(stage), P), Counter(), []
        for r, c in sorted(((r, cost(r)) for r in stage), key=lambda rc: -rc[1]):
            while True:
                b, n, sm = heapq.heappop(heap)
                if used[sm] < cap:
                    break
                held.append((b, n, sm))                 # full for this stage
            lists[sm].append(r)
            used[sm] += 1
            heapq.heappush(heap, (b + c, n + 1, sm))
        for h in held:
            heapq.heappush(heap, h)
    return lists
