"""A schedule as the kernels and the VM take it: ``Schedule`` (the per-SM instruction
lists and their counters' names), ``ScheduleError`` (a broken invariant) and
``split_range`` (the keys an attention split reads, from pos at run time). ``schedule``
builds one, ``loads`` reads what it streams; both import this module, not each other."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .isa import OP, OP_END


class ScheduleError(ValueError):
    """A schedule that breaks an invariant ``loads.check`` states."""


@dataclass
class Schedule:
    spec: object
    instr: torch.Tensor           # int32 [P, N, WIDTH]
    counters: list[str]           # counter index -> name ("qkv.0", "part.0.1", ...)
    ctx: int                      # the context length splits and balance were planned at
    tile_n: int                   # a weight tile: TILE_N rows x TILE_K columns
    tile_k: int
    hold: int = 0                 # a loader's held stages (``loads.stream``)

    @property
    def P(self) -> int:
        return self.instr.shape[0]

    def rows(self, sm: int) -> list[list[int]]:
        """SM ``sm``'s instructions in order, as lists of ints (no OP_END padding)."""
        key = (self.instr.data_ptr(), self.instr._version)
        if getattr(self, "_rows_key", None) != key:         # instr set or edited in place
            self._rows = [[r for r in lst if r[OP] != OP_END] for lst in self.instr.tolist()]
            self._rows_key = key
        return self._rows[sm]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_range(length: int, split: int, splits: int, unit: int) -> tuple[int, int]:
    """[start, end) of ``split``'s share of keys [0, length): the length in units of
    ``unit``, ceil(units / splits) units a split, in order (empty past the length), as
    ``kernels/attention_splitk.split_range`` shares it."""
    per = cdiv(cdiv(length, unit), splits)
    start = split * per * unit
    return start, max(start, min(start + per * unit, length))
