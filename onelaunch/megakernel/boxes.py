"""The megakernels' TMA boxes on the host: the weight tile, how many K tiles a box
brings, and the shared-memory layout the descriptors and the kernels agree on.

A weight tile is TN rows x TK columns of bf16 (2 KB). A box is [TN, kb, TK]: TN rows over
kb K tiles in one TMA copy, each row's kb x TK columns one contiguous run of memory
(``box_view``); past the tensor's K (or rows) the TMA fills zeros.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental.gluon import language as gl

TN, TK = 4, 256            # a weight tile: 4 rows x 256 columns of bf16, 2 KB
KB = 8                     # K tiles a TMA box: [TN, KB, TK], 16 KB; past K it reads zeros


def smem_layout():
    """A TMA box of [TN rows, KB K tiles, TK columns], unswizzled: a lane's 8 columns are
    16 contiguous bytes and a warp reads 512-byte runs, without bank conflicts."""
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=16, rank=3)


def down_boxes(kt: int, kd: int, tail: bool = True, warps: int = 1) -> tuple[int, int]:
    """The down projection's K tiles as NF full boxes of ``kd`` tiles and a tail box of
    TAIL tiles (what is left, rounded up to a power of two; 0 if nothing is left): 35
    tiles (Qwen's 8960) in boxes of 16 are 2 boxes and a tail of 4, one zero tile
    multiplied where whole boxes (``tail=False``: 3 boxes) multiply 13."""
    nf, rest = divmod(kt, kd)
    if not tail:
        return nf + (rest > 0), 0
    if not rest:
        return nf, 0
    # the tail's K tiles are split over the ``warps`` compute warps too
    return nf, min(max(triton.next_power_of_2(rest), warps), kd)


def gate_up_boxes(kt: int, kb: int, tail: bool = True) -> tuple[int, int]:
    """Gate/up's K tiles (all of K in one stage) as a box of KG tiles and a tail box of GT:
    Qwen's 6 tiles are 4 + 2, where one box of ``kb`` = 8 (``tail=False``)
    multiplies two zero tiles a row."""
    assert kt <= kb, "gate/up: all of K in one stage"
    kg = 1 << (kt.bit_length() - 1)             # the largest power of two <= kt
    if not tail:
        return kb, 0
    return kg, (triton.next_power_of_2(kt - kg) if kg < kt else 0)


def box_view(w2d: torch.Tensor) -> torch.Tensor:
    """[rows, K] as [rows, K / TK, TK]: a box of [TN, KB, TK] brings TN rows over KB K
    tiles in one TMA copy, each row's KB x TK columns one contiguous run of memory."""
    rows, K = w2d.shape
    return w2d.view(rows, K // TK, TK)
