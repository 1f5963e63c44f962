"""The VM's ops: each opcode's torch math, as a generator the compute actor runs.

``op_x(m, c, row)`` computes instruction ``row`` on core ``c`` of machine ``m``
(``vm.Machine``): tracked reads (``m.read``), the instruction's weight tiles from its ring
stages in stream order (``consume``: each a request the scheduler answers), then
``m.finish`` (stores, then the bump). ``OPS`` maps an opcode to its function.

Numerics follow the kernels' rounding points (``kernels/_common.py``): bf16 activations,
fp32 sums, each projection rounded to bf16, then the residual add rounded; split-K
attention in fp32 with bf16 probabilities into P @ V, as ``attention_splitk``. The
mixture of experts as ``kernels/moe_router.py`` and ``moe_experts.py``: bf16 router
logits, an fp32 softmax, top-k as rounds of "largest, lowest index among equals", the
weights rounded to bf16 and not renormalised; each slot's down rows bf16(bf16(W @ h) x
w), summed in slot order in fp32, then the residual. OLMoE's q/k norm: the statistic of
the whole q (k) from the QKV blocks' partial squares, summed in block order.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..oracle import apply_rope, rms_norm
from .isa import (ARG, BUMP, BUMP2, IDX, K0, KLEN, LAYER, NONE, OP_ARGMAX, OP_ATTN_FUSED,
                  OP_ATTN_MERGE, OP_ATTN_PARTIAL, OP_DOWN, OP_EMBED, OP_EXPERT_DOWN,
                  OP_EXPERT_GATE_UP, OP_GATE_UP, OP_LM_HEAD, OP_O_PROJ, OP_RMS_QKV,
                  OP_ROPE_KV, OP_ROUTER, OP_TOPK, ROW0, ROWS, SPLITS, UNIT)
from .lists import split_range
from .loads import split_slot, tiles

BF16, F32, I64 = torch.bfloat16, torch.float32, torch.int64
ALL = (slice(None),)
STEP = ("step",)      # a scheduling point: the VM may switch actors here


def rms(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    """rmsnorm(x) * g as HF and the kernels round it (bf16(bf16(x * rstd) * g)), fp32."""
    return rms_norm(x, g, eps).float()


def consume(m, c, row, use):
    """Each weight tile of the instruction from its ring stage, in stream order:
    ``use(tile, data)`` then the stage is freed."""
    ring = m.rings[c.sm]
    for tile in tiles(m.sched, row):
        st = yield ("tile", c.t)
        use(tile, ring.data[st, :tile[2], :tile[4]])
        ring.full[st] = False
        c.t += 1


def gemv(m, c, row, x: torch.Tensor, n: int, at=None):
    """fp32 [n]: the instruction's tiles times x (x covers [K0, K0 + KLEN));
    ``at(weight row)``: where a tile's rows land (default: row - ROW0)."""
    y = torch.zeros(n, dtype=F32)
    at = at or (lambda wr: wr - row[ROW0])

    def use(tile, w):
        _, n0, rows, k0, kl = tile
        y[at(n0):at(n0) + rows] += w.float() @ x[k0 - row[K0]:k0 - row[K0] + kl]
    yield from consume(m, c, row, use)
    return y


def residual(m, c, rows: slice, y: torch.Tensor):
    """x[rows] = bf16(x + bf16(y)): the projection rounded, then the residual add."""
    x = m.read(c, "x", (rows,)).float()
    m.write(c, "x", (rows,), (x + y.to(BF16).float()).to(BF16))


def layer(m, row) -> dict:
    return m.W["layers"][row[LAYER]]


# ---- the dense step ---------------------------------------------------------------------
def op_embed(m, c, row):
    r0, n = row[ROW0], row[ROWS]
    x = torch.empty(n, dtype=BF16)
    yield from consume(m, c, row, lambda tl, w: x.__setitem__(
        slice(tl[3] - r0, tl[3] - r0 + tl[4]), w[0]))
    yield from m.finish(c, row, ("x", (slice(r0, r0 + n),), x))


def op_rms_qkv(m, c, row):
    s, L, r0, n = m.spec, layer(m, row), row[ROW0], row[ROWS]
    xn = rms(m.read(c, "x", ALL), L["input_norm"], s.rms_eps)
    y = (yield from gemv(m, c, row, xn, n)).to(BF16)
    if L["b_qkv"] is not None:                      # bf16(bf16(W @ xn) + b)
        y = (y.float() + L["b_qkv"][r0:r0 + n].float()).to(BF16)
    out = [("qkv", (slice(r0, r0 + n),), y)]
    if s.qk_norm:                                   # its rows' squares of q and of k
        sq, at = y.float() ** 2, torch.arange(r0, r0 + n)
        ss = torch.stack([sq[at < s.q_size].sum(),
                          sq[(at >= s.q_size) & (at < s.q_size + s.kv_size)].sum()])
        out.append(("qk_ss", (row[IDX],), ss))
    yield from m.finish(c, row, *out)


def qk_normed(m, c, row, q, k):
    """OLMoE: q and k RMS-normalised over the whole projection (HF's rounding), the
    statistic summed from the QKV blocks' partial squares in block order."""
    s, L, kh = m.spec, layer(m, row), row[ROW0]
    g, D = s.heads // s.kv_heads, s.head_dim
    ss = torch.zeros(2, dtype=F32)
    for part in m.read(c, "qk_ss", (slice(0, row[SPLITS]),)):
        ss += part
    rstd = torch.rsqrt(ss / torch.tensor([s.q_size, s.kv_size], dtype=F32) + s.rms_eps)
    q = L["q_norm"][kh * g * D:(kh + 1) * g * D].view(g, D) * (q.float() * rstd[0]).to(BF16)
    k = L["k_norm"][kh * D:(kh + 1) * D] * (k.float() * rstd[1]).to(BF16)
    return q, k


def roped(m, c, row, pos):
    """The instruction's kv head's G query heads and its new key RoPE'd (HF's bf16 RoPE;
    OLMoE's q/k norm first), and its new value, from qkv."""
    s, kh = m.spec, row[ROW0]
    D, g = s.head_dim, s.heads // s.kv_heads
    at = lambda off, i, n: (slice(off + i * D, off + (i + n) * D),)
    q = m.read(c, "qkv", at(0, kh * g, g)).view(g, D)
    k = m.read(c, "qkv", at(s.q_size, kh, 1)).view(D)
    v = m.read(c, "qkv", at(s.q_size + s.kv_size, kh, 1))
    if s.qk_norm:
        q, k = qk_normed(m, c, row, q, k)
    cos, sin = m.cos[pos:pos + 1], m.sin[pos:pos + 1]
    return apply_rope(q[None], cos, sin)[0], apply_rope(k.view(1, 1, D), cos, sin)[0, 0], v


def op_rope_kv(m, c, row):
    s, l, kh = m.spec, row[LAYER], row[ROW0]
    g = s.heads // s.kv_heads
    pos = int(m.read(c, "pos", (0,)))
    q, k, v = roped(m, c, row, pos)
    yield from m.finish(c, row, ("q", (slice(kh * g, kh * g + g),), q),
                        ("k_cache", (l, kh, pos), k), ("v_cache", (l, kh, pos), v))


def partial(q, K, V, D: int):
    """Split-K attention's partial state of queries q [g, D] over keys K, values V [T,
    D] (fp32; bf16 probabilities into P @ V): (max, sum of exp, unnormalised output)."""
    g = q.shape[0]
    if K.shape[0] == 0:
        return torch.full((g,), float("-inf")), torch.zeros(g), torch.zeros(g, D)
    sc = (q.float() @ K.float().T) * D ** -0.5                     # [g, T]
    mx = sc.amax(1)
    p = torch.exp(sc - mx[:, None])
    return mx, p.sum(1), p.to(BF16).float() @ V.float()


def merged(mx, lsum, o):
    """One head's partials [splits] merged: sum_s w_s o_s / sum_s w_s l_s, bf16."""
    w = torch.exp(mx - mx.max())                                    # [splits]
    return ((w[:, None] * o).sum(0) / (w * lsum).sum()).to(BF16)


def op_attn_partial(m, c, row):
    s, l, kh, g, sp = m.spec, row[LAYER], row[ROW0], row[ROWS], row[ARG]
    pos = int(m.read(c, "pos", (0,)))
    a, b = split_range(pos + 1, sp, row[SPLITS], row[UNIT])     # this step's share
    heads = (slice(kh * g, kh * g + g), sp)
    q = m.read(c, "q", heads[:1]).float()                          # [g, D]
    K = m.read(c, "k_cache", (l, kh, slice(a, b))) if a < b else torch.zeros(0, s.head_dim)
    V = m.read(c, "v_cache", (l, kh, slice(a, b))) if a < b else torch.zeros(0, s.head_dim)
    mx, lsum, o = partial(q, K, V, s.head_dim)
    yield from m.finish(c, row, ("part_m", heads, mx), ("part_l", heads, lsum),
                        ("part_o", heads, o))


def op_attn_merge(m, c, row):
    h, n, D = row[ROW0], row[SPLITS], m.spec.head_dim
    out = merged(*(m.read(c, k, (h, slice(0, n))) for k in ("part_m", "part_l", "part_o")))
    yield from m.finish(c, row, ("attn", (slice(h * D, h * D + D),), out))


def op_attn_fused(m, c, row):
    """RoPE, the partial (keys before pos from the cache, key pos its own), the new k/v
    into the cache by the split that holds pos; then, with a BUMP2, if its bump completed
    the kv head's splits, acquire and merge the group's heads, and bump BUMP2."""
    s, l, kh, g, sp = m.spec, row[LAYER], row[ROW0], row[ROWS], row[ARG]
    D, n = s.head_dim, row[SPLITS]
    pos = int(m.read(c, "pos", (0,)))
    q, k, v = roped(m, c, row, pos)
    a, b = split_range(pos + 1, sp, n, row[UNIT])
    old = slice(a, min(b, pos))
    K = m.read(c, "k_cache", (l, kh, old)) if a < min(b, pos) else torch.zeros(0, D, dtype=BF16)
    V = m.read(c, "v_cache", (l, kh, old)) if a < min(b, pos) else torch.zeros(0, D, dtype=BF16)
    own = a <= pos < b
    if own:
        K, V = torch.cat([K, k.view(1, D)]), torch.cat([V, v.view(1, D)])
    heads = (slice(kh * g, kh * g + g), sp)
    mx, lsum, o = partial(q, K, V, D)
    new = [("k_cache", (l, kh, pos), k), ("v_cache", (l, kh, pos), v)] if own else []
    yield from m.finish(c, row, ("part_m", heads, mx), ("part_l", heads, lsum),
                        ("part_o", heads, o), *new)
    if row[BUMP2] == NONE or int(m.counters[row[BUMP]]) != n:
        return                                   # merges merge, or not the last split
    m.acquire(c, row[BUMP])
    outs = [("attn", (slice(h * D, h * D + D),),
             merged(*(m.read(c, key, (h, slice(0, n))) for key in ("part_m", "part_l",
                                                                  "part_o"))))
            for h in range(kh * g, kh * g + g)]
    yield STEP
    m.store(c, outs)
    yield STEP
    m.bump_counter(c, row[BUMP2])


def op_o_proj(m, c, row):
    r0, n = row[ROW0], row[ROWS]
    y = yield from gemv(m, c, row, m.read(c, "attn", ALL).float(), n)
    yield from m.finish(c, row, lambda: residual(m, c, slice(r0, r0 + n), y))


def op_gate_up(m, c, row):
    L, r0, n, I = layer(m, row), row[ROW0], row[ROWS], m.spec.intermediate
    xn = rms(m.read(c, "x", ALL), L["post_norm"], m.spec.rms_eps)
    y = yield from gemv(m, c, row, xn, 2 * n,                 # gate rows, then up rows
                        lambda wr: wr - r0 if wr < I else n + wr - I - r0)
    h = F.silu(y[:n].to(BF16)) * y[n:].to(BF16)                 # bf16 SwiGLU, as HF
    yield from m.finish(c, row, ("h", (slice(r0, r0 + n),), h))


def split_sum(m, c, row, rs: slice, y: torch.Tensor):
    """Split ARG of SPLITS: an earlier one stores its fp32 partial; the last adds the
    earlier partials and its own, in split order, then the residual."""
    sp, S = row[ARG], row[SPLITS]
    if sp < S - 1:
        yield from m.finish(c, row, ("scratch", (sp, rs), y))
        return
    total = torch.zeros(rs.stop - rs.start)
    for part in [m.read(c, "scratch", (j, rs)) for j in range(S - 1)] + [y]:
        total += part                               # in split order
    yield from m.finish(c, row, lambda: residual(m, c, rs, total))


def op_down(m, c, row):
    r0, n, k0 = row[ROW0], row[ROWS], row[K0]
    y = yield from gemv(m, c, row, m.read(c, "h", (slice(k0, k0 + row[KLEN]),)).float(), n)
    yield from split_sum(m, c, row, slice(r0, r0 + n), y)


def op_lm_head(m, c, row):
    r0, n, i = row[ROW0], row[ROWS], row[IDX]
    xn = rms(m.read(c, "x", ALL), m.W["norm"], m.spec.rms_eps)
    y = (yield from gemv(m, c, row, xn, n)).to(BF16).float()
    best = y.max()
    at = r0 + int((y == best).nonzero()[0, 0])      # the lowest index among equals
    yield from m.finish(c, row, ("logits", (slice(r0, r0 + n),), y),
                        ("lm_val", (i,), best), ("lm_idx", (i,), at))


def op_argmax(m, c, row):
    vals, idxs = m.read(c, "lm_val", ALL), m.read(c, "lm_idx", ALL)
    best = 0
    for j in range(1, row[ROWS]):                   # slots in row order: on a tie the
        if vals[j] > vals[best]:                    # earlier (lower index) slot wins
            best = j
    tok, pos = int(idxs[best]), int(m.read(c, "pos", (0,)))
    seq = [("seq", (pos + 1,), tok)] if pos + 1 >= m.prompt_len else []  # past the prompt
    yield from m.finish(c, row, ("token", (0,), tok), ("argmax", (pos + 1,), tok), *seq,
                        ("pos", (0,), pos + 1), release=m.reset)


# ---- the mixture of experts ---------------------------------------------------------------
def op_router(m, c, row):
    r0, n = row[ROW0], row[ROWS]
    xn = rms(m.read(c, "x", ALL), layer(m, row)["post_norm"], m.spec.rms_eps)
    y = (yield from gemv(m, c, row, xn, n)).to(BF16).float()      # bf16 logits, as HF
    yield from m.finish(c, row, ("router_logits", (slice(r0, r0 + n),), y))


def op_topk(m, c, row):
    """Softmax over the E logits in fp32, then top_k rounds of "largest probability,
    lowest index among equals"; the weights rounded to bf16, not renormalised."""
    l, k = row[LAYER], m.spec.top_k
    p = torch.softmax(m.read(c, "router_logits", (slice(0, row[ROWS]),)), -1)
    ids, wts = [], []
    for _ in range(k):
        best = p.max()
        i = int((p == best).nonzero()[0, 0])         # the lowest expert index among equals
        ids.append(i)
        wts.append(float(best))
        p[i] = -1.0
    w = torch.tensor(wts).to(BF16).float()
    yield from m.finish(c, row, ("route_ids", (l,), torch.tensor(ids)), ("route_w", (l,), w))


def op_expert_gate_up(m, c, row):
    """h[(slot, rows)] = silu(gate) * up of each slot's expert (its tiles come addressed
    by the router's ids: the loader read them)."""
    r0, n, I = row[ROW0], row[ROWS], m.spec.intermediate
    xn = rms(m.read(c, "x", ALL), layer(m, row)["post_norm"], m.spec.rms_eps)
    y = torch.zeros(2, n, dtype=F32)                  # gate, up

    def use(tile, w):
        name, n0, rows, k0, kl = tile
        j, up = split_slot(name)[1], n0 >= I
        at = j * I + n0 - up * I - r0
        y[int(up), at:at + rows] += w.float() @ xn[k0:k0 + kl]
    yield from consume(m, c, row, use)
    h = F.silu(y[0].to(BF16)) * y[1].to(BF16)
    yield from m.finish(c, row, ("h", (slice(r0, r0 + n),), h))


def op_expert_down(m, c, row):
    """x rows += sum over the group's slots, in slot order, of bf16(bf16(W_down[id] @ h)
    x w): a group's partial; the last group sums the partials, then the residual."""
    l, r0, n, I = row[LAYER], row[ROW0], row[ROWS], m.spec.intermediate
    j0, ns = row[K0] // I, row[KLEN] // I
    h = m.read(c, "h", (slice(row[K0], row[K0] + row[KLEN]),)).float().view(ns, I)
    wts = m.read(c, "route_w", (l, slice(j0, j0 + ns)))
    y = torch.zeros(ns, n, dtype=F32)

    def use(tile, w):
        name, n0, rows, k0, kl = tile
        j = split_slot(name)[1] - j0
        y[j, n0 - r0:n0 - r0 + rows] += w.float() @ h[j, k0:k0 + kl]
    yield from consume(m, c, row, use)
    part = torch.zeros(n, dtype=F32)
    for j in range(ns):                                # slot order; the weight once
        part += (y[j].to(BF16).float() * wts[j]).to(BF16).float()
    yield from split_sum(m, c, row, slice(r0, r0 + n), part)


OPS = {OP_EMBED: op_embed, OP_RMS_QKV: op_rms_qkv, OP_ROPE_KV: op_rope_kv,
       OP_ATTN_PARTIAL: op_attn_partial, OP_ATTN_MERGE: op_attn_merge,
       OP_ATTN_FUSED: op_attn_fused, OP_O_PROJ: op_o_proj, OP_GATE_UP: op_gate_up,
       OP_DOWN: op_down, OP_LM_HEAD: op_lm_head, OP_ARGMAX: op_argmax, OP_ROUTER: op_router,
       OP_TOPK: op_topk, OP_EXPERT_GATE_UP: op_expert_gate_up, OP_EXPERT_DOWN: op_expert_down}
