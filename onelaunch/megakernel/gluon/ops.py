"""The megakernels' shared compute pieces: an instruction header's fields, the RMS-normed
vector a GEMV's row boxes multiply, a row box's dot product, the embedding copy and the
argmax that ends the step (the attention's pieces are ``attention.py``)."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .ring import dot_slice


@gluon.jit
def field(hdr, f16, f: gl.constexpr):
    """Field f of an instruction header held whole in each thread (no shuffles)."""
    return gl.sum(gl.where(f16 == f, hdr, 0), axis=0)


@gluon.jit
def rms_vec(x_ptr, g_ptr, H, eps, offs, offs_t, GT: gl.constexpr):
    """rmsnorm(x) * g as HF rounds it (bf16(g * bf16(x * rstd))), fp32, as the [KG, TK]
    and [GT, TK] pieces a GEMV's row boxes multiply."""
    m = offs < H
    xv = gl.load(x_ptr + offs, mask=m, other=0.0, cache_modifier=".cg").to(gl.float32)
    ss = gl.sum(gl.sum(xv * xv, axis=1), axis=0)
    mt = offs_t < H
    xt = gl.load(x_ptr + offs_t, mask=mt, other=0.0, cache_modifier=".cg").to(gl.float32)
    if GT > 0:
        ss += gl.sum(gl.sum(xt * xt, axis=1), axis=0)
    rstd = 1.0 / gl.sqrt(ss / H + eps)
    gv = gl.load(g_ptr + offs, mask=m, other=0.0).to(gl.float32)
    gt = gl.load(g_ptr + offs_t, mask=mt, other=0.0).to(gl.float32)
    xn = (gv * (xv * rstd).to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16).to(gl.float32)
    xnt = (gt * (xt * rstd).to(gl.bfloat16).to(gl.float32)).to(gl.bfloat16).to(gl.float32)
    return xn, xnt


@gluon.jit
def row_dot(ring, slot, xn, xnt, KG: gl.constexpr, GT: gl.constexpr, TN_: gl.constexpr,
            TK_: gl.constexpr, l3: gl.constexpr, al: gl.constexpr):
    """fp32 [TN]: the rows of ring slot ``slot`` (whole rows of KG + GT K tiles) times the
    vector pieces xn, xnt."""
    acc = dot_slice(ring, slot, 0, KG, xn, gl.zeros([TN_, TK_], gl.float32, al), True, l3)
    if GT > 0:
        acc = dot_slice(ring, slot, KG, GT, xnt, acc, True, l3)
    return gl.sum(acc, axis=1)


@gluon.jit
def op_embed(row0, rows, pos_ptr, seq_ptr, emb_ptr, x_ptr, H, EB: gl.constexpr,
             num_warps: gl.constexpr):
    """x[row0:row0 + rows] = E[seq[pos], row0:row0 + rows]."""
    l1: gl.constexpr = gl.BlockedLayout([8], [32], [num_warps], [0])
    pos = gl.load(pos_ptr, cache_modifier=".cg")
    tok = gl.load(seq_ptr + pos, cache_modifier=".cg").to(gl.int64)
    for c0 in range(row0, row0 + rows, EB):
        cc = c0 + gl.arange(0, EB, l1)
        m = cc < row0 + rows
        gl.store(x_ptr + cc, gl.load(emb_ptr + tok * H + cc, mask=m, other=0.0), mask=m)


@gluon.jit
def op_argmax(n, pos_ptr, plen_ptr, seq_ptr, amax_ptr, val_ptr, idx_ptr,
              NPB: gl.constexpr, num_warps: gl.constexpr):
    """The token: the largest of the LM-head instructions' bests, the lowest row among
    equals; into argmax[pos + 1] (and seq[pos + 1] past the prompt); pos + 1."""
    l1: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
    j = gl.arange(0, NPB, l1)
    v = gl.load(val_ptr + j, mask=j < n, other=float("-inf"), cache_modifier=".cg")
    ix = gl.load(idx_ptr + j, mask=j < n, other=2147483647, cache_modifier=".cg")
    best = gl.max(v, axis=0)
    tok = gl.min(gl.where(v == best, ix, 2147483647), axis=0)
    pos = gl.load(pos_ptr, cache_modifier=".cg")
    gl.store(amax_ptr + pos + 1, tok)
    if pos + 1 >= gl.load(plen_ptr):
        gl.store(seq_ptr + pos + 1, tok)
    gl.store(pos_ptr, pos + 1)
