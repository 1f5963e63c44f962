"""Weights requested into the L2 ahead of the GEMV that reads them.

Between a layer's QKV projection and its gate/up projection the chain runs RoPE,
attention, its merge and the small O projection: about 9 us a Qwen layer in which HBM
reads almost nothing (chapter 8's profile). The gate/up weights do not depend on anything
the step computes, so they can be on their way during that stretch. This launch, placed
right after the QKV projection, asks the L2 for the first ``nbytes`` of each region it is
given and returns: nothing is loaded into registers or shared memory and nothing waits
for the bytes. When the gate/up kernel reaches those rows they are L2 hits.

Two ways to ask (NOTES.md, entries 19-20):

* BULK (Hopper and newer): ``cp.async.bulk.prefetch.L2``, one instruction for a CHUNK of
  bytes, handed to the copy engine; a thread issues one and is done. Not yet measured.
* per line (any GPU since sm_80): ``prefetch.global.L2::evict_last``, one instruction a
  128-byte line. Measured on the H200 (entry 19): each MB added about 0.31 us a layer,
  paid in series, because the asking program stalls about as long as the bytes take.

Under programmatic dependent launch the programs do not wait for the previous kernel
(weights are never written), except program 0: the next kernel's wait must still cover
the QKV projection's writes, and a kernel whose programs all exit without waiting would
complete before the kernel it follows. Bytes: none of its own (the reader counts them).

On the CPU (Triton's interpreter has no inline PTX) the launcher does nothing: a prefetch
never changes a result, only when the bytes arrive.
"""
import torch
import triton
import triton.language as tl

from . import config

LINE = 128          # bytes a per-line prefetch covers (an L2 line)
CHUNK = 64 << 10    # bytes a bulk prefetch covers


@triton.jit
def prefetch_lines(base_ptr, first, n_lines, BLOCK: tl.constexpr, LINE_B: tl.constexpr):
    """Prefetch lines [first, first + BLOCK) below n_lines of the bytes at base_ptr."""
    i = first + tl.arange(0, BLOCK)
    ptrs = base_ptr + tl.minimum(i, n_lines - 1).to(tl.int64) * LINE_B
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l",
                              [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def prefetch_chunks(base_ptr, first, nbytes, BLOCK: tl.constexpr, CHUNK_B: tl.constexpr):
    """One bulk prefetch a lane: chunks [first, first + BLOCK) of CHUNK_B bytes (the last
    one shorter) of the nbytes at base_ptr; lanes past the end issue nothing."""
    off = (first + tl.arange(0, BLOCK)).to(tl.int64) * CHUNK_B
    size = tl.minimum(tl.maximum(nbytes - off, 0), CHUNK_B).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.u32 p, $2, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [base_ptr + tl.where(size > 0, off, 0), size], dtype=tl.int32,
        is_pure=False, pack=1)


@triton.jit
def _l2_prefetch_kernel(a_ptr, b_ptr, nbytes, per_program, USE_PDL: tl.constexpr,
                        BULK: tl.constexpr, BLOCK: tl.constexpr, UNIT: tl.constexpr):
    pid = tl.program_id(0)
    start = pid * per_program
    n_units = tl.cdiv(nbytes, UNIT)
    for first in range(start, tl.minimum(start + per_program, n_units), BLOCK):
        if BULK:
            prefetch_chunks(a_ptr, first, nbytes, BLOCK, UNIT)
            prefetch_chunks(b_ptr, first, nbytes, BLOCK, UNIT)
        else:
            prefetch_lines(a_ptr, first, n_units, BLOCK, UNIT)
            prefetch_lines(b_ptr, first, n_units, BLOCK, UNIT)
    if USE_PDL:
        if pid == 0:      # the chain's order: see the module docstring
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()


def l2_prefetch(a, b, nbytes: int, use_pdl=False, programs=132, num_warps=4, bulk=None):
    """Ask the L2 for the first ``nbytes`` of ``a`` and of ``b`` (contiguous tensors, each
    at least that long; the same tensor twice is fine) and return at once. ``bulk``: the
    copy engine's bulk prefetch (default: on Hopper and newer), else one a line."""
    if config.interpreting() or nbytes <= 0:
        return
    for t in (a, b):
        assert t.is_contiguous() and t.numel() * t.element_size() >= nbytes, \
            "l2_prefetch: a contiguous region at least nbytes long"
    if bulk is None:
        bulk = a.is_cuda and torch.cuda.get_device_capability(a.device)[0] >= 9
    unit = CHUNK if bulk else LINE
    nbytes = nbytes // 16 * 16                    # a bulk copy's size: a multiple of 16
    block = 32 * num_warps
    n_units = triton.cdiv(nbytes, unit)
    programs = min(programs, triton.cdiv(n_units, block))
    per = triton.cdiv(triton.cdiv(n_units, programs), block) * block
    kw = {"launch_pdl": True} if use_pdl else {}
    _l2_prefetch_kernel[(programs,)](a.view(torch.uint8), b.view(torch.uint8), nbytes, per,
                                     USE_PDL=use_pdl, BULK=bool(bulk), BLOCK=block, UNIT=unit,
                                     num_warps=num_warps, **kw)
