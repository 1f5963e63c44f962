"""The dense one launch's L2 prefetch of the next gate/up (``megakernel/l2stage.py`` host,
``gluon/ring.py``'s ``l2_prefetch`` device): the loaders' table asks for whole row blocks
of gate and up, 16-byte aligned, multiples of 16 bytes, inside the stacked weights, for
exactly the stages past what the ring holds, up to each SM's share of the budget; the
option is off by default and changes no instruction (so the CPU VM, which runs the
instructions, has nothing to model: a prefetch moves no data); and the kernel compiles
for sm_90 with the instruction in it, without it when off (the code
``test_gluon_step.DENSE_CODE`` pins)."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import triton

from onelaunch.megakernel import isa, l2stage, step
from onelaunch.megakernel.step import TN, plan_schedule
from onelaunch.specs import get_spec
from onelaunch.weights import pack_weights, random_weights
from test_gluon_step import DENSE_CODE, small_olmoe


def ranges(tab, spec):
    """(tensor name, row) of every row the table's ranges cover, as ``l2stage.intended``
    names them (the engine's per-layer ``w_gate_up``)."""
    H, I = spec.hidden, spec.intermediate
    out = []
    for off, n in zip(tab[:, :, 0].flatten().tolist(), tab[:, :, 1].flatten().tolist()):
        if n:
            r = off // (H * 2)
            out += [(f"layers.{r // (2 * I)}.w_gate_up", r % (2 * I) + k)
                    for k in range(n // (H * 2))]
    return out


@pytest.mark.parametrize("mb", [8, 16, 24])
def test_table_asks_for_the_stages_past_the_ring(mb):
    """Qwen on 132 SMs at ctx 512, the engine's 6 stages: every range one row block of TN
    rows (aligned, a multiple of 16 bytes, inside [L x 2 I, H]); gate in lanes 0-15 and
    up in 16-31, the same rows of each; the rows covered once each and exactly those
    of each SM's GATE_UP stages past the ring's (``intended``, from the VM's tiles);
    the budget spread over the SMs, every layer the same."""
    spec = get_spec("qwen2.5-1.5b")
    sched = plan_schedule(spec, 132, 512)
    tab = l2stage.table(sched, spec, mb, step.STAGES)
    H, I, L = spec.hidden, spec.intermediate, spec.layers
    assert tab.shape == (132, L, 3, l2stage.LANES)
    off, n = tab[:, :, 0], tab[:, :, 1]
    on = n > 0
    assert ((off % 16 == 0) & (n % 16 == 0)).all()
    assert (n[on] == TN * H * 2).all() and (off[on] + n[on] <= L * 2 * I * H * 2).all()
    gate, up = off[..., :l2stage.HALF], off[..., l2stage.HALF:]
    assert torch.equal(on[..., :l2stage.HALF], on[..., l2stage.HALF:])
    assert (up[on[..., :l2stage.HALF]] - gate[on[..., :l2stage.HALF]] == I * H * 2).all()
    got = ranges(tab, spec)
    assert len(got) == len(set(got))
    assert set(got) == l2stage.intended(sched, spec, mb, step.STAGES)
    per_sm = on[:, 0].sum(-1) // 2                       # stages an SM asks for, layer 0
    want = round(mb * 1e6 / (2 * TN * H * 2))
    assert int(per_sm.sum()) == want and int(per_sm.max() - per_sm.min()) <= 1
    assert all(torch.equal(on[:, 0], on[:, layer]) for layer in range(L))
    assert abs(int(n[:, 0].sum()) / 1e6 - mb) < 2 * TN * H * 2 / 1e6


def test_the_ring_holds_what_o_leaves_it():
    """At the start of a GATE_UP the ring holds its first STAGES - (O's stages) stages: on
    Qwen's 132 SMs an O of 12 rows takes 2 stages (4 held), one of 8 rows 1 (5 held);
    the table's ranges start there, and its loader asks before that stage's fill."""
    spec = get_spec("qwen2.5-1.5b")
    sched = plan_schedule(spec, 132, 512)
    seen = set()
    for p in range(132):
        rows = sched.rows(p)
        i = next(k for k, r in enumerate(rows) if r[isa.OP] == isa.OP_GATE_UP)
        o = rows[i - 1]
        assert o[isa.OP] == isa.OP_O_PROJ
        h = l2stage.held(rows, i, step.STAGES, TN)
        assert h == step.STAGES - -(-o[isa.ROWS] // (2 * TN))
        seen.add((o[isa.ROWS], h))
    assert seen == {(12, 4), (8, 5)}
    tab = l2stage.table(sched, spec, 16, step.STAGES)
    for p in (0, 131):
        rows = sched.rows(p)
        i = next(k for k, r in enumerate(rows) if r[isa.OP] == isa.OP_GATE_UP
                 and r[isa.LAYER] == 3)
        row = 3 * 2 * spec.intermediate + rows[i][isa.ROW0] + \
            l2stage.held(rows, i, step.STAGES, TN) * TN
        assert int(tab[p, 3, 0, 0]) == row * spec.hidden * 2
        assert int(tab[p, 3, 2, 0]) == l2stage.held(rows, i, step.STAGES, TN)
    assert not tab[:, :, 2, 1:].any()


def small_engine(spec):
    W = pack_weights(spec, random_weights(spec, 0))
    return SimpleNamespace(spec=spec, W=W, device=torch.device("cpu"), max_ctx=256, x=None,
                           k_cache=None, v_cache=None, cos=None, sin=None, seq=None,
                           argmax=None, pos=None, prompt_len=None)


def test_off_by_default_and_no_instruction_changes():
    """``MegaStep`` (host side, no GPU): by default no table (the kernel's ``l2_tab`` is
    None, a compile-time constant) and ``L2PF`` 0; with ``l2_prefetch_mb`` the table's
    addresses are the stacked gate/up weights' plus each offset (0 where no range), L2PF
    1, or 2 with ``l2_evict_last``; the lists are the same bits either way, so the VM's
    run of them stands for both; an MoE engine or a negative size is refused."""
    s = dataclasses.replace(get_spec("qwen2.5-1.5b"), name="small-qwen", layers=2,
                            vocab=1024, max_ctx=256)
    e = small_engine(s)
    off = step.MegaStep(e, P=16)
    assert off.l2_tab is None and off.args()[-1] is None and off.constexprs().L2PF == 0
    on = step.MegaStep(e, P=16, l2_prefetch_mb=4)
    last = step.MegaStep(e, P=16, l2_prefetch_mb=4, l2_evict_last=True)
    assert on.constexprs().L2PF == 1 and last.constexprs().L2PF == 2
    assert torch.equal(on.prog, off.prog) and on.args()[-1] is on.l2_tab
    tab = l2stage.table(on.sched, s, 4, on.stages)
    base = on.w["gu"].data_ptr()
    assert torch.equal(on.l2_tab[:, :, 1:], tab[:, :, 1:])
    assert torch.equal(on.l2_tab[:, :, 0], torch.where(tab[:, :, 1] > 0, tab[:, :, 0] + base, 0))
    assert int(tab[:, :, 1].sum()) > 0
    with pytest.raises(ValueError, match="16-byte"):
        l2stage.addresses(tab, base + 8)
    with pytest.raises(ValueError, match="dense"):
        step.MegaStep(small_engine(small_olmoe()), P=16, l2_prefetch_mb=4)
    with pytest.raises(ValueError, match=">= 0"):
        step.MegaStep(e, P=16, l2_prefetch_mb=-1)


def test_compiles_with_the_bulk_prefetch_for_hopper():
    """The engine's form ("three", polls by load) through ptxas for sm_90 with the L2
    prefetch off, on, and on with evict-last: off, no prefetch and the code pinned in
    ``DENSE_CODE`` (the option costs nothing when off); on, one
    ``cp.async.bulk.prefetch.L2`` in the loader (one a lane at run time), the evict-last
    form with its ``createpolicy``; the same shared memory and TMA copies."""
    r = subprocess.run([sys.executable, "-m", "onelaunch.megakernel.aot", "--attention",
                        "three", "--poll", "1", "--l2", "0,1,2"], capture_output=True,
                       text=True, timeout=600, env={**os.environ, "TRITON_INTERPRET": "0"})
    assert r.returncode == 0, r.stderr[-2000:]
    info = {}
    for ln in r.stdout.splitlines():
        head, _, body = ln.partition(": ")
        l2 = int(head.split(" l2 ")[1]) if " l2 " in head else 0
        info[l2] = eval(body)
    assert set(info) == {0, 1, 2}
    assert (info[0]["l2_prefetch"], info[0]["evict_last"]) == (0, 0)
    assert (info[1]["l2_prefetch"], info[1]["evict_last"]) == (1, 0)
    assert (info[2]["l2_prefetch"], info[2]["evict_last"]) == (1, 1)
    assert len({i["code"] for i in info.values()}) == 3
    assert len({(i["shared"], i["tma"]) for i in info.values()}) == 1
    if triton.__version__ == "3.6.0":
        assert info[0]["code"] == DENSE_CODE["three", 1]
