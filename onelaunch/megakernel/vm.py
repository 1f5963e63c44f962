"""A CPU model of the megakernel: runs a schedule's instruction tensor with torch ops, in
a random order that respects only the counters and the rings. The CPU suite's check of
the schedule (Gluon does not run on a CPU).

    m = Machine(spec, weights, max_ctx)      # packed weights, KV cache, seq / pos
    m.start(ids, pos)                        # like Engine.start (pos: the step's slot)
    out = m.step(sched, seed)                # {"token", "logits", "x", "events", "order",
                                             #  "loaded": each SM's tile bytes}

Each SM is two actors. Its loader runs the SM's program from ``loads.stream``: tile
t of the SM's stream (``loads.tiles`` of each instruction, in list order) goes into
ring stage n % S (the n-th tile through the ring) once that stage is free, or into held
stage j (after the S ring stages) when hoisted. Its one wait on data is an expert
instruction's LWAIT, the router's counter: only then does it read the layer's ids (a
tracked read, so a loader that reads them early is a hazard) to address the experts'
tiles. Its compute waits for each counter's target, takes each tile from its stage once
full (a stage holding another tile was reused too early: reported), computes, frees the
stage, then stores, then bumps (separate steps: a bump before its store shows). A seeded
scheduler picks at random among actors that can progress; when none can before the end,
``VMDeadlock`` names each blocked SM, instruction and counter.

Hazards: at each step start the activations (and what the step writes in the carried
buffers: every layer's KV slot pos, argmax and seq at pos + 1) are poisoned with NaN
(-1) and marked unwritten. Each actor keeps a vector clock (a tick per access or bump;
computes 0..P-1, loaders P..2P-1); a bump releases it into the counter,
a satisfied wait acquires it. A read must find every element written this step, by an
access ordered before it; a write must be ordered after the last write and every read
since (write after read). Else ``VMHazard``. ARGMAX's reset needs every SM's last bump
ordered before it; at the end every counter must be zero. Each op's math is in
``vm_ops.py``.
"""
from __future__ import annotations

import random

import torch

from ..oracle import rope_cos_sin
from ..specs import get_spec
from ..weights import pack_weights
from .isa import (BUMP, IDX, LAYER, NONE, OP, OP_ATTN_FUSED, OP_ATTN_PARTIAL, OP_DOWN,
                  OP_EXPERT_DOWN, OP_LM_HEAD, OP_RMS_QKV, OPCODES, ROW0, SPLITS, TARGET0,
                  TARGET1, WAIT0, WAIT1)
from .loads import TOKEN_ROW, split_slot, stream, tiles
from .vm_ops import ALL, BF16, F32, I64, OPS, STEP

UNWRITTEN, BEFORE = -1, -2        # an element's writer: none yet this step / an earlier step


class VMError(RuntimeError):
    """The schedule broke a rule of the machine."""


class VMDeadlock(VMError):
    """No actor can progress before the end of the step."""


class VMHazard(VMError):
    """A read or write not ordered by the counters, or a ring stage misused."""


class Tracked:
    """A buffer with, per element (per row when ``dims`` < its rank: the KV cache's
    positions), the actor and tick of its last write this step and each actor's last
    read (``actors``: the computes, then the loaders)."""

    def __init__(self, data: torch.Tensor, actors: int, dims: int | None = None):
        self.data = data
        shape = tuple(data.shape[:dims if dims is not None else data.dim()])
        self.w_sm = torch.full(shape, BEFORE, dtype=I64)
        self.w_t = torch.zeros(shape, dtype=I64)
        self.reads = torch.zeros((actors,) + shape, dtype=I64)

    def poison(self, idx=ALL):
        self.data[idx] = float("nan") if self.data.is_floating_point() else -1
        self.w_sm[idx] = UNWRITTEN


class Actor:
    """One partition of an SM: its list, vector clock (entry ``me``), place in the list."""
    kind = ""

    def __init__(self, sm: int, me: int, rows: list, P: int):
        self.sm, self.me, self.rows, self.i, self.t = sm, me, rows, 0, 0
        self.vc = torch.zeros(2 * P, dtype=I64)
        self.need = self.gen = self.done_tick = self.partner = None

    def tick(self) -> int:
        self.vc[self.me] += 1
        return int(self.vc[self.me])

    def where(self) -> str:
        r = self.rows[self.i]
        return (f"SM {self.sm}{self.kind} instruction {self.i} ({OPCODES[r[OP]]} layer "
                f"{r[LAYER]} row {r[ROW0]} idx {r[IDX]})")


class Core(Actor):
    """One SM's compute partition."""

    def __init__(self, sm: int, rows: list, P: int):
        super().__init__(sm, sm, rows, P)


class Loader(Actor):
    """One SM's loader partition; ``partner``: its compute (and back)."""
    kind = " loader"

    def __init__(self, sm: int, core: Core, P: int):
        super().__init__(sm, P + sm, core.rows, P)
        self.partner, core.partner = core, self


class Ring:
    """One SM's stages of TILE_N x TILE_K bf16 (S ring stages, then the held ones), each
    empty or full."""

    def __init__(self, S: int, tile_n: int, tile_k: int):
        self.data = torch.zeros((S, tile_n, tile_k), dtype=BF16)
        self.full, self.tile = [False] * S, [-1] * S


def fmt(name: str, idx: tuple) -> str:
    """``x[0:96]``: a buffer and an index, for messages."""
    part = lambda i: f"{i.start or 0}:{'' if i.stop is None else i.stop}" if isinstance(i, slice) \
        else str(i)
    return f"{name}[{', '.join(map(part, idx))}]"


class Machine:
    def __init__(self, spec, weights: dict, max_ctx: int | None = None, stages: int = 4):
        self.spec = s = get_spec(spec)
        self.W = pack_weights(s, weights)
        self.max_ctx, self.S = max_ctx or s.max_ctx, stages
        shape = (s.layers, s.kv_heads, self.max_ctx, s.head_dim)
        self.k_cache, self.v_cache = torch.zeros(shape, dtype=BF16), torch.zeros(shape, dtype=BF16)
        self.cos, self.sin = rope_cos_sin(torch.arange(self.max_ctx), s.head_dim,
                                          s.rope_theta, BF16)
        self.seq = torch.zeros(self.max_ctx + 1, dtype=I64)
        self.argmax = torch.zeros(self.max_ctx + 1, dtype=I64)
        self.pos, self.prompt_len = torch.zeros(1, dtype=I64), 0
        self.counters = torch.zeros(0, dtype=torch.int32)

    def start(self, ids, pos: int = 0):
        """Tokens ``ids`` as the prompt (steps inside it only fill the cache), at ``pos``."""
        ids = torch.as_tensor(ids).flatten()
        self.seq.zero_()
        self.seq[:ids.numel()], self.prompt_len = ids, ids.numel()
        self.pos.fill_(pos)

    def adopt_cache(self, k: torch.Tensor, v: torch.Tensor):
        C = min(self.max_ctx, k.shape[2])
        self.k_cache[:, :, :C], self.v_cache[:, :, :C] = k[:, :, :C], v[:, :, :C]

    def weight(self, name: str) -> torch.Tensor:
        if name.startswith("layers."):
            _, l, key = name.split(".")
            return self.W["layers"][int(l)][key]
        return self.W[name]

    # ---- one step --------------------------------------------------------------------------
    def step(self, sched, seed: int = 0) -> dict:
        """Run one decode step of ``sched`` in the interleaving chosen by ``seed``."""
        self.sched, P = sched, sched.P
        if self.counters.numel() != len(sched.counters):
            self.counters = torch.zeros(len(sched.counters), dtype=torch.int32)
        if self.counters.any():
            raise VMError(f"counters not zero at the step start: {self.nonzero()}")
        self.cvc = torch.zeros((len(sched.counters), 2 * P), dtype=I64)
        self.buf = self.buffers(sched)
        self.cores = [Core(sm, sched.rows(sm), P) for sm in range(P)]
        self.order, self.loaded = [], [0] * P             # (sm, i) as instructions end
        self.rings = [Ring(self.S + sched.hold, sched.tile_n, sched.tile_k) for _ in range(P)]
        self.streams = [stream(sched, sm) for sm in range(P)]
        self.stages = [{st[1]: self.stage(st[3]) for st in prog if st[0] == "load"}
                       for prog in self.streams]                  # tile -> its stage
        loaders = [Loader(sm, self.cores[sm], P) for sm in range(P)]
        for a in self.cores + loaders:
            a.gen = self.core(a) if isinstance(a, Core) else self.loader(a)
            a.need = next(a.gen, None)
        events = self.run(self.cores + loaders, random.Random(seed))
        if self.counters.any():
            raise VMError(f"counters not zero at the end of the step: {self.nonzero()}")
        return {"token": int(self.buf["token"].data[0]), "logits": self.buf["logits"].data.clone(),
                "x": self.buf["x"].data.clone(), "events": events, "order": self.order,
                "loaded": self.loaded}

    def nonzero(self) -> dict:
        return {self.sched.counters[i]: int(v) for i, v in enumerate(self.counters) if v}

    def buffers(self, sched) -> dict[str, Tracked]:
        """This step's buffers: activations poisoned; the cache, seq, argmax and pos
        carried over, what this step writes in them poisoned (every layer's slot pos,
        argmax and seq at pos + 1; not pos, the step's input, read before ARGMAX writes
        it: the write-after-read rule orders that). MoE: the router's logits,
        per layer its ids and weights, h per (slot, row), the QKV blocks' q/k squares."""
        s, A = self.spec, 2 * sched.P
        rows = [r for sm in range(sched.P) for r in sched.rows(sm)]
        splits = max([r[SPLITS] for r in rows if r[OP] in (OP_ATTN_PARTIAL, OP_ATTN_FUSED)]
                     or [1])
        k_splits = max([r[SPLITS] for r in rows if r[OP] in (OP_DOWN, OP_EXPERT_DOWN)] or [1])
        n_lm = sum(r[OP] == OP_LM_HEAD for r in rows)
        n_qkv = sum(r[OP] == OP_RMS_QKV and r[LAYER] == 0 for r in rows)
        k = s.top_k
        fresh = {"x": ((s.hidden,), BF16), "qkv": ((s.qkv_size,), BF16),
                 "q": ((s.heads, s.head_dim), BF16), "part_m": ((s.heads, splits), F32),
                 "part_l": ((s.heads, splits), F32), "attn": ((s.q_size,), BF16),
                 "part_o": ((s.heads, splits, s.head_dim), F32),        # per (head, split)
                 "h": ((max(k, 1) * s.intermediate,), BF16),
                 "scratch": ((k_splits, s.hidden), F32),
                 "logits": ((s.vocab,), F32), "lm_val": ((n_lm,), F32),
                 "lm_idx": ((n_lm,), I64), "token": ((1,), I64)}
        if s.qk_norm:
            fresh["qk_ss"] = ((n_qkv, 2), F32)
        if s.is_moe:
            fresh.update(router_logits=((s.experts,), F32), route_ids=((s.layers, k), I64),
                         route_w=((s.layers, k), F32))
        b = {n: Tracked(torch.empty(shape, dtype=dt), A, 2 if n == "part_o" else None)
             for n, (shape, dt) in fresh.items()}
        for t in b.values():
            t.poison()
        pos = int(self.pos)
        for name in ("k_cache", "v_cache"):
            b[name] = Tracked(getattr(self, name), A, 3)          # per (layer, head, slot)
            b[name].poison((slice(None), slice(None), pos))
        for name in ("seq", "argmax", "pos"):
            b[name] = Tracked(getattr(self, name), A)
        b["argmax"].poison((pos + 1,))           # ARGMAX writes them; pos it reads first
        if pos + 1 >= self.prompt_len:
            b["seq"].poison((pos + 1,))
        return b

    # ---- the scheduler -----------------------------------------------------------------------
    def run(self, actors: list, rng: random.Random) -> int:
        """Advance actors picked at random among those that can progress, to the end.
        Readiness is re-checked only where an event can change it: the actor, its SM's
        other actor (the ring) and the actors waiting on a counter it bumped."""
        ready, self.waiting, self.dirty = {}, {}, dict.fromkeys(actors)
        events = 0
        while True:
            for a in self.dirty:                  # dicts: a seed gives one order
                ready.pop(a, None)
                if a.need is not None and self.ready(a):
                    ready[a] = None
                elif a.need is not None and a.need[0] == "wait":
                    self.waiting.setdefault(a.need[1], []).append(a)
            self.dirty = {}
            if not ready:
                break
            a = rng.choice(list(ready))
            del ready[a]
            self.advance(a)
            self.dirty.update(dict.fromkeys((a, a.partner)))
            events += 1
        if any(c.need is not None for c in self.cores):
            raise VMDeadlock("deadlock, no actor can progress: " + "; ".join(self.blocked()))
        return events

    def ready(self, a) -> bool:
        kind = a.need[0]
        if kind == "wait":
            return int(self.counters[a.need[1]]) >= a.need[2]
        if kind == "free":                                    # a loader: stage free?
            return not self.rings[a.sm].full[a.need[1]]
        if kind == "tile":                                    # a compute: its tile there?
            ring, t = self.rings[a.sm], a.need[1]
            st = self.stages[a.sm][t]
            if ring.full[st] and ring.tile[st] != t:
                raise VMHazard(f"{a.where()}: ring stage {st} holds tile {ring.tile[st]}, "
                               f"loaded over tile {t} before it was consumed")
            return ring.full[st]
        return True

    def advance(self, a):
        """Do what ``a`` waited for (an acquire, a tile), run it to its next request."""
        value = None
        if a.need[0] == "wait":
            torch.maximum(a.vc, self.cvc[a.need[1]], out=a.vc)
        elif a.need[0] == "tile":
            value = self.stages[a.sm][a.need[1]]
        try:
            a.need = a.gen.send(value)
        except StopIteration:
            a.need = None

    def blocked(self) -> list[str]:
        out = []
        for c in self.cores + [c.partner for c in self.cores]:
            if c.need and c.need[0] == "wait":
                w, t = c.need[1], c.need[2]
                out.append(f"{c.where()} waits for counter {w} ({self.sched.counters[w]}) "
                           f">= {t}, it is {int(self.counters[w])}")
            elif c.need and isinstance(c, Core):
                out.append(f"{c.where()} waits for ring tile {c.need[1]}")
        return out

    # ---- loaders and cores -------------------------------------------------------------------
    def stage(self, place) -> int:
        """The ring stage of a ("ring", n) or ("hold", j) place of ``loads.stream``."""
        return place[1] % self.S if place[0] == "ring" else self.S + place[1]

    def loader(self, lo: Loader):
        """SM ``lo.sm``'s loader program (``loads.stream``): each tile into its stage
        once free; before an expert instruction's tiles, the router's counter, then the
        ids (tracked reads) that address them."""
        ring, starts = self.rings[lo.sm], []
        for i, r in enumerate(lo.rows):
            starts += [i] * len(tiles(self.sched, r))
        for step in self.streams[lo.sm]:
            if step[0] == "wait":               # the router's counter: its ids are out
                yield ("wait", step[1], step[2])
                continue
            _, t, (name, r0, rows, k0, kl), place = step
            st, lo.i = self.stage(place), starts[t]
            yield ("free", st)
            base, slot = split_slot(name)
            w = self.weight(base)
            if slot is not None:                # the expert the router put in the slot
                w = w[int(self.read(lo, "route_ids", (lo.rows[lo.i][LAYER], slot)))]
            if r0 == TOKEN_ROW:                 # seq[pos]: written by the step before
                r0 = int(self.seq[int(self.pos)])
            ring.data[st, :rows, :kl] = w[r0:r0 + rows, k0:k0 + kl]
            ring.full[st], ring.tile[st] = True, t
            self.loaded[lo.sm] += rows * kl * w.element_size()

    def core(self, c: Core):
        """SM ``c.sm``'s instructions in order: waits, then the op (tiles, store, bump)."""
        for c.i, row in enumerate(c.rows):
            yield STEP
            for w, t in ((row[WAIT0], row[TARGET0]), (row[WAIT1], row[TARGET1])):
                if w != NONE:
                    yield ("wait", w, t)
            yield from OPS[row[OP]](self, c, row)
        c.done_tick = int(c.vc[c.me])

    def finish(self, c: Core, row, *writes, release=None):
        """Store the outputs (each a (buffer, index, value) or a callable), then, a
        separate step, bump: the release."""
        yield STEP
        self.store(c, writes)
        yield STEP
        (release or self.bump)(c, row)
        self.order.append((c.sm, c.i))

    def store(self, c: Core, writes):
        for w in writes:
            w() if callable(w) else self.write(c, *w)

    def bump(self, c: Core, row):
        self.bump_counter(c, row[BUMP])

    def bump_counter(self, c: Core, ctr: int):
        """Add 1 to counter ``ctr`` (NONE: nothing), releasing ``c``'s clock into it."""
        if ctr != NONE:
            c.tick()
            self.counters[ctr] += 1
            self.dirty.update(dict.fromkeys(self.waiting.pop(ctr, [])))
            torch.maximum(self.cvc[ctr], c.vc, out=self.cvc[ctr])

    def acquire(self, c: Core, ctr: int):
        """``c`` read counter ``ctr`` with acquire (an atomic's old value): every access
        released into it is ordered before ``c``'s next."""
        torch.maximum(c.vc, self.cvc[ctr], out=c.vc)

    def reset(self, c: Core, row):
        """ARGMAX's release: every counter back to zero, once every other SM's last bump
        is ordered before this instruction (nothing is left to wait on them)."""
        if c.i != len(c.rows) - 1:
            raise VMHazard(f"{c.where()} resets the counters but is not its SM's last")
        for o in self.cores:
            if o is not c and (o.need is not None or o.done_tick > int(c.vc[o.sm])):
                at = o.where() if o.need is not None else f"SM {o.sm}'s last instruction"
                raise VMHazard(f"{c.where()} resets the counters before {at} is ordered "
                               f"before it")
        self.counters.zero_()
        self.dirty.update(dict.fromkeys(self.cores + [c.partner for c in self.cores]))

    # ---- tracked access ----------------------------------------------------------------------
    def read(self, c: Actor, name: str, idx: tuple) -> torch.Tensor:
        b = self.buf[name]
        c.tick()
        w, wt = b.w_sm[idx], b.w_t[idx]
        if (w == UNWRITTEN).any():
            raise VMHazard(f"{c.where()} reads {fmt(name, idx)} before it is written")
        late = (w >= 0) & (c.vc[w.clamp(min=0)] < wt)
        if late.any():
            raise VMHazard(f"{c.where()} reads {fmt(name, idx)} written by SM "
                           f"{int(w[late].flatten()[0])} with no counter ordering the write first")
        b.reads[(c.me,) + idx] = c.vc[c.me]
        return b.data[idx].clone()

    def write(self, c: Core, name: str, idx: tuple, value):
        b = self.buf[name]
        t = c.tick()
        w, wt = b.w_sm[idx], b.w_t[idx]
        if ((w >= 0) & (c.vc[w.clamp(min=0)] < wt)).any():
            raise VMHazard(f"{c.where()} writes {fmt(name, idx)} unordered with the last write")
        r = b.reads[(slice(None),) + idx]
        late = r > c.vc.view((-1,) + (1,) * (r.dim() - 1))
        if late.any():
            sm = int(late.nonzero()[0, 0])
            raise VMHazard(f"{c.where()} overwrites {fmt(name, idx)} that SM {sm % self.sched.P}"
                           f"{' loader' * (sm >= self.sched.P)} read with no counter ordering "
                           f"the read first (write after read)")
        b.data[idx] = value
        b.w_sm[idx], b.w_t[idx] = c.me, t
        b.reads[(slice(None),) + idx] = 0
