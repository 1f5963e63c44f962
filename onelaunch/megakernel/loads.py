"""What each SM's loader streams: an instruction's weight tiles and its bytes, the
loader's program (hoists, the one wait), the schedule's table, and the invariants a
schedule must keep.

    sched = schedule.build(spec, P=132, ctx=512)
    tiles(sched, row)                        # one instruction's tiles, in compute order
    stream(sched, sm)                        # SM sm's loader program: waits and loads
    table(sched)                             # per op and layer: instructions, SMs, bytes
    check(sched)                             # raises ScheduleError on a broken invariant

Tiles are named by the engine's ``W`` layout; an expert's tile names its router slot
(``SLOT``), which the loader resolves to an expert id once the router's counter is in.
``schedule.build`` balances the SMs on ``row_bytes`` and sets ``HOIST`` with
``set_hoists``.
"""
from __future__ import annotations

from collections import Counter

import torch

from .isa import (ARG, BUMP, BUMP2, HOIST, IDX, K0, KLEN, LAYER, LTARGET, LWAIT, NONE,
                  OP, OP_ARGMAX, OP_ATTN_FUSED, OP_ATTN_PARTIAL, OP_DOWN, OP_EMBED,
                  OP_EXPERT_DOWN, OP_EXPERT_GATE_UP, OP_GATE_UP, OP_LM_HEAD, OP_O_PROJ,
                  OP_RMS_QKV, OP_ROPE_KV, OP_ROUTER, OP_TOPK, OPCODES, ROW0, ROWS, SPLITS,
                  TARGET0, TARGET1, UNIT, WAIT0, WAIT1)
from .lists import Schedule, ScheduleError, split_range

TOKEN_ROW = -1        # a tile's row meaning "the embedding row of this step's token"
SLOT = "@slot"        # "layers.3.w_experts_down@slot5": the expert the router put in slot 5
EXPERT_OPS = (OP_EXPERT_GATE_UP, OP_EXPERT_DOWN)


# ---- an instruction's tiles and bytes -------------------------------------------------
def cuts(start: int, n: int, size: int) -> list[tuple[int, int]]:
    """[start, start + n) cut into (first, length) pieces of ``size`` (the last shorter)."""
    return [(a, min(size, start + n - a)) for a in range(start, start + n, size)]


def slot_pieces(row0: int, rows: int, I: int) -> list[tuple[int, int, int]]:
    """(slot, first row in the slot's expert, rows) of the (slot, row) range [row0,
    row0 + rows)."""
    out, r = [], row0
    while r < row0 + rows:
        j, a = divmod(r, I)
        n = min(I - a, row0 + rows - r)
        out.append((j, a, n))
        r += n
    return out


def tiles(sched: Schedule, row) -> list[tuple[str, int, int, int, int]]:
    """Instruction ``row``'s weight tiles in the order its compute consumes them:
    (tensor name, row0, rows, k0, klen), rows <= TILE_N, klen <= TILE_K. Names are the
    engine's ``W`` layout ("layers.3.w_qkv", "embed", "lm_head")."""
    s, tn, tk = sched.spec, sched.tile_n, sched.tile_k
    op, l = row[OP], row[LAYER]
    if op == OP_EMBED:
        return [("embed", TOKEN_ROW, 1, k0, kl) for k0, kl in cuts(row[ROW0], row[ROWS], tk)]
    I = s.intermediate
    if op == OP_EXPERT_GATE_UP:                 # each (slot, row tile): gate rows, up rows
        return [(f"layers.{l}.w_experts_gate_up{SLOT}{j}", n0 + h, nn, k0, kl)
                for j, a, n in slot_pieces(row[ROW0], row[ROWS], I) for n0, nn in cuts(a, n, tn)
                for k0, kl in cuts(row[K0], row[KLEN], tk) for h in (0, I)]
    if op == OP_EXPERT_DOWN:                    # each row tile: its slots in order, K tiles
        return [(f"layers.{l}.w_experts_down{SLOT}{j}", n0, nn, k0, kl)
                for n0, nn in cuts(row[ROW0], row[ROWS], tn)
                for j in range(row[K0] // I, (row[K0] + row[KLEN]) // I)
                for k0, kl in cuts(0, I, tk)]
    name = {OP_RMS_QKV: f"layers.{l}.w_qkv", OP_O_PROJ: f"layers.{l}.w_o",
            OP_DOWN: f"layers.{l}.w_down", OP_LM_HEAD: "lm_head",
            OP_GATE_UP: f"layers.{l}.w_gate_up", OP_ROUTER: f"layers.{l}.w_router"}.get(op)
    if name is None:
        return []
    halves = (0, s.intermediate) if op == OP_GATE_UP else (0,)   # gate rows, up rows
    return [(name, n0 + h, nn, k0, kl) for n0, nn in cuts(row[ROW0], row[ROWS], tn)
            for k0, kl in cuts(row[K0], row[KLEN], tk) for h in halves]


def split_slot(name: str) -> tuple[str, int | None]:
    """("layers.3.w_experts_down", 5) for "layers.3.w_experts_down@slot5"; (name, None)
    for a tensor the router does not choose."""
    base, _, j = name.partition(SLOT)
    return base, int(j) if j else None


def side_bytes(s, row) -> int:
    """Bytes an instruction reads besides its tiles: its rows of the QKV bias, its heads'
    q/k norm gains, and a norm gain, charged to the op's first instruction (the others
    find it in L2; the experts' gate/up reads the router's)."""
    op = row[OP]
    gain = s.hidden * 2 if op in (OP_RMS_QKV, OP_GATE_UP, OP_LM_HEAD, OP_ROUTER) and \
        row[IDX] == 0 else 0
    bias = row[ROWS] * 2 if op == OP_RMS_QKV and s.qkv_bias else 0
    qk = (s.heads // s.kv_heads + 1) * s.head_dim * 2 if op == OP_ROPE_KV and s.qk_norm else 0
    return gain + bias + qk


def kv_bytes(s, row, ctx: int) -> int:
    """Cache bytes an attention partial reads at ``ctx`` keys (its keys and values)."""
    if row[OP] not in (OP_ATTN_PARTIAL, OP_ATTN_FUSED):
        return 0
    a, b = split_range(ctx, row[ARG], row[SPLITS], row[UNIT])
    return (b - a) * 2 * s.head_dim * 2


def weight_bytes(sched: Schedule, row) -> int:
    """The bytes of the instruction's tiles (the sum over ``tiles``) and its side reads."""
    halves = 2 if row[OP] in (OP_GATE_UP, OP_EXPERT_GATE_UP) else 1
    if row[OP] == OP_EMBED:
        tile_bytes = row[ROWS] * 2
    elif row[OP] in (OP_RMS_QKV, OP_O_PROJ, OP_DOWN, OP_LM_HEAD, OP_GATE_UP, OP_ROUTER,
                     OP_EXPERT_GATE_UP, OP_EXPERT_DOWN):
        tile_bytes = halves * row[ROWS] * row[KLEN] * 2
    else:
        tile_bytes = 0
    return tile_bytes + side_bytes(sched.spec, row)


def weight_bytes_grid(sched: Schedule) -> torch.Tensor:
    """Each instruction's weight bytes, [P, N] (zero past an SM's list): what its loader
    streams for it."""
    out = torch.zeros(sched.instr.shape[:2], dtype=torch.float64)
    for p in range(sched.P):
        for i, r in enumerate(sched.rows(p)):
            out[p, i] = weight_bytes(sched, r)
    return out


def row_bytes(sched: Schedule, row) -> int:
    """Everything the instruction reads from memory at the planned context."""
    return weight_bytes(sched, row) + kv_bytes(sched.spec, row, sched.ctx)


# ---- the loader's program --------------------------------------------------------------
def set_hoists(sched: Schedule, rows: list) -> None:
    """HOIST of the first of each run of loader-waiting instructions in one SM's list:
    as many of the tiles after the run, up to the next loader wait, as ``hold`` stages
    take."""
    for i, r in enumerate(rows):
        if r[LWAIT] == NONE or (i and rows[i - 1][LWAIT] != NONE):
            continue
        j = i
        while j < len(rows) and rows[j][LWAIT] != NONE:
            j += 1
        free = 0
        while j < len(rows) and rows[j][LWAIT] == NONE and free < sched.hold:
            free += len(tiles(sched, rows[j]))
            j += 1
        r[HOIST] = min(free, sched.hold)


def stream(sched: Schedule, sm: int) -> list[tuple]:
    """SM ``sm``'s loader program: ("wait", counter, target) and ("load", t, tile,
    place) steps in the order the loader runs them; t is the tile's index in the compute's
    order (``tiles`` of each instruction in list order), place ("ring", n) the n-th tile
    through the ring or ("hold", j) held stage j. At an instruction with HOIST h, the
    loader first streams the first h tiles of the instructions after its run of
    loader-waiting ones into held stages 0..h-1, then waits for its LWAIT: the loader's
    one wait on data (the router's ids), used to stream what does not depend on it."""
    rows = sched.rows(sm)
    per = [tiles(sched, r) for r in rows]
    start = [0]
    for ts in per:
        start.append(start[-1] + len(ts))
    flat = [tl for ts in per for tl in ts]
    held, waited, out, n = set(), set(), [], 0
    for i, r in enumerate(rows):
        if r[HOIST]:
            j = i
            while rows[j][LWAIT] != NONE:
                j += 1
            for h, t in enumerate(range(start[j], start[j] + r[HOIST])):
                held.add(t)
                out.append(("load", t, flat[t], ("hold", h)))
        if r[LWAIT] != NONE and (r[LWAIT], r[LTARGET]) not in waited:
            waited.add((r[LWAIT], r[LTARGET]))         # once: a counter never falls
            out.append(("wait", r[LWAIT], r[LTARGET]))
        for t in range(start[i], start[i + 1]):
            if t not in held:
                out.append(("load", t, flat[t], ("ring", n)))
                n += 1
    return out


# ---- the table ------------------------------------------------------------------------
def all_rows(sched: Schedule):
    """(sm, index, row) of every instruction."""
    return [(sm, i, r) for sm in range(sched.P) for i, r in enumerate(sched.rows(sm))]


def table(sched: Schedule) -> list[dict]:
    """One row per op and layer, in step order: instructions, SMs used, output rows,
    bytes (weights, and the KV cache at the planned context) and the waits."""
    out: dict = {}
    for sm, _, r in all_rows(sched):
        layer = None if r[LAYER] == NONE else r[LAYER]
        key = (-1 if r[OP] == OP_EMBED else sched.spec.layers if layer is None else layer,
               r[OP])
        d = out.setdefault(key, {"op": OPCODES[r[OP]][3:].lower(), "layer": layer,
                                 "instructions": 0, "sms": set(), "rows": 0, "bytes": 0,
                                 "waits": set(), "stage": 2 ** 31})
        d["stage"] = min(d["stage"], r[BUMP] if r[BUMP] != NONE else 2 ** 31)
        d["instructions"] += 1
        d["sms"].add(sm)
        d["rows"] += r[ROWS]
        d["bytes"] += row_bytes(sched, r)
        for w, t in ((r[WAIT0], r[TARGET0]), (r[WAIT1], r[TARGET1])):
            if w != NONE:
                d["waits"].add(f"{sched.counters[w].split('.')[0]}>={t}")
    # counters are made stage by stage, so a layer's ops sort into step order by the
    # first counter they bump (ARGMAX bumps none: last)
    rows = [out[k] for k in sorted(out, key=lambda k: (k[0], out[k]["stage"], k[1]))]
    for d in rows:
        d["sms"], d["waits"] = len(d["sms"]), ", ".join(sorted(d["waits"]))
        del d["stage"]
    return rows


# ---- invariants -----------------------------------------------------------------------
def check(sched: Schedule) -> None:
    """Raise ScheduleError unless: every wait's target (a loader's too) is the number of
    instructions that bump its counter (all of them, not some), every bumped counter is
    waited on, every expert instruction's loader waits for its layer's top-k, a hoist
    fits the held stages, there is one ARGMAX, last on its SM, and every instruction
    precedes it through the counters and the SMs' program order (so its reset finds
    nothing still to run)."""
    rows = all_rows(sched)
    bumpers = Counter(r[BUMP] for _, _, r in rows if r[BUMP] != NONE)
    # a group's last instruction (the one whose bump completes BUMP) bumps BUMP2: one
    # bump a group; the group's counter is read by that atomic, not waited for
    groups = {(r[BUMP], r[BUMP2]) for _, _, r in rows if r[BUMP2] != NONE}
    bumpers.update(b2 for _, b2 in groups)
    for b, b2 in groups:                          # its last is the one that makes SPLITS
        size = {r[SPLITS] for _, _, r in rows if r[BUMP] == b}
        if size != {bumpers[b]} or sum(g == b for g, _ in groups) != 1:
            raise ScheduleError(f"group {sched.counters[b]}: {bumpers[b]} instructions "
                                f"bump it, SPLITS {sorted(size)}, merge counters "
                                f"{[sched.counters[c] for g, c in groups if g == b]}")
    routes = {r[LAYER]: r[BUMP] for _, _, r in rows if r[OP] == OP_TOPK}
    waited = {b for b, _ in groups}
    for sm, i, r in rows:
        if r[OP] in EXPERT_OPS and (r[LWAIT] != routes.get(r[LAYER]) or r[LWAIT] == NONE):
            raise ScheduleError(f"SM {sm} instruction {i} ({OPCODES[r[OP]]}) reads expert "
                                f"tiles without its loader waiting for the router's counter")
        if not 0 <= r[HOIST] <= sched.hold:
            raise ScheduleError(f"SM {sm} instruction {i} hoists {r[HOIST]} tiles into "
                                f"{sched.hold} held stages")
        for w, t in ((r[WAIT0], r[TARGET0]), (r[WAIT1], r[TARGET1]), (r[LWAIT], r[LTARGET])):
            if w == NONE:
                continue
            waited.add(w)
            if t != bumpers[w]:
                raise ScheduleError(f"SM {sm} instruction {i} ({OPCODES[r[OP]]}) waits for "
                                    f"{sched.counters[w]} >= {t}, but {bumpers[w]} "
                                    f"instructions bump it")
    if set(bumpers) - waited:
        names = [sched.counters[c] for c in sorted(set(bumpers) - waited)]
        raise ScheduleError(f"counters bumped but never waited for: {names}")
    final = [(sm, i) for sm, i, r in rows if r[OP] == OP_ARGMAX]
    if len(final) != 1 or final[0][1] != len(sched.rows(final[0][0])) - 1:
        raise ScheduleError(f"need one ARGMAX, last on its SM; found {final}")
    by_bump: dict[int, list] = {}
    for sm, i, r in rows:
        by_bump.setdefault(r[BUMP], []).append((sm, i))
        if r[BUMP2] != NONE:                      # any of the group may be its last
            by_bump.setdefault(r[BUMP2], []).append((sm, i))
    seen, todo = set(final), list(final)
    while todo:                                   # walk back from ARGMAX
        sm, i = todo.pop()
        r = sched.rows(sm)[i]
        preds = [(sm, i - 1)] if i else []
        for w in (r[WAIT0], r[WAIT1]):
            preds += by_bump.get(w, []) if w != NONE else []
        for p in preds:
            if p not in seen:
                seen.add(p)
                todo.append(p)
    missing = [(sm, i) for sm, i, _ in rows if (sm, i) not in seen]
    if missing:
        raise ScheduleError(f"instructions that do not precede ARGMAX: {missing[:5]}")
