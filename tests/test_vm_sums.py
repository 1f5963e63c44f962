"""OLMoE's q/k-norm statistic in the CPU VM (``megakernel/vm_ops.py``), checked where it is
summed, because the logits cannot see a wrong one.

Each RMS+QKV block stores the sums of squares of its rows of q and of k (``qk_ss``, row
IDX); each RoPE adds the blocks' partials in block order. The comparisons with a ulp
bound in ``test_megakernel_vm.py`` and ``test_megakernel_moe.py`` all hold the VM against
the oracle: the logits within 4 bf16 ulps of the top logit (``assert_agrees``), and one
full-shape layer's residual within 4 (Qwen2.5) or 2 (OLMoE) ulps of its largest value
and its new k and v within 2 or 1. No pair sums in one order: the oracle's projections
are whole-K bf16 matmuls where the VM sums tiles, its attention rounds normalised
probabilities over the whole cache to bf16 where the VM rounds each split's
unnormalised ones, and it sums its experts' outputs in bf16. So no bound there can be
0, and each rounding where the two differ moves an activation by up to one ulp, which
two layers carry to the logits. Measured at 4968eb5 (4 Dec 2026), tiny-olmoe, 4
prompts x 3 SM counts x 5 steps from position 60: the VM's logits sit 0.88 to 3.25
ulps of the top logit from the oracle's with no bug (one step of one prompt, where a
router margin of 0.004 picks another expert: 31 ulps); a block whose k sum takes in
one extra row (the first row of v) moves them by 0.50 to 3.25 ulps, and they sit 0.75
to 4.00 from the oracle's. The bug is inside the noise: no bound on the logits
separates them. The engine's Triton-interpreter step rounds where the VM does (on one
prompt, a one-layer tiny-olmoe's qkv, q and new k and v are the VM's bits), but its
attention splits and online-softmax tiles are not the VM's: its logits sit 1.00 to
2.00 ulps from the VM's (3 prompts x 2 SM counts x 3 steps).

So the statistic is checked where it is made, from the qkv the VM stored, with bounds
that follow from the arithmetic: the square of a bf16 value is exact in fp32 (8
significant bits squared fit in 24), so a sum of the same squares in the same order is
the same bits (bound 0), and in another order it differs by at most 2 gamma_(n-1) of the
total (recursive summation of n terms of one sign, gamma_m = m u / (1 - m u), u = 2^-24,
once for each order)."""
from __future__ import annotations

from functools import lru_cache

import pytest
import torch

from onelaunch.megakernel import loads
from onelaunch.megakernel import schedule as S
from onelaunch.megakernel import vm as V
from onelaunch.megakernel.isa import IDX, LAYER, OP, OP_RMS_QKV, ROW0, ROWS
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights
from test_megakernel_vm import TILES, ids_for

U = 2.0 ** -24                                     # fp32's unit roundoff


def gamma(m: int) -> float:
    return m * U / (1 - m * U)


def blocks(sched) -> list[tuple[int, int, int]]:
    """(IDX, first row, rows) of layer 0's RMS+QKV instructions (every layer's are the
    same), in IDX order: the order the RoPE sums their partials in."""
    return sorted((r[IDX], r[ROW0], r[ROWS]) for _, _, r in loads.all_rows(sched)
                  if r[OP] == OP_RMS_QKV and r[LAYER] == 0)


def parts(spec):
    """[start, end) of q and of k in the qkv projection."""
    return (0, spec.q_size), (spec.q_size, spec.q_size + spec.kv_size)


def squares(qkv: torch.Tensor, a: int, b: int) -> torch.Tensor:
    """fp32 sum of squares of qkv rows [a, b) (0 when empty), in row order."""
    return qkv[a:b].float().pow(2).sum() if a < b else torch.zeros(())


@lru_cache(maxsize=None)
def run_steps(P: int, seed: int, steps: int = 3):
    """tiny-olmoe on P SMs from position 0 over a 4-token prompt: after each step, the
    last layer's qkv and its blocks' partial squares, and the schedule."""
    spec = get_spec("tiny-olmoe")
    sched = S.build(spec, P, 40, **TILES)
    m = V.Machine(spec, random_weights(spec, 0), 64, 2)
    m.start(ids_for(spec, 4, seed))
    out = []
    for i in range(steps):
        m.step(sched, seed + i)
        out.append((m.buf["qkv"].data.clone(), m.buf["qk_ss"].data.clone()))
    return spec, sched, out


@pytest.mark.parametrize("P", [4, 16])
def test_each_qkv_blocks_squares_are_its_rows_bit_for_bit(P):
    """Every block's stored (q, k) squares are the sums of the squares of its rows of q
    and of k in the qkv it stored: same terms, same order, so the same bits. 4 SMs: blocks
    of 80 and 64 rows that straddle the q/k and k/v boundaries; 16: blocks of 16 and 32
    rows on them."""
    for seed in (0, 1):
        spec, sched, out = run_steps(P, seed)
        bl = blocks(sched)
        assert [i for i, _, _ in bl] == list(range(len(bl)))
        if P == 4:
            assert any(r0 < spec.q_size < r0 + n for _, r0, n in bl)
        for qkv, ss in out:
            assert bool(torch.isfinite(qkv).all()) and bool((ss > 0).any())
            for i, r0, n in bl:
                want = torch.stack([squares(qkv, max(r0, a), min(r0 + n, b))
                                    for a, b in parts(spec)])
                assert torch.equal(ss[i], want), (i, r0, n, ss[i].tolist(), want.tolist())


def test_the_statistic_is_the_whole_projections():
    """The RoPE's statistic (the partials added in block order) against the sum of the
    squares over the whole of q and of k: a different order of the same n exact terms,
    so within 2 gamma_(n-1) of the sum (n = 96 each: 1.13e-5 of it). Measured at
    4968eb5 (4 Dec 2026; 4 SMs and 16, 2 prompts each, 3 steps): with no bug at most
    1.9e-7 of it for q and 1.3e-7 for k; a k sum with one extra row 6.6e-5 to 2.0e-2."""
    for P, seed in ((4, 0), (4, 1), (16, 0), (16, 1)):
        spec, sched, out = run_steps(P, seed)
        for qkv, ss in out:
            total = torch.zeros(2)
            for part in ss[[i for i, _, _ in blocks(sched)]]:
                total += part                           # block order, as the RoPE
            for j, (a, b) in enumerate(parts(spec)):
                whole = squares(qkv, a, b)
                err = float((total[j] - whole).abs())
                assert err <= 2 * gamma(b - a - 1) / (1 - gamma(b - a - 1)) * float(whole), \
                    ("qk"[j], err / float(whole))
