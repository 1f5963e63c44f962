"""The next gate/up's weights asked into the L2 during the attention's window: which bytes
each SM's loader asks for, as a table the dense kernel reads (``gluon/ring.py``'s
``l2_prefetch``; ``MegaStep(engine, l2_prefetch_mb=...)`` turns it on).

From the end of a layer's down to the end of the next O (14.7 us at layer 10 of the
clock ``results/h200/2026-12-02_megakernel-round-trips/clk_three_plan512_st6_poll1_512.pt``,
ctx 512 on an H200) the compute partitions wait on the attention's counters; each loader
has filled its ring (``STAGES`` stages: the next O and the first gate/up stages, once
the compute has taken QKV's) and waits for a free stage, so HBM idles. With the option
on, a loader about to wait there (before the fill of the first gate/up stage the ring
has no room for) asks the L2 for the gate and up rows of the stages after it:
``cp.async.bulk.prefetch.L2.global``, one lane of the loader's warp per range (gate
ranges in lanes 0-15, up in 16-31), no data moved into the SM and nothing waits for it.
The ring's TMA copies of those stages then find them in the L2.

    tab = table(sched, spec, mb=16, stages=6)    # int64 [P, L, 3, LANES]: byte offsets
                                                 # into the stacked gate/up weights, their
                                                 # bytes, and (lane 0) the stage to ask at

A range is one row block of TN rows of gate (or up) over all of K: 16-byte aligned
(rows of K bf16, K a multiple of TK) and TN x K x 2 bytes. Which blocks: for each SM and
layer, after the ``held`` stages the ring holds when the compute reaches GATE_UP (the
ring's stages less those of the instructions with tiles right before it: O), the SM's
share of the step's budget (``mb`` a layer, spread over the SMs, one block of gate and
one of up a stage). A prefetch is a hint: it reads, writes nothing, and no instruction's
result depends on it, so the schedule and the CPU VM (``vm.py``) have no part in it.
"""
from __future__ import annotations

import torch

from .isa import OP, OP_GATE_UP, OP_LM_HEAD, OP_O_PROJ, OP_RMS_QKV, ROW0, ROWS, LAYER
from .loads import tiles
from .lists import cdiv

LANES = 32            # the loader's warp: one range a lane
HALF = LANES // 2     # gate ranges in lanes 0..15, up ranges in 16..31
PAIR = (OP_RMS_QKV, OP_O_PROJ, OP_LM_HEAD)      # two row blocks a stage


def ring_stages(row, tn: int) -> int:
    """Ring stages an instruction's tiles take (``gluon/dense.py``'s loader): a pair op
    two row blocks a stage, gate/up one (gate and up) a stage, ops without tiles none."""
    if row[OP] in PAIR:
        return cdiv(row[ROWS], 2 * tn)
    if row[OP] == OP_GATE_UP:
        return cdiv(row[ROWS], tn)
    return 0


def held(rows: list, i: int, stages: int, tn: int) -> int:
    """Stages of instruction i (a GATE_UP) in the ring when its compute starts: the
    loader runs ``stages`` ahead, so the ring holds the stages of the instructions with
    tiles right before i (back to the last one without: the attention's), then i's."""
    ahead, j = 0, i - 1
    while j >= 0 and ring_stages(rows[j], tn) > 0:
        ahead += ring_stages(rows[j], tn)
        j -= 1
    return max(0, stages - ahead)


def blocks_per_sm(total: int, P: int) -> list[int]:
    """``total`` row blocks spread over P SMs (the first ones one more)."""
    return [total // P + (p < total % P) for p in range(P)]


def table(sched, spec, mb: float, stages: int) -> torch.Tensor:
    """int64 [P, L, 3, LANES]: per SM and layer, [0] the byte offsets into the stacked
    gate/up weights ([L * 2 I, H] bf16, layer l's gate rows at l 2 I, up rows at l 2 I +
    I) of the ranges its loader asks the L2 for, [1] their bytes (0: none), [2, 0] the
    GATE_UP stage before whose fill it asks (the first the ring has no room for: the
    first range's). ``mb`` (decimal MB a layer) rounds to whole stages, spread over the
    SMs, at most HALF stages an SM."""
    P, L, tn = sched.P, spec.layers, sched.tile_n
    H, I = spec.hidden, spec.intermediate
    block = tn * H * 2                                   # one row block of gate (or up)
    share = blocks_per_sm(round(mb * 1e6 / (2 * block)), P)
    out = torch.zeros(P, L, 3, LANES, dtype=torch.int64)
    for p in range(P):
        rows = sched.rows(p)
        for i, r in enumerate(rows):
            if r[OP] != OP_GATE_UP or not share[p]:
                continue
            first = held(rows, i, stages, tn)
            n = min(share[p], HALF, max(0, cdiv(r[ROWS], tn) - first))
            out[p, r[LAYER], 2, 0] = first
            for j in range(n):
                g = r[LAYER] * 2 * I + r[ROW0] + (first + j) * tn
                for half, lane in ((0, j), (I, HALF + j)):
                    out[p, r[LAYER], 0, lane] = (g + half) * H * 2
                    out[p, r[LAYER], 1, lane] = block
    return out


def intended(sched, spec, mb: float, stages: int) -> set[tuple[str, int]]:
    """What the table should cover, from the VM's tiles (``loads.tiles``): (tensor name,
    row) of every gate and up row of each SM's GATE_UP stages past the ``held`` ones,
    up to its share."""
    tn, block = sched.tile_n, sched.tile_n * spec.hidden * 2
    share = blocks_per_sm(round(mb * 1e6 / (2 * block)), sched.P)
    out = set()
    for p in range(sched.P):
        rows = sched.rows(p)
        for i, r in enumerate(rows):
            if r[OP] != OP_GATE_UP:
                continue
            first = held(rows, i, stages, tn)
            last = first + min(share[p], HALF)
            for name, r0, n, _, _ in tiles(sched, r):
                stage = (r0 % spec.intermediate - r[ROW0]) // tn
                if first <= stage < last:
                    out |= {(name, r0 + k) for k in range(n)}
    return out


def addresses(tab: torch.Tensor, base: int) -> torch.Tensor:
    """The table with the weights' address ``base`` added to every range's offset (a range
    of 0 bytes keeps address 0): what the kernel reads."""
    if base % 16:
        raise ValueError(f"the gate/up weights at {base:#x}: a bulk prefetch needs 16-byte "
                         "aligned addresses")
    out = tab.clone()
    out[:, :, 0] += torch.where(tab[:, :, 1] > 0, base, 0)      # [2]: no address
    return out
