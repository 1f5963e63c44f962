"""A CPU model of the megakernel: runs a schedule's instruction tensor with torch ops, in
a random order that respects only the counters and the rings. The CPU suite's check of
the schedule (Gluon does not run on a CPU).

    m = Machine(spec, weights, max_ctx)      # packed weights, KV cache, seq / pos
    m.start(ids, pos)                        # like Engine.start (pos: the step's slot)
    out = m.step(sched, seed)                # {"token", "logits", "x", "events", "order"}

Each SM is two actors. Its loader copies tile t of the SM's stream (``schedule.tiles``
of each instruction, in list order) into ring stage t % S once that stage is free: it
never waits on data. Its compute waits for each counter's target, takes each tile from
its stage once full (a stage holding a later tile was reused too early: reported),
computes, frees the stage, then stores, then bumps (separate steps: a bump before its
store shows). A seeded scheduler picks at random among actors that can progress; when
none can before the end, ``VMDeadlock`` names each blocked SM, instruction and counter.

Hazards: at each step start the activations (and every layer's KV slot pos) are
poisoned with NaN and marked unwritten. Each compute keeps a vector clock (a tick per
access or bump); a bump releases it into the counter, a satisfied wait acquires it. A
read must find every element written this step, by an access ordered before it; a
write must be ordered after the last write and every read since (write after read).
Else ``VMHazard``. ARGMAX's reset needs every SM's last bump ordered before it; at the
end every counter must be zero.

Numerics follow the kernels' rounding points (``kernels/_common.py``): bf16 activations,
fp32 sums, each projection rounded to bf16, then the residual add rounded; split-K
attention in fp32 with bf16 probabilities into P @ V, as ``attention_splitk``.
"""
from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from ..oracle import apply_rope, rms_norm, rope_cos_sin
from ..specs import get_spec
from ..weights import pack_weights
from .isa import (ARG, BUMP, IDX, K0, KLEN, LAYER, NONE, OP, OP_ATTN_PARTIAL, OP_DOWN,
                  OP_END, OP_LM_HEAD, OPCODES, ROW0, ROWS, SPLITS, TARGET0, TARGET1, UNIT,
                  WAIT0, WAIT1)
from .schedule import TOKEN_ROW, split_range, tiles

BF16, F32, I64 = torch.bfloat16, torch.float32, torch.int64
UNWRITTEN, BEFORE = -1, -2        # an element's writer: none yet this step / an earlier step
STEP = ("step",)
ALL = (slice(None),)


class VMError(RuntimeError):
    """The schedule broke a rule of the machine."""


class VMDeadlock(VMError):
    """No actor can progress before the end of the step."""


class VMHazard(VMError):
    """A read or write not ordered by the counters, or a ring stage misused."""


class Tracked:
    """A buffer with, per element (per row when ``dims`` < its rank: the KV cache's
    positions), the SM and tick of its last write this step and each SM's last read."""

    def __init__(self, data: torch.Tensor, P: int, dims: int | None = None):
        self.data = data
        shape = tuple(data.shape[:dims if dims is not None else data.dim()])
        self.w_sm = torch.full(shape, BEFORE, dtype=I64)
        self.w_t = torch.zeros(shape, dtype=I64)
        self.reads = torch.zeros((P,) + shape, dtype=I64)

    def poison(self, idx=ALL):
        self.data[idx] = float("nan") if self.data.is_floating_point() else -1
        self.w_sm[idx] = UNWRITTEN


class Core:
    """One SM's compute partition: its list, vector clock, place and tile count."""

    def __init__(self, sm: int, rows: list, P: int):
        self.sm, self.rows, self.i, self.t = sm, rows, 0, 0
        self.vc = torch.zeros(P, dtype=I64)
        self.need = self.gen = self.done_tick = self.partner = None

    def tick(self) -> int:
        self.vc[self.sm] += 1
        return int(self.vc[self.sm])

    def where(self) -> str:
        r = self.rows[self.i]
        return (f"SM {self.sm} instruction {self.i} ({OPCODES[r[OP]]} layer {r[LAYER]} "
                f"row {r[ROW0]} idx {r[IDX]})")


class Loader:
    """One SM's loader partition; ``partner``: its compute (and back)."""

    def __init__(self, sm: int, core: Core, gen):
        self.sm, self.partner, core.partner, self.gen = sm, core, self, gen
        self.need = next(gen, None)


class Ring:
    """One SM's S shared-memory stages of TILE_N x TILE_K bf16, each empty or full."""

    def __init__(self, S: int, tile_n: int, tile_k: int):
        self.data = torch.zeros((S, tile_n, tile_k), dtype=BF16)
        self.full, self.tile = [False] * S, [-1] * S


def fmt(name: str, idx: tuple) -> str:
    """``x[0:96]``: a buffer and an index, for messages."""
    part = lambda i: f"{i.start or 0}:{'' if i.stop is None else i.stop}" if isinstance(i, slice) \
        else str(i)
    return f"{name}[{', '.join(map(part, idx))}]"


def rms(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    """rmsnorm(x) * g as HF and the kernels round it (bf16(bf16(x * rstd) * g)), fp32."""
    return rms_norm(x, g, eps).float()


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
        self.cvc = torch.zeros((len(sched.counters), P), dtype=I64)
        self.buf = self.buffers(sched)
        self.cores = [Core(sm, sched.rows(sm), P) for sm in range(P)]
        self.order = []                                   # (sm, i) as instructions end
        self.rings = [Ring(self.S, sched.tile_n, sched.tile_k) for _ in range(P)]
        loaders = [Loader(sm, self.cores[sm], self.loader(sm)) for sm in range(P)]
        for c in self.cores:
            c.gen = self.core(c)
            c.need = next(c.gen)
        events = self.run(self.cores + loaders, random.Random(seed))
        if self.counters.any():
            raise VMError(f"counters not zero at the end of the step: {self.nonzero()}")
        return {"token": int(self.buf["token"].data[0]), "logits": self.buf["logits"].data.clone(),
                "x": self.buf["x"].data.clone(), "events": events, "order": self.order}

    def nonzero(self) -> dict:
        return {self.sched.counters[i]: int(v) for i, v in enumerate(self.counters) if v}

    def buffers(self, sched) -> dict[str, Tracked]:
        """This step's buffers: activations poisoned; the cache, seq and pos carried over
        (every layer's slot pos poisoned: this step writes it)."""
        s, P = self.spec, sched.P
        rows = [r for sm in range(P) for r in sched.rows(sm)]
        splits = max([r[SPLITS] for r in rows if r[OP] == OP_ATTN_PARTIAL] or [1])
        k_splits = max([r[SPLITS] for r in rows if r[OP] == OP_DOWN] or [1])
        n_lm = sum(r[OP] == OP_LM_HEAD for r in rows)
        fresh = {"x": ((s.hidden,), BF16), "qkv": ((s.qkv_size,), BF16),
                 "q": ((s.heads, s.head_dim), BF16), "part_m": ((s.heads, splits), F32),
                 "part_l": ((s.heads, splits), F32), "attn": ((s.q_size,), BF16),
                 "part_o": ((s.heads, splits, s.head_dim), F32),        # per (head, split)
                 "h": ((s.intermediate,), BF16), "scratch": ((k_splits, s.hidden), F32),
                 "logits": ((s.vocab,), F32), "lm_val": ((n_lm,), F32),
                 "lm_idx": ((n_lm,), I64), "token": ((1,), I64)}
        b = {k: Tracked(torch.empty(shape, dtype=dt), P, 2 if k == "part_o" else None)
             for k, (shape, dt) in fresh.items()}
        for t in b.values():
            t.poison()
        pos = int(self.pos)
        for name in ("k_cache", "v_cache"):
            b[name] = Tracked(getattr(self, name), P, 3)          # per (layer, head, slot)
            b[name].poison((slice(None), slice(None), pos))
        for name in ("seq", "argmax", "pos"):
            b[name] = Tracked(getattr(self, name), P)
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
            st = t % self.S
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
            value = a.need[1] % self.S
        try:
            a.need = a.gen.send(value)
        except StopIteration:
            a.need = None

    def blocked(self) -> list[str]:
        out = []
        for c in self.cores:
            if c.need and c.need[0] == "wait":
                w, t = c.need[1], c.need[2]
                out.append(f"{c.where()} waits for counter {w} ({self.sched.counters[w]}) "
                           f">= {t}, it is {int(self.counters[w])}")
            elif c.need:
                out.append(f"{c.where()} waits for ring tile {c.need[1]}")
        return out

    # ---- loaders and cores -------------------------------------------------------------------
    def loader(self, sm: int):
        """SM ``sm``'s tile stream into its ring; waits only for a free stage."""
        ring = self.rings[sm]
        stream = [tl for r in self.cores[sm].rows for tl in tiles(self.sched, r)]
        for t, (name, r0, rows, k0, kl) in enumerate(stream):
            st = t % self.S
            yield ("free", st)
            if r0 == TOKEN_ROW:                 # seq[pos]: written by the step before
                r0 = int(self.seq[int(self.pos)])
            ring.data[st, :rows, :kl] = self.weight(name)[r0:r0 + rows, k0:k0 + kl]
            ring.full[st], ring.tile[st] = True, t

    def core(self, c: Core):
        """SM ``c.sm``'s instructions in order: waits, then the op (tiles, store, bump)."""
        for c.i, row in enumerate(c.rows):
            yield STEP
            for w, t in ((row[WAIT0], row[TARGET0]), (row[WAIT1], row[TARGET1])):
                if w != NONE:
                    yield ("wait", w, t)
            yield from OPS[row[OP]](self, c, row)
        c.done_tick = int(c.vc[c.sm])

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
        if row[BUMP] != NONE:
            c.tick()
            self.counters[row[BUMP]] += 1
            self.dirty.update(dict.fromkeys(self.waiting.pop(row[BUMP], [])))
            torch.maximum(self.cvc[row[BUMP]], c.vc, out=self.cvc[row[BUMP]])

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
    def read(self, c: Core, name: str, idx: tuple) -> torch.Tensor:
        b = self.buf[name]
        c.tick()
        w, wt = b.w_sm[idx], b.w_t[idx]
        if (w == UNWRITTEN).any():
            raise VMHazard(f"{c.where()} reads {fmt(name, idx)} before it is written")
        late = (w >= 0) & (c.vc[w.clamp(min=0)] < wt)
        if late.any():
            raise VMHazard(f"{c.where()} reads {fmt(name, idx)} written by SM "
                           f"{int(w[late].flatten()[0])} with no counter ordering the write first")
        b.reads[(c.sm,) + idx] = c.vc[c.sm]
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
            raise VMHazard(f"{c.where()} overwrites {fmt(name, idx)} that SM {sm} read with "
                           f"no counter ordering the read first (write after read)")
        b.data[idx] = value
        b.w_sm[idx], b.w_t[idx] = c.sm, t
        b.reads[(slice(None),) + idx] = 0

    # ---- the ops -----------------------------------------------------------------------------
    def consume(self, c: Core, row, use):
        """Each weight tile of the instruction from its ring stage, in stream order:
        ``use(tile, data)`` then the stage is freed."""
        ring = self.rings[c.sm]
        for tile in tiles(self.sched, row):
            st = yield ("tile", c.t)
            use(tile, ring.data[st, :tile[2], :tile[4]])
            ring.full[st] = False
            c.t += 1

    def gemv(self, c: Core, row, x: torch.Tensor, n: int, at=None):
        """fp32 [n]: the instruction's tiles times x (x covers [K0, K0 + KLEN));
        ``at(weight row)``: where a tile's rows land (default: row - ROW0)."""
        y = torch.zeros(n, dtype=F32)
        at = at or (lambda wr: wr - row[ROW0])

        def use(tile, w):
            _, n0, rows, k0, kl = tile
            y[at(n0):at(n0) + rows] += w.float() @ x[k0 - row[K0]:k0 - row[K0] + kl]
        yield from self.consume(c, row, use)
        return y

    def op_embed(self, c, row):
        r0, n = row[ROW0], row[ROWS]
        x = torch.empty(n, dtype=BF16)
        yield from self.consume(c, row, lambda tl, w: x.__setitem__(
            slice(tl[3] - r0, tl[3] - r0 + tl[4]), w[0]))
        yield from self.finish(c, row, ("x", (slice(r0, r0 + n),), x))

    def op_rms_qkv(self, c, row):
        L, r0, n = self.W["layers"][row[LAYER]], row[ROW0], row[ROWS]
        xn = rms(self.read(c, "x", ALL), L["input_norm"], self.spec.rms_eps)
        y = (yield from self.gemv(c, row, xn, n)).to(BF16)
        if L["b_qkv"] is not None:                      # bf16(bf16(W @ xn) + b)
            y = (y.float() + L["b_qkv"][r0:r0 + n].float()).to(BF16)
        yield from self.finish(c, row, ("qkv", (slice(r0, r0 + n),), y))

    def op_rope_kv(self, c, row):
        s, l, kh = self.spec, row[LAYER], row[ROW0]
        D, g = s.head_dim, s.heads // s.kv_heads
        pos = int(self.read(c, "pos", (0,)))
        at = lambda off, i, n: (slice(off + i * D, off + (i + n) * D),)
        q = self.read(c, "qkv", at(0, kh * g, g)).view(1, g, D)
        k = self.read(c, "qkv", at(s.q_size, kh, 1)).view(1, 1, D)
        v = self.read(c, "qkv", at(s.q_size + s.kv_size, kh, 1))
        cos, sin = self.cos[pos:pos + 1], self.sin[pos:pos + 1]        # HF's bf16 RoPE
        q, k = apply_rope(q, cos, sin)[0], apply_rope(k, cos, sin)[0, 0]
        yield from self.finish(c, row, ("q", (slice(kh * g, kh * g + g),), q),
                               ("k_cache", (l, kh, pos), k), ("v_cache", (l, kh, pos), v))

    def op_attn_partial(self, c, row):
        s, l, kh, g, sp = self.spec, row[LAYER], row[ROW0], row[ROWS], row[ARG]
        pos = int(self.read(c, "pos", (0,)))
        a, b = split_range(pos + 1, sp, row[SPLITS], row[UNIT])     # this step's share
        heads = (slice(kh * g, kh * g + g), sp)
        q = self.read(c, "q", heads[:1]).float()                        # [g, D]
        m, lsum, o = torch.full((g,), float("-inf")), torch.zeros(g), torch.zeros(g, s.head_dim)
        if a < b:
            K = self.read(c, "k_cache", (l, kh, slice(a, b))).float()   # [T, D]
            V = self.read(c, "v_cache", (l, kh, slice(a, b))).float()
            sc = (q @ K.T) * s.head_dim ** -0.5                         # [g, T]
            m = sc.amax(1)
            p = torch.exp(sc - m[:, None])
            lsum, o = p.sum(1), p.to(BF16).float() @ V
        yield from self.finish(c, row, ("part_m", heads, m), ("part_l", heads, lsum),
                               ("part_o", heads, o))

    def op_attn_merge(self, c, row):
        h, n, D = row[ROW0], row[SPLITS], self.spec.head_dim
        m, lsum, o = (self.read(c, k, (h, slice(0, n))) for k in ("part_m", "part_l", "part_o"))
        w = torch.exp(m - m.max())                                      # [splits]
        out = ((w[:, None] * o).sum(0) / (w * lsum).sum()).to(BF16)
        yield from self.finish(c, row, ("attn", (slice(h * D, h * D + D),), out))

    def residual(self, c, rows: slice, y: torch.Tensor):
        """x[rows] = bf16(x + bf16(y)): the projection rounded, then the residual add."""
        x = self.read(c, "x", (rows,)).float()
        self.write(c, "x", (rows,), (x + y.to(BF16).float()).to(BF16))

    def op_o_proj(self, c, row):
        r0, n = row[ROW0], row[ROWS]
        y = yield from self.gemv(c, row, self.read(c, "attn", ALL).float(), n)
        yield from self.finish(c, row, lambda: self.residual(c, slice(r0, r0 + n), y))

    def op_gate_up(self, c, row):
        L, r0, n, I = self.W["layers"][row[LAYER]], row[ROW0], row[ROWS], self.spec.intermediate
        xn = rms(self.read(c, "x", ALL), L["post_norm"], self.spec.rms_eps)
        y = yield from self.gemv(c, row, xn, 2 * n,                # gate rows, then up rows
                                 lambda wr: wr - r0 if wr < I else n + wr - I - r0)
        h = F.silu(y[:n].to(BF16)) * y[n:].to(BF16)                 # bf16 SwiGLU, as HF
        yield from self.finish(c, row, ("h", (slice(r0, r0 + n),), h))

    def op_down(self, c, row):
        r0, n, k0, sp, S = row[ROW0], row[ROWS], row[K0], row[ARG], row[SPLITS]
        rs = slice(r0, r0 + n)
        y = yield from self.gemv(c, row, self.read(c, "h", (slice(k0, k0 + row[KLEN]),)).float(), n)
        if sp < S - 1:                                  # an earlier split: its partial
            yield from self.finish(c, row, ("scratch", (sp, rs), y))
            return
        total = torch.zeros(n)
        for part in [self.read(c, "scratch", (j, rs)) for j in range(S - 1)] + [y]:
            total += part                               # in split order
        yield from self.finish(c, row, lambda: self.residual(c, rs, total))

    def op_lm_head(self, c, row):
        r0, n, i = row[ROW0], row[ROWS], row[IDX]
        xn = rms(self.read(c, "x", ALL), self.W["norm"], self.spec.rms_eps)
        y = (yield from self.gemv(c, row, xn, n)).to(BF16).float()
        best = y.max()
        at = r0 + int((y == best).nonzero()[0, 0])      # the lowest index among equals
        yield from self.finish(c, row, ("logits", (slice(r0, r0 + n),), y),
                               ("lm_val", (i,), best), ("lm_idx", (i,), at))

    def op_argmax(self, c, row):
        vals, idxs = self.read(c, "lm_val", ALL), self.read(c, "lm_idx", ALL)
        best = 0
        for j in range(1, row[ROWS]):                   # slots in row order: on a tie the
            if vals[j] > vals[best]:                    # earlier (lower index) slot wins
                best = j
        tok, pos = int(idxs[best]), int(self.read(c, "pos", (0,)))
        seq = [("seq", (pos + 1,), tok)] if pos + 1 >= self.prompt_len else []  # past the prompt
        yield from self.finish(c, row, ("token", (0,), tok), ("argmax", (pos + 1,), tok), *seq,
                               ("pos", (0,), pos + 1), release=self.reset)


OPS = {op: getattr(Machine, name.lower()) for op, name in OPCODES.items() if op != OP_END}
