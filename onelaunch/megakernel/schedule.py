"""The decode step as per-SM instruction lists: the megakernel's schedule, as data.

    sched = build(spec, P=132, ctx=512)      # sched.instr: int32 [P, N, WIDTH] (isa.py)

What each instruction reads (its tiles, its bytes), each SM's loader program, the table
and the invariants are ``loads.py``.

The stages come from the engine's plan: ``stages.py`` walks ``plan.step_ops(spec)`` and
maps each run of its ops to the stages below (or refuses an op it has no instructions
for), so a change to the plan's ops reaches the schedule.

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

from .isa import WIDTH
from .lists import Schedule, ScheduleError, cdiv, split_range  # noqa: F401  (re-exported)
from .loads import row_bytes, set_hoists
from .stages import (FORM_TEXT, FORMS, MIN_UNIT, Walk, block_stages,  # noqa: F401  (re-exported)
                     stages)

HOLD = 4              # held stages a loader fills before the router's wait
                      # (``loads.stream``)


def build(spec, P: int, ctx: int, tile_n: int = 16, tile_k: int = 256,
          hold: int = HOLD, attention: str = "four", ops=None) -> Schedule:
    """The schedule of one decode step of ``spec`` on P SMs, planned at ``ctx`` keys;
    ``hold``: the held stages a loader fills before the router's wait (MoE);
    ``attention``: the attention's form (``FORMS``; "three" and "two" are ATTN_FUSED,
    run by the one-launch kernel only); ``ops``: the plan's blocks as (layer, ops) (None:
    ``plan.step_ops(spec)``, whose runs of ops ``stages.py`` maps to stages). The balance
    weighs each instruction's bytes and the loaders' hoists come from its tiles
    (``loads``)."""
    ctr: dict[str, int] = {}
    st = stages(spec, P, ctx, tile_n, tile_k, ctr, attention, ops)
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
