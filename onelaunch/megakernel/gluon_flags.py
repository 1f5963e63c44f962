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


# One thread's spin on one word, in PTX: reload until the word's flag is ``want`` or the
# clock passes ``deadline`` (then the stale word is returned and the caller records the
# stall), a pause between tries. Each thread spins on its own words alone: no barrier
# inside a spin (a spin whose condition was a reduction over the CTA hung, NOTES 35).
_SPIN = gl.constexpr("""{
.reg .pred %p<3>;
.reg .b32 %f;
.reg .b64 %t;
mov.b32 $0, 0;
setp.eq.s32 %p0, $2, 0;
@%p0 bra DONE${:uid};
SPIN${:uid}:
ld.global.cg.b32 $0, [$1];
shr.u32 %f, $0, 16;
setp.eq.s32 %p1, %f, $3;
@%p1 bra DONE${:uid};
mov.u64 %t, %globaltimer;
setp.gt.s64 %p2, %t, $4;
@%p2 bra DONE${:uid};
nanosleep.u32 64;
bra.uni SPIN${:uid};
DONE${:uid}:
}""")


@gluon.jit
def _spin(ptrs, active, want, deadline):
    """The words at ``ptrs`` (where ``active`` is nonzero; 0 elsewhere) once each carries
    flag ``want``, or as they are at ``deadline``."""
    return gl.inline_asm_elementwise(_SPIN, "=r,l,r,r,l", [ptrs, active, want, deadline],
                                     dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _record(stale, timeout_ns, failed, err, instr, ctr, seen, want):
    """After the spins: if any word is stale (they met their deadline), the stall."""
    if (stale > 0) & (failed == 0):
        gl.store(err + 0, instr + 1)
        gl.store(err + 1, ctr)
        gl.store(err + 2, seen)
        gl.store(err + 3, want)
        failed = 1
    return failed


@gluon.jit
def wait_two(ptr, offs, m, offs_t, mt, want, timeout_ns, failed, err, instr, ctr,
             NW: gl.constexpr):
    """Words [offs] and [offs_t] (two 2-D pieces) once every one carries ``want``: their
    fp32 values in the pieces' layout, and ``failed``. The pieces are spread over the NW
    warps for the spin (a vector every warp holds whole is spun on once, not NW times),
    then brought back."""
    dl: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [NW, 1], [1, 0])
    od = gl.convert_layout(offs, dl)
    md = gl.convert_layout(m, dl)
    otd = gl.convert_layout(offs_t, dl)
    mtd = gl.convert_layout(mt, dl)
    deadline = _now() + timeout_ns
    on = (failed == 0).to(gl.int32)
    a = _spin(ptr + od, md.to(gl.int32) * on, want + od * 0, deadline + od * 0)
    b = _spin(ptr + otd, mtd.to(gl.int32) * on, want + otd * 0, deadline + otd * 0)
    failed = _record(_stale2(a, md, want) + _stale2(b, mtd, want), timeout_ns, failed, err,
                     instr, ctr, gl.max(gl.max((a >> 16) & 0xFFFF, axis=1), axis=0), want)
    return (unpack(gl.convert_layout(a, offs.type.layout)),
            unpack(gl.convert_layout(b, offs_t.type.layout)), failed)


@gluon.jit
def wait_h(ptr, offs, m, offs_t, mt, want, timeout_ns, failed, err, instr, ctr):
    """``wait_two`` for a 3-D piece and a 2-D one."""
    deadline = _now() + timeout_ns
    on = (failed == 0).to(gl.int32)
    a = _spin(ptr + offs, m.to(gl.int32) * on, want + offs * 0, deadline + offs * 0)
    b = _spin(ptr + offs_t, mt.to(gl.int32) * on, want + offs_t * 0, deadline + offs_t * 0)
    failed = _record(_stale3(a, m, want) + _stale2(b, mt, want), timeout_ns, failed, err,
                     instr, ctr, gl.max(gl.max(gl.max((a >> 16) & 0xFFFF, axis=2), axis=1),
                                        axis=0), want)
    return unpack(a), unpack(b), failed
