"""The megakernel's instruction format: one row of int32 per instruction, and a typed
constructor per opcode that packs itself into that row.

A schedule is an int32 tensor ``[P, N, WIDTH]``: P lists (one per SM, run in order by
that SM) of at most N instructions, padded with ``OP_END`` rows (zeros). Counters live
in one int32 device tensor; an instruction waits until each named counter is at least
its target (acquire), runs, stores its outputs and only then adds 1 to its bump counter
(release). ``NONE`` (-1) marks an unused counter.

The fields every instruction has are columns ``OP`` (its opcode), ``WAIT0``/``TARGET0``
and ``WAIT1``/``TARGET1`` (up to two (counter, target) waits) and ``BUMP``; ``LWAIT``/
``LTARGET`` is the counter its *loader* waits for before asking for its first tile
(experts: their tiles are addressed by the router's ids) and ``HOIST`` the tiles the
loader streams into held stages before that wait (``loads.set_hoists`` sets it). What
the other columns mean depends on the opcode: each constructor below names them
(``Gemv(row0=..., rows=...)``), ``row()`` packs them and ``decode(row)`` reads them back.
The Gluon kernels read the same constants (``isa.OP_RMS_QKV``, ``isa.ROW0``: module
attributes, so Triton takes them as compile-time ints).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

(OP, LAYER, ROW0, ROWS, K0, KLEN, WAIT0, TARGET0, WAIT1, TARGET1, BUMP, ARG, IDX,
 SPLITS, UNIT, LWAIT, LTARGET, HOIST, BUMP2) = range(19)
WIDTH = 32            # 128-byte rows (one L2 line): fields above, the rest zero
NONE = -1

# opcodes: the dense step
OP_END = 0            # end of this SM's list
OP_RMS_QKV = 1        # rows of qkv = W_qkv @ rmsnorm(x) + b
OP_ROPE_KV = 2        # RoPE on q/k of one kv head group, the new k/v into the cache
OP_ATTN_PARTIAL = 3   # one (kv head, split) of the context: partial softmax state
OP_ATTN_MERGE = 4     # one query head's splits merged into attn
OP_O_PROJ = 5         # rows of x += W_o @ attn
OP_GATE_UP = 6        # rows of h = silu(W_g @ xn) * (W_u @ xn), xn = rmsnorm(x)
OP_DOWN = 7           # rows (x K split) of x += W_down @ h
OP_LM_HEAD = 8        # rows of the logits: this instruction's best (value, index)
OP_ARGMAX = 9         # the step's token from every LM-head instruction's best
OP_EMBED = 10         # columns of x from the embedding row of the step's token
# the mixture of experts
OP_ROUTER = 11        # rows of the router's logits = W_r @ rmsnorm(x)
OP_TOPK = 12          # softmax over the logits, the top-k ids and routing weights
OP_EXPERT_GATE_UP = 13  # (slot, rows) of h = silu(W_g[id] @ xn) * (W_u[id] @ xn)
OP_EXPERT_DOWN = 14   # rows (x a group of slots) of x += sum_j w_j W_down[id_j] @ h_j
# the one-launch kernel's attention with fewer stages a layer
OP_ATTN_FUSED = 15    # RoPE + partial (the "two" form: the last split of a kv head merges)

Wait = tuple[int, int]          # (counter, target)


@dataclass(frozen=True, kw_only=True)
class Instr:
    """An instruction: the counters it waits for (at most two), the one it bumps."""
    OPCODE: ClassVar[int]
    COLUMNS: ClassVar[dict[str, int]] = {}      # this opcode's fields: name -> column
    FIXED: ClassVar[dict[int, int]] = {}        # columns this opcode always sets
    waits: tuple[Wait, ...] = ()
    bump: int = NONE

    def __post_init__(self):
        object.__setattr__(self, "waits", tuple(tuple(w) for w in self.waits))
        if len(self.waits) > 2:
            raise ValueError(f"{type(self).__name__}: at most two waits, got {self.waits}")

    def row(self) -> list[int]:
        """The instruction as its int32 row of WIDTH fields."""
        r = [0] * WIDTH
        r[LAYER] = r[WAIT0] = r[WAIT1] = r[LWAIT] = r[BUMP2] = NONE
        r[OP], r[BUMP] = self.OPCODE, self.bump
        for (c, t), (wc, tc) in zip(self.waits, ((WAIT0, TARGET0), (WAIT1, TARGET1))):
            r[wc], r[tc] = c, t
        for col, v in self.FIXED.items():
            r[col] = v
        for name, col in self.COLUMNS.items():
            v = getattr(self, name)
            if isinstance(v, tuple):                  # lwait: (counter, target)
                r[col], r[col + 1] = v
            else:
                r[col] = v
        return r


def decode(row) -> Instr:
    """The typed instruction an int32 row holds (``Instr.row``'s inverse)."""
    cls = CONSTRUCTORS[int(row[OP])]
    kw = {name: ((int(row[col]), int(row[col + 1])) if col == LWAIT else int(row[col]))
          for name, col in cls.COLUMNS.items()}
    waits = tuple((int(row[c]), int(row[t])) for c, t in ((WAIT0, TARGET0), (WAIT1, TARGET1))
                  if row[c] != NONE)
    return cls(waits=waits, bump=int(row[BUMP]), **kw)


GEMV = {"layer": LAYER, "row0": ROW0, "rows": ROWS, "k0": K0, "klen": KLEN, "idx": IDX}


@dataclass(frozen=True, kw_only=True)
class Embed(Instr):
    """x[row0:row0 + rows] = E[seq[pos], row0:row0 + rows]."""
    OPCODE = OP_EMBED
    COLUMNS = {"row0": ROW0, "rows": ROWS}
    row0: int
    rows: int


@dataclass(frozen=True, kw_only=True)
class Gemv(Instr):
    """Output rows [row0, row0 + rows) of a GEMV over K [k0, k0 + klen) (all of it), the
    ``idx``-th instruction of its op and layer. ``op``: RMS_QKV (rows of qkv = W_qkv @
    rmsnorm(x) + b; with the q/k norm it also stores its rows' sums of squares of q and of
    k, row ``idx`` of a [blocks, 2] partial), O_PROJ (x rows += W_o rows @ attn), GATE_UP
    (h channels: gate rows r and up rows I + r, SwiGLU), ROUTER (router logits = W_r rows
    @ rmsnorm(x)) or LM_HEAD (logits rows; its best (value, index) into slot ``idx``;
    ``layer`` NONE)."""
    OPCODE = NONE                                 # the row's OP is ``op``
    COLUMNS = {"op": OP, **GEMV}
    OPS: ClassVar = (OP_RMS_QKV, OP_O_PROJ, OP_GATE_UP, OP_LM_HEAD, OP_ROUTER)
    op: int
    layer: int
    row0: int
    rows: int
    k0: int = 0
    klen: int
    idx: int

    def __post_init__(self):
        super().__post_init__()
        if self.op not in self.OPS:
            raise ValueError(f"Gemv: op {self.op} is not one of {self.OPS}")


@dataclass(frozen=True, kw_only=True)
class RopeKv(Instr):
    """RoPE on kv head ``kv_head``'s G query heads and its key at slot pos, the new key
    and value into the cache. With the q/k norm, ``splits`` is the count of QKV blocks
    whose partial squares it sums in order (the statistic over the whole projection)."""
    OPCODE = OP_ROPE_KV
    COLUMNS = {"layer": LAYER, "kv_head": ROW0, "idx": IDX, "splits": SPLITS}
    FIXED = {ROWS: 1}
    layer: int
    kv_head: int
    idx: int
    splits: int = 0


@dataclass(frozen=True, kw_only=True)
class AttnPartial(Instr):
    """Split ``split`` of ``splits`` of kv head ``kv_head``'s keys for its ``heads`` query
    heads: their running max, sum of exp and output. The keys it reads come from pos at
    run time, the live length counted in ``unit`` positions (``lists.split_range``)."""
    OPCODE = OP_ATTN_PARTIAL
    COLUMNS = {"layer": LAYER, "kv_head": ROW0, "heads": ROWS, "split": ARG, "idx": IDX,
               "splits": SPLITS, "unit": UNIT}
    layer: int
    kv_head: int
    heads: int
    split: int
    idx: int
    splits: int
    unit: int


@dataclass(frozen=True, kw_only=True)
class AttnFused(AttnPartial):
    """RoPE + partial in one (the one-launch kernel's "three" and "two" forms): waits for
    all of QKV, RoPEs its queries and the new key itself, the split whose keys hold pos
    writes the new k/v into the cache, then the partial as ATTN_PARTIAL; it bumps BUMP.
    With a ``bump2`` ("two"), that bump is an acquire and release, and the one that brings
    it to ``splits`` merges the kv head's query heads into attn and bumps ``bump2``;
    without (NONE, "three"), ATTN_MERGE instructions merge."""
    OPCODE = OP_ATTN_FUSED
    COLUMNS = {**AttnPartial.COLUMNS, "bump2": BUMP2}
    bump2: int = NONE


@dataclass(frozen=True, kw_only=True)
class AttnMerge(Instr):
    """Query head ``head``'s live partials (of ``splits``, counted in ``unit``) merged
    into attn."""
    OPCODE = OP_ATTN_MERGE
    COLUMNS = {"layer": LAYER, "head": ROW0, "idx": IDX, "splits": SPLITS, "unit": UNIT}
    FIXED = {ROWS: 1}
    layer: int
    head: int
    idx: int
    splits: int
    unit: int


@dataclass(frozen=True, kw_only=True)
class Down(Instr):
    """x rows [row0, row0 + rows), K split ``split`` of ``splits`` = [k0, k0 + klen): the
    splits before the last store fp32 partials, the last adds them to x."""
    OPCODE = OP_DOWN
    COLUMNS = {**GEMV, "split": ARG, "splits": SPLITS}
    layer: int
    row0: int
    rows: int
    k0: int
    klen: int
    split: int
    idx: int
    splits: int


@dataclass(frozen=True, kw_only=True)
class Argmax(Instr):
    """The token from the ``n_best`` LM-head instructions' bests; then resets every
    counter to zero (the VM's rule, checked there: every other SM's last bump ordered
    before it; the Gluon kernels reset when their last CTA leaves, a later point)."""
    OPCODE = OP_ARGMAX
    COLUMNS = {"n_best": ROWS}
    n_best: int


@dataclass(frozen=True, kw_only=True)
class Topk(Instr):
    """Softmax over the layer's ``experts`` router logits, top-k (no renormalisation,
    ties to the lower expert index) into the layer's ids and routing weights."""
    OPCODE = OP_TOPK
    COLUMNS = {"layer": LAYER, "experts": ROWS}
    layer: int
    experts: int


@dataclass(frozen=True, kw_only=True)
class ExpertGateUp(Instr):
    """Rows [row0, row0 + rows) of h over (slot, row) = slot * I + row: each slot's rows
    of its expert's gate and up (+ SwiGLU). ``lwait``: the router's counter, which its
    loader waits for before it reads the ids that address the tiles."""
    OPCODE = OP_EXPERT_GATE_UP
    COLUMNS = {**GEMV, "lwait": LWAIT}
    layer: int
    row0: int
    rows: int
    k0: int = 0
    klen: int
    idx: int
    lwait: Wait


@dataclass(frozen=True, kw_only=True)
class ExpertDown(Instr):
    """x rows [row0, row0 + rows), slots [k0 / I, (k0 + klen) / I) (the K of (slot, I)),
    group ``group`` of ``splits``: each slot's rows x its routing weight, summed in slot
    order; earlier groups store fp32 partials, the last adds them in group order to x."""
    OPCODE = OP_EXPERT_DOWN
    COLUMNS = {**GEMV, "group": ARG, "splits": SPLITS, "lwait": LWAIT}
    layer: int
    row0: int
    rows: int
    k0: int
    klen: int
    group: int
    idx: int
    splits: int
    lwait: Wait


CONSTRUCTORS = {OP_EMBED: Embed, OP_RMS_QKV: Gemv, OP_O_PROJ: Gemv, OP_GATE_UP: Gemv,
                OP_LM_HEAD: Gemv, OP_ROUTER: Gemv, OP_ROPE_KV: RopeKv,
                OP_ATTN_PARTIAL: AttnPartial, OP_ATTN_FUSED: AttnFused,
                OP_ATTN_MERGE: AttnMerge, OP_DOWN: Down, OP_ARGMAX: Argmax, OP_TOPK: Topk,
                OP_EXPERT_GATE_UP: ExpertGateUp, OP_EXPERT_DOWN: ExpertDown}
OPCODES = {OP_END: "OP_END", OP_RMS_QKV: "OP_RMS_QKV", OP_ROPE_KV: "OP_ROPE_KV",
           OP_ATTN_PARTIAL: "OP_ATTN_PARTIAL", OP_ATTN_MERGE: "OP_ATTN_MERGE",
           OP_O_PROJ: "OP_O_PROJ", OP_GATE_UP: "OP_GATE_UP", OP_DOWN: "OP_DOWN",
           OP_LM_HEAD: "OP_LM_HEAD", OP_ARGMAX: "OP_ARGMAX", OP_EMBED: "OP_EMBED",
           OP_ROUTER: "OP_ROUTER", OP_TOPK: "OP_TOPK", OP_EXPERT_GATE_UP: "OP_EXPERT_GATE_UP",
           OP_EXPERT_DOWN: "OP_EXPERT_DOWN", OP_ATTN_FUSED: "OP_ATTN_FUSED"}


def field_names(cls: type[Instr]) -> list[str]:
    """The constructor's own field names (past ``waits`` and ``bump``)."""
    return [f.name for f in fields(cls) if f.name not in ("waits", "bump")]
