"""Flagged words: a dependency the reader waits for in the data itself (the one-launch
step's ``LL`` mode, NOTES 35; NCCL's low-latency protocol is the same idea).

A counter edge costs the writer a release (its stores acknowledged, then an atomic) and
the reader a poll that sees the count, then a load of the data: three memory round trips
under a saturated HBM. A flagged word is one 32-bit store of a bf16 value (low half) and
a 16-bit flag (high half) naming which write it is; the reader loads the words and loads
them again until every flag is the one it waits for, so the data arrives with the wait:
one round trip, no fence, no atomic. A word is written once a state (x after a layer's O
or down, attn and h a layer), so the flag it waits for differs from the one the word
held before; ``flag`` is never 0, the value of a word no launch has written.

Every spin is bounded: past ``timeout_ns`` it records (instruction + 1, the counter the
wait stands for, the flag seen, the flag wanted) in the SM's ``err`` row, as a counter
wait does, and returns ``failed``.
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .gluon_mlp import _now


@gluon.jit
def flag(epoch, state, n_states):
    """The flag of ``state`` (0 .. n_states - 1) in launch ``epoch``: 1 .. 65535, the
    same for no two states within 65535 of each other."""
    return 1 + ((epoch % 65535) * n_states + state) % 65535


@gluon.jit
def pack(v, f):
    """Words of bf16 values ``v`` with flag ``f`` in their high halves."""
    b = v.to(gl.bfloat16).to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF
    return b | (f << 16)


@gluon.jit
def unpack(w):
    """The fp32 values of flagged words."""
    return (w & 0xFFFF).to(gl.int16).to(gl.bfloat16, bitcast=True).to(gl.float32)


@gluon.jit
def _stale2(w, m, want):
    """How many of the [a, b] words under mask m do not carry flag ``want`` (0 or more)."""
    return gl.sum(gl.sum(gl.where(m & (((w >> 16) & 0xFFFF) != want), 1, 0), axis=1), axis=0)


@gluon.jit
def _stale3(w, m, want):
    return gl.sum(gl.sum(gl.sum(gl.where(m & (((w >> 16) & 0xFFFF) != want), 1, 0), axis=2),
                         axis=1), axis=0)


@gluon.jit
def _stale1(w, m, want):
    return gl.sum(gl.where(m & (((w >> 16) & 0xFFFF) != want), 1, 0), axis=0)


@gluon.jit
def _timed_out(late, timeout_ns, failed, err, instr, ctr, seen, want):
    """``late``: the CTA's longest wait so far (the same in every thread: a reduction),
    so every thread of the CTA leaves the spin together (its reductions are barriers)."""
    if late > timeout_ns:
        gl.store(err + 0, instr + 1)
        gl.store(err + 1, ctr)
        gl.store(err + 2, seen)
        gl.store(err + 3, want)
        failed = 1
    return failed


@gluon.jit
def wait_two(ptr, offs, m, offs_t, mt, want, timeout_ns, failed, err, instr, ctr):
    """Words [offs] and [offs_t] (two 2-D pieces, loaded together each try) once every
    one carries ``want``: their fp32 values, and ``failed``."""
    a = gl.load(ptr + offs, mask=m, other=0, cache_modifier=".cg")
    b = gl.load(ptr + offs_t, mask=mt, other=0, cache_modifier=".cg")
    t0 = _now()
    while (_stale2(a, m, want) + _stale2(b, mt, want) > 0) & (failed == 0):
        late = gl.max(gl.max(gl.where(m, _now() - t0, 0), axis=1), axis=0)
        failed = _timed_out(late, timeout_ns, failed, err, instr, ctr,
                            gl.max(gl.max((a >> 16) & 0xFFFF, axis=1), axis=0), want)
        a = gl.load(ptr + offs, mask=m, other=0, cache_modifier=".cg")
        b = gl.load(ptr + offs_t, mask=mt, other=0, cache_modifier=".cg")
    return unpack(a), unpack(b), failed


@gluon.jit
def wait_h(ptr, offs, m, offs_t, mt, want, timeout_ns, failed, err, instr, ctr):
    """``wait_two`` for a 3-D piece and a 2-D one."""
    a = gl.load(ptr + offs, mask=m, other=0, cache_modifier=".cg")
    b = gl.load(ptr + offs_t, mask=mt, other=0, cache_modifier=".cg")
    t0 = _now()
    while (_stale3(a, m, want) + _stale2(b, mt, want) > 0) & (failed == 0):
        late = gl.max(gl.max(gl.max(gl.where(m, _now() - t0, 0), axis=2), axis=1), axis=0)
        failed = _timed_out(late, timeout_ns, failed, err, instr, ctr,
                            gl.max(gl.max(gl.max((a >> 16) & 0xFFFF, axis=2), axis=1),
                                   axis=0), want)
        a = gl.load(ptr + offs, mask=m, other=0, cache_modifier=".cg")
        b = gl.load(ptr + offs_t, mask=mt, other=0, cache_modifier=".cg")
    return unpack(a), unpack(b), failed


@gluon.jit
def wait_rows(ptr, ra, ma, rb, mb, want, timeout_ns, failed, err, instr, ctr):
    """Words [ra] and [rb] (two 1-D pieces) once every one carries ``want``."""
    a = gl.load(ptr + ra, mask=ma, other=0, cache_modifier=".cg")
    b = gl.load(ptr + rb, mask=mb, other=0, cache_modifier=".cg")
    t0 = _now()
    while (_stale1(a, ma, want) + _stale1(b, mb, want) > 0) & (failed == 0):
        late = gl.max(gl.where(ma, _now() - t0, 0), axis=0)
        failed = _timed_out(late, timeout_ns, failed, err, instr, ctr,
                            gl.max((a >> 16) & 0xFFFF, axis=0), want)
        a = gl.load(ptr + ra, mask=ma, other=0, cache_modifier=".cg")
        b = gl.load(ptr + rb, mask=mb, other=0, cache_modifier=".cg")
    return unpack(a), unpack(b), failed
