"""Weights requested into the L2 ahead of the GEMV that reads them.

Between a layer's QKV projection and its gate/up projection the chain runs RoPE,
attention, its merge and the small O projection: about 10 us a Qwen layer in which HBM
reads almost nothing (chapter 8's profile). The gate/up weights do not depend on anything
the step computes, so they can be on their way during that stretch. This launch, placed
right after the QKV projection, asks the L2 for the first ``nbytes`` of each region it is
given (``prefetch.global.L2::evict_last``, one 128-byte line an instruction) and
returns: nothing is loaded into registers or shared memory and nothing waits for the
lines. When the gate/up kernel reaches those rows they are L2 hits.

Under programmatic dependent launch the programs do not wait for the previous kernel
(weights are never written), except program 0: the next kernel's wait must still cover
the QKV projection's writes, and a kernel whose programs all exit without waiting would
complete before the kernel it follows. Grid: ``programs`` programs, each prefetching a
contiguous share of the lines. Bytes: none of its own (the reader counts them).

On the CPU (Triton's interpreter has no inline PTX) the launcher does nothing: a prefetch
never changes a result, only when the bytes arrive.
"""
import torch
import triton
import triton.language as tl

from . import config

LINE = 128     # bytes a prefetch instruction covers (an L2 line)


@triton.jit
def prefetch_lines(base_ptr, first, n_lines, BLOCK: tl.constexpr, LINE_B: tl.constexpr):
    """Prefetch lines [first, first + BLOCK) below n_lines of the bytes at base_ptr."""
    i = first + tl.arange(0, BLOCK)
    ptrs = base_ptr + tl.minimum(i, n_lines - 1).to(tl.int64) * LINE_B
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l",
                              [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _l2_prefetch_kernel(a_ptr, b_ptr, n_lines, per_program, USE_PDL: tl.constexpr,
                        BLOCK: tl.constexpr, LINE_B: tl.constexpr):
    pid = tl.program_id(0)
    start = pid * per_program
    for first in range(start, tl.minimum(start + per_program, n_lines), BLOCK):
        prefetch_lines(a_ptr, first, n_lines, BLOCK, LINE_B)
        prefetch_lines(b_ptr, first, n_lines, BLOCK, LINE_B)
    if USE_PDL:
        if pid == 0:      # the chain's order: see the module docstring
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()


def l2_prefetch(a, b, nbytes: int, use_pdl=False, programs=132, num_warps=4):
    """Ask the L2 for the first ``nbytes`` of ``a`` and of ``b`` (contiguous tensors, each
    at least that long; the same tensor twice is fine) and return at once."""
    if config.interpreting() or nbytes <= 0:
        return
    for t in (a, b):
        assert t.is_contiguous() and t.numel() * t.element_size() >= nbytes, \
            "l2_prefetch: a contiguous region at least nbytes long"
    n_lines = triton.cdiv(nbytes, LINE)
    block = 32 * num_warps
    per = triton.cdiv(triton.cdiv(n_lines, programs), block) * block
    kw = {"launch_pdl": True} if use_pdl else {}
    _l2_prefetch_kernel[(programs,)](a.view(torch.uint8), b.view(torch.uint8), n_lines, per,
                                     USE_PDL=use_pdl, BLOCK=block, LINE_B=LINE,
                                     num_warps=num_warps, **kw)
