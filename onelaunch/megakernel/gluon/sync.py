"""The megakernels' synchronisation on the GPU: the clock, counter waits with a bound,
the ring's stage barriers, and the reset of the counters when the last CTA leaves.

Counters are int32 in global memory. A producer stores, meets its CTA at a barrier and
adds 1 with release semantics (GPU scope); a consumer polls with acquire semantics until
the count reaches its target. No wait is unbounded: one that outlasts ``timeout_ns``
records (instruction + 1, counter, value seen, target) in its CTA's err row and returns
``failed``, after which the CTA skips its waits and runs to the end, so the host can
name the stall (``step.raise_on_stall``).
"""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier


@gluon.jit
def now():
    return gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64,
                                     is_pure=False, pack=1)


@gluon.jit
def load_acquire(ptr):
    """ctr at ``ptr`` by this thread's own load with acquire semantics at GPU scope (no
    broadcast to the CTA, so no barrier a poll)."""
    return gl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptr],
                                     dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def store_mine(ptr, v):
    """Store v at ``ptr`` from this thread (a scalar ``gl.store`` stores from one thread
    only): a stall found by any one thread is recorded."""
    return gl.inline_asm_elementwise("st.global.b32 [$1], $2;\nmov.b32 $0, 0;", "=r,l,r",
                                     [ptr, v], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def poll(ctr_ptr, POLL: gl.constexpr):
    if POLL == 1:
        v = load_acquire(ctr_ptr)
    else:
        v = gl.atomic_add(ctr_ptr, 0, sem="acquire", scope="gpu")
    return v


@gluon.jit
def wait_counter(ctr_ptr, target, timeout_ns, failed, err_ptr, instr, POLL: gl.constexpr = 0):
    """Spin until ctr >= target (acquire, GPU scope), at most ``timeout_ns``; on timeout
    record the stall in err and return failed = 1 (later waits are skipped). ``POLL``
    0: one thread's acquire load (``atomic_add`` of 0 lowers to it) broadcast to the CTA
    through shared memory, two barriers a poll; 1: every thread's own acquire load, no
    barrier, so threads leave at their own tries and each that times out records the
    stall itself (``store_mine``)."""
    v = poll(ctr_ptr, POLL)
    t0 = now()
    while (v < target) & (failed == 0):
        if now() - t0 > timeout_ns:
            store_mine(err_ptr + 0, instr + 1)
            store_mine(err_ptr + 2, v)
            store_mine(err_ptr + 3, target)
            failed = 1
        v = poll(ctr_ptr, POLL)
    return failed


@gluon.jit
def stage_ready(ready, t, STAGES: gl.constexpr):
    s = t % STAGES
    mbarrier.wait(ready.index(s), (t // STAGES) & 1)
    return s


@gluon.jit
def stage_free(empty, s):
    fence_async_shared()
    mbarrier.arrive(empty.index(s), count=1)


@gluon.jit
def reset_on_exit(ctr_ptr, n_ctr, CTR_BLOCK: gl.constexpr, num_warps: gl.constexpr):
    """The last CTA out sets the counters (and the exit count, ``ctr[n_ctr]``) back to
    zero for the next launch."""
    gl.thread_barrier()
    n_ctas = gl.num_programs(0)
    old = gl.atomic_add(ctr_ptr + n_ctr, 1, sem="acq_rel", scope="gpu")
    if old == n_ctas - 1:
        zl: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])
        offs = gl.arange(0, CTR_BLOCK, zl)
        gl.store(ctr_ptr + offs, gl.zeros([CTR_BLOCK], gl.int32, zl), mask=offs <= n_ctr)
