"""Embedding lookup of the step's input token: x = E[seq[pos]].

The token and the position are read on the GPU, so the same launch serves every step.
Grid: one program per BLOCK columns of the hidden size. Bytes: one row, 3 KB.
"""
import triton
import triton.language as tl

from ._common import pdl_wait


@triton.jit
def _embed_kernel(e_ptr, x_ptr, seq_ptr, pos_ptr, H, stride_e, USE_PDL: tl.constexpr,
                  BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    pdl_wait(USE_PDL)
    tok = tl.load(seq_ptr + tl.load(pos_ptr)).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    m = offs < H
    tl.store(x_ptr + offs, tl.load(e_ptr + tok * stride_e + offs, mask=m), mask=m)


def embed(e, x, seq, pos, use_pdl=False):
    H = e.shape[1]
    BLOCK = 512
    kw = {"launch_pdl": True} if use_pdl else {}
    _embed_kernel[(triton.cdiv(H, BLOCK),)](e, x, seq, pos, H, e.stride(0), USE_PDL=use_pdl,
                                            BLOCK=BLOCK, num_warps=4, **kw)
