"""The megakernel's schedule and CPU VM on the mixture of experts (``megakernel/schedule.py``
``RUNS``, ``vm_ops.py``): tiny-olmoe decodes like the oracle over several steps and
interleavings (the router's choice, slot for slot; tokens by the agreement rule; logits
within the VM's tolerance), exact ties in the router go to the lower expert, every
interleaving gives the same bits, a loader that asks for an expert before the router's
counter is caught, and OLMoE-1B-7B's schedule reads a step's active bytes, balanced over
132 SMs whatever the router picks."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from onelaunch.megakernel import loads
from onelaunch.megakernel import schedule as S
from onelaunch.megakernel import vm as V
from onelaunch.megakernel.isa import (BUMP, HOIST, LAYER, LTARGET, LWAIT, NONE, OP, OP_EMBED,
                                      OP_EXPERT_DOWN, OP_EXPERT_GATE_UP, OP_RMS_QKV,
                                      OP_ROPE_KV, OP_TOPK, SPLITS, TARGET0, WAIT0)
from onelaunch.measure.agree import bf16_ulp, judge_tokens
from onelaunch.oracle import Oracle
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights
from test_megakernel_vm import TILES, assert_agrees, edited, ids_for, quick_weights

START, STEPS, PROMPT_SEED = 60, 5, 7      # a prompt whose routing has clear margins
ROUTE_MARGIN = 0.0625                      # rank k-1 over rank k, in router logits (8 ulps
                                           # at 1; the VM's router logits move by ~0.02)


@pytest.fixture(scope="module")
def tiny():
    spec = get_spec("tiny-olmoe")
    return spec, random_weights(spec, 0)


class Routed(Oracle):
    """The oracle, recording each decode step's routing: per layer the top-k ids in slot
    order and the margin of the k-th router logit over the next."""

    def mlp(self, li, x, all_experts=False):
        if x.shape[0] == 1:
            lg = F.linear(x, self.w(f"model.layers.{li}.mlp.gate.weight"))[0].float()
            p = torch.softmax(lg, -1)
            top = torch.sort(p, descending=True, stable=True).indices[:self.spec.top_k + 1]
            self.routes.append((top[:-1].tolist(), float(lg[top[-2]] - lg[top[-1]])))
        return super().mlp(li, x, all_experts)


def oracle_run(spec, w, ids, start, steps, max_ctx=128):
    """Prefill ids[:start], then ``steps`` greedy decode steps: (cache after the prefill,
    the sequence, logits [steps, V], routes[step][layer] = (ids, margin))."""
    orc = Routed(spec, w, max_ctx=max_ctx)
    orc.routes = []
    orc.forward(ids[:start], torch.arange(start))
    cache = orc.k_cache.clone(), orc.v_cache.clone()
    orc.routes = []
    seq, ref = ids[:start + 1].tolist(), []
    for i in range(steps):
        ref.append(orc.forward(torch.tensor([seq[-1]]), torch.tensor([start + i]))[0])
        seq.append(int(ref[-1].argmax()))
    L = spec.layers
    return cache, seq, torch.stack(ref), [orc.routes[i * L:(i + 1) * L] for i in range(steps)]


def vm_run(spec, w, sched, cache, seq, start, steps, stages=2, seed=0, max_ctx=128):
    """The VM teacher-forced over ``seq``: (tokens, logits, ids [steps, L, k], outputs)."""
    m = V.Machine(spec, w, max_ctx, stages)
    m.adopt_cache(*cache)
    m.start(torch.tensor(seq), start)
    outs, ids = [], []
    for i in range(steps):
        outs.append(m.step(sched, seed + i))
        assert not m.counters.any()                  # reset by ARGMAX, every step
        ids.append(m.buf["route_ids"].data.clone())
    assert int(m.pos) == start + steps
    return ([o["token"] for o in outs], torch.stack([o["logits"] for o in outs]),
            torch.stack(ids), outs)


def chosen(ids) -> list:
    """Each step's and layer's experts as sets (slot order left out)."""
    return [[sorted(layer) for layer in step] for step in ids]


@pytest.fixture(scope="module")
def decode(tiny):
    spec, w = tiny
    return oracle_run(spec, w, ids_for(spec, START + 1, PROMPT_SEED), START, STEPS)


# ---- the VM against the oracle -------------------------------------------------------------
@pytest.mark.parametrize("P, stages, hold", [(3, 1, 4), (8, 2, 0), (16, 4, 4)])
def test_tiny_olmoe_decode_agrees_with_oracle(tiny, decode, P, stages, hold):
    """Five decode steps at ~60 keys, a new interleaving each: the experts the VM routes to
    are the oracle's in every layer (the oracle's margins at the top-k boundary are
    clear, so another choice is a bug; two chosen experts that nearly tie may swap slots,
    which only reorders a sum); tokens agree, logits within the VM's tolerance; counters
    end every step at zero. P 16 splits the down over 2 groups of slots; hold 0 streams
    nothing ahead of the router's wait."""
    spec, w = tiny
    cache, seq, ref, routes = decode
    assert min(m for step in routes for _, m in step) >= ROUTE_MARGIN
    sched = S.build(spec, P, START + STEPS, hold=hold, **TILES)
    loads.check(sched)
    groups = {r[SPLITS] for _, _, r in loads.all_rows(sched) if r[OP] == OP_EXPERT_DOWN}
    assert groups == {2 if P == 16 else 1}
    tokens, logits, ids, _ = vm_run(spec, w, sched, cache, seq, START, STEPS, stages, 10 * P)
    assert chosen(ids.tolist()) == chosen([[r for r, _ in step] for step in routes])
    assert_agrees(ref, tokens, logits)


def test_every_interleaving_gives_the_same_bits(tiny, decode):
    """Seeds, ring depths and held stages change the order of everything; each sum has a
    fixed order (the down's slots in slot order), so the logits and the residual are the
    same bits."""
    spec, w = tiny
    cache, seq, _, _ = decode
    runs = []
    for seed in range(6):
        sched = S.build(spec, 8, START + 1, hold=2 * (seed % 3), **TILES)
        _, logits, ids, outs = vm_run(spec, w, sched, cache, seq, START, 1, 1 + seed % 3, seed)
        runs.append((logits, ids, outs[0]["x"], tuple(outs[0]["order"])))
    assert len({r[3] for r in runs}) == len(runs)                     # all orders differ
    assert all(torch.equal(r[0], runs[0][0]) and torch.equal(r[1], runs[0][1])
               and torch.equal(r[2], runs[0][2]) for r in runs)


def tied_weights(spec, w):
    """Layer 0: every router row the same (all experts tie: experts 0..k-1 win). Layer 1:
    the row of the k-th expert the oracle picks at the first decode step copied into an
    unchosen expert of a higher index (a tie across the top-k boundary): (weights, the
    kept expert, the tied one left out)."""
    w = dict(w)
    g0 = "model.layers.0.mlp.gate.weight"
    w[g0] = w[g0][:1].expand_as(w[g0]).contiguous()
    _, _, _, routes = oracle_run(spec, w, ids_for(spec, START + 1, PROMPT_SEED), START, 1)
    chosen = routes[0][1][0]
    a = chosen[-1]
    b = min(e for e in range(a + 1, spec.experts) if e not in chosen)
    g1 = "model.layers.1.mlp.gate.weight"
    w[g1] = w[g1].clone()
    w[g1][b] = w[g1][a]
    return w, a, b


def test_router_ties_go_to_the_lower_expert(tiny):
    """Exact ties in the router's logits: all twelve experts in layer 0 (the top-4 is
    0, 1, 2, 3), and in layer 1 two experts across the boundary (the lower one is in, in
    the last slot). The VM picks as the oracle's stable sort does, over interleavings,
    and agrees with it."""
    spec, w0 = tiny
    w, a, b = tied_weights(spec, w0)
    cache, seq, ref, routes = oracle_run(spec, w, ids_for(spec, START + 1, PROMPT_SEED),
                                         START, 2)
    assert routes[0][0][0] == [0, 1, 2, 3] and routes[0][1][0][-1] == a
    assert routes[0][1][1] == 0.0 and b not in routes[0][1][0]        # the tie, exact
    for P, seed in ((8, 3), (16, 4)):
        sched = S.build(spec, P, START + 2, **TILES)
        tokens, logits, ids, _ = vm_run(spec, w, sched, cache, seq, START, 2, 2, seed)
        assert ids[:, 0].tolist() == [[0, 1, 2, 3]] * 2
        assert ids[0, 1, -1] == a and b not in ids[0, 1]
        assert chosen(ids.tolist()) == chosen([[r for r, _ in step] for step in routes])
        assert_agrees(ref, tokens, logits)


# ---- the loader's wait on the router -------------------------------------------------------
def test_loader_asks_for_experts_only_after_the_router(tiny):
    """Every expert instruction's loader waits for its layer's top-k counter; each loader
    waits once a layer, having first streamed only tiles that do not depend on the router
    (held stages, from after the layer's experts). Without the wait, check refuses the
    schedule and the VM catches the loader reading the ids early, every seed."""
    spec, w = tiny
    sched = S.build(spec, 8, 40, **TILES)
    route = {r[LAYER]: r[BUMP] for _, _, r in loads.all_rows(sched) if r[OP] == OP_TOPK}
    for _, _, r in loads.all_rows(sched):
        if r[OP] in (OP_EXPERT_GATE_UP, OP_EXPERT_DOWN):
            assert (r[LWAIT], r[LTARGET]) == (route[r[LAYER]], 1)
    hoisted = 0
    for sm in range(sched.P):
        prog = loads.stream(sched, sm)
        at = {st[1]: i for i, st in enumerate(prog) if st[0] == "wait"}
        assert len(at) == sum(st[0] == "wait" for st in prog)        # once a layer
        for i, st in enumerate(prog):
            if st[0] != "load":
                continue
            name, slot = loads.split_slot(st[2][0])
            if slot is not None:                  # an expert's tile: after its layer's wait
                assert at[route[int(name.split(".")[1])]] < i
            if st[3][0] == "hold":                # streamed before a wait: not an expert's,
                before = [p[1] for p in prog[:i] if p[0] == "load"]   # from after the wait
                assert slot is None and st[1] > max(before, default=-1)
                hoisted += 1
    assert hoisted > 0
    t = sched.instr.clone()
    t[:, :, LWAIT][(t[:, :, OP] == OP_EXPERT_GATE_UP) | (t[:, :, OP] == OP_EXPERT_DOWN)] = NONE
    bad = dataclasses.replace(sched, instr=t)
    with pytest.raises(S.ScheduleError, match="without its loader waiting"):
        loads.check(bad)
    for seed in range(3):
        m = V.Machine(spec, w, 64, 2)
        m.start(ids_for(spec, 30, 0), 20)
        with pytest.raises(V.VMHazard, match=r"loader .* reads route_ids\["):
            m.step(bad, seed)


def test_expert_bytes_do_not_depend_on_the_routing(tiny):
    """Two prompts that route differently: every SM's loader streams the same bytes (the
    schedule hands out (slot, row tile), not experts), and they are the schedule's."""
    spec, w = tiny
    sched = S.build(spec, 8, 40, **TILES)
    got = []
    for seed in (0, 5):
        m = V.Machine(spec, w, 64, 2)
        m.start(ids_for(spec, 30, seed), 20)
        got.append((m.step(sched, seed)["loaded"], m.buf["route_ids"].data.clone()))
    assert not torch.equal(got[0][1], got[1][1])
    assert got[0][0] == got[1][0] == [
        sum(loads.weight_bytes(sched, r) - loads.side_bytes(spec, r) for r in sched.rows(sm))
        for sm in range(sched.P)]


def test_down_before_every_gate_up_is_caught(tiny):
    """The experts' down waiting only for the router (not for every gate/up) reads h
    unordered, or writes x while a gate/up still reads it: caught, every seed."""
    spec, w = tiny
    sched = S.build(spec, 8, 40, **TILES)
    bad = edited(sched, OP_EXPERT_DOWN, WAIT0, lambda r: r[:, LWAIT])
    bad = edited(bad, OP_EXPERT_DOWN, TARGET0, lambda r: r[:, LTARGET])
    for seed in range(4):
        m = V.Machine(spec, w, 64, 2)
        m.start(ids_for(spec, 30, 0), 20)
        with pytest.raises(V.VMHazard, match=r" (h|x)\["):
            m.step(bad, seed)


# ---- OLMoE-1B-7B's schedule ----------------------------------------------------------------
def test_olmoe_schedule_reads_the_active_bytes_balanced():
    """132 SMs at 512 keys: the bytes are a step's active bytes, op by op (attention, the
    router, 8 experts' gate/up and down, the LM head, the embedding row), the KV cache
    read once; every SM's bytes within 1% of the mean (the busiest) and 2% (the idlest);
    the experts' (slot, row-tile) work over the whole grid; each list in layer order."""
    s = get_spec("olmoe-1b-7b")
    ctx, H, I, k = 512, s.hidden, s.intermediate, s.top_k
    sched = S.build(s, 132, ctx)
    loads.check(sched)
    rows = [r for _, _, r in loads.all_rows(sched)]
    assert sum(loads.weight_bytes(sched, r) for r in rows) == s.weight_bytes_per_token + H * 2
    want = {"embed": H * 2, "rms_qkv": (s.qkv_size * H + H) * 2,
            "rope_kv": (s.q_size + s.kv_size) * 2,
            "attn_partial": ctx * 2 * s.kv_heads * s.head_dim * 2, "attn_merge": 0,
            "o_proj": H * s.q_size * 2, "router": (s.experts * H + H) * 2, "topk": 0,
            "expert_gate_up": k * 2 * I * H * 2, "expert_down": k * H * I * 2,
            "lm_head": (s.vocab * H + H) * 2, "argmax": 0}
    tab = loads.table(sched)
    assert len(tab) == 1 + 9 * s.layers + 2
    for d in tab:
        assert d["bytes"] == want[d["op"]], d
    per = [sum(loads.row_bytes(sched, r) for r in sched.rows(sm)) for sm in range(132)]
    mean = sum(per) / len(per)
    assert max(per) <= 1.01 * mean and min(per) >= 0.98 * mean
    by = {(d["op"], d["layer"]): d for d in tab}
    for l in range(s.layers):
        assert by["expert_gate_up", l]["sms"] == 132 == by["expert_gate_up", l]["instructions"]
        assert by["expert_down", l]["sms"] == 128                    # 2048 rows / 16
        assert by["topk", l]["waits"] == "router>=4"
    assert all(d["sms"] == min(132, d["instructions"]) for d in tab)
    for sm in range(132):
        key = [-1 if r[OP] == OP_EMBED else s.layers if r[LAYER] == NONE else r[LAYER]
               for r in sched.rows(sm)]
        assert key == sorted(key)
        assert all(0 <= r[HOIST] <= sched.hold for r in sched.rows(sm))
    names = {loads.split_slot(tl[0]) for r in rows if r[OP] in (OP_EXPERT_GATE_UP, OP_EXPERT_DOWN)
             for tl in loads.tiles(sched, r)}
    assert {j for _, j in names} == set(range(k))                    # slots, never experts


def test_qk_norm_sums_every_qkv_block(tiny):
    """The q/k norm spans all heads: each RoPE sums the partial squares of every QKV
    block of its layer (SPLITS of them, the qkv counter's target)."""
    spec, _ = tiny
    sched = S.build(spec, 16, 40, **TILES)
    rows = [r for _, _, r in loads.all_rows(sched)]
    n = sum(r[OP] == OP_RMS_QKV and r[LAYER] == 0 for r in rows)
    assert n == 16 and all(r[SPLITS] == r[TARGET0] == n for r in rows if r[OP] == OP_ROPE_KV)


def test_the_moe_kernels_lists_run_a_full_shape_layer_like_the_oracle():
    """One OLMoE-1B-7B layer at its exact shapes (16 of its experts, a small head) on 132
    SMs, with the lists the one-launch MoE kernel runs (``megakernel.step.plan_schedule``:
    4 x 256 tiles, attention "four", a hoist of one held stage): the residual after the
    layer within 2 bf16 ulps of the oracle's, the new k and v slots within one, and the
    token agrees."""
    from onelaunch.megakernel.step import plan_schedule
    spec = dataclasses.replace(get_spec("olmoe-1b-7b"), name="olmoe-1b-7b-layer", layers=1,
                               vocab=256, experts=16)
    w = quick_weights(spec, 3)
    start, max_ctx = 40, 48
    ids = ids_for(spec, start + 1, 3)
    orc = Oracle(spec, w, max_ctx=max_ctx)
    orc.forward(ids[:start], torch.arange(start))
    m = V.Machine(spec, w, max_ctx)
    m.adopt_cache(orc.k_cache, orc.v_cache)
    m.start(ids, start)
    x_ref = orc.hidden(ids[start:], torch.tensor([start]))[0]
    sched = plan_schedule(spec, 132, start + 1)
    loads.check(sched)
    assert sched.hold == 2 * spec.hidden // 256                    # a held stage's tiles
    assert (sched.instr[:, :, HOIST] > 0).any()                    # before the head
    out = m.step(sched, 0)
    assert float((out["x"].float() - x_ref.float()).abs().max()) <= 2 * bf16_ulp(
        float(x_ref.abs().max()))
    for got, want in ((m.k_cache, orc.k_cache), (m.v_cache, orc.v_cache)):
        err = (got[0, :, start].float() - want[0, :, start].float()).abs().max()
        assert float(err) <= bf16_ulp(float(want[0, :, start].abs().max()))
    lg = orc.forward(ids[start:], torch.tensor([start]))
    assert judge_tokens(lg, [out["token"]])["ok"]
