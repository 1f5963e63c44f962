"""The megakernel's schedule as data (``megakernel/schedule.py``) and the CPU VM that runs
it in random orders the counters allow (``megakernel/vm.py``, its ops' math in
``vm_ops.py``; the mixture of experts in ``test_megakernel_moe.py``): the VM's tokens and
logits agree with the oracle on tiny-qwen2 over several steps and interleavings, one
layer at Qwen2.5-1.5B's exact shapes matches the oracle's layer math, the schedule's
bytes are the plan's, counters end at zero, and broken schedules are reported (a
deadlock naming SM, instruction and counter; hazards naming the buffer)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from onelaunch.measure.agree import bf16_ulp, judge_tokens
from onelaunch.megakernel import loads
from onelaunch.megakernel import schedule as S
from onelaunch.megakernel import vm as V
from onelaunch.megakernel.step import plan_schedule
from onelaunch.megakernel.isa import (LAYER, NONE, OP, OP_ARGMAX, OP_ATTN_FUSED,
                                      OP_ATTN_MERGE, OP_ATTN_PARTIAL, OP_EMBED, OP_GATE_UP,
                                      OP_LM_HEAD, OP_O_PROJ, OP_ROPE_KV, SPLITS, TARGET0,
                                      WAIT0)
from onelaunch.oracle import Oracle
from onelaunch.specs import get_spec
from onelaunch.weights import _init_scale, hf_param_shapes, random_weights

TILES = dict(tile_n=16, tile_k=32)         # tiny: 3 K tiles of hidden, 7 (one partial) of I
LOGIT_ULPS = 4                             # VM vs oracle logits, in bf16 ulps of the top


@pytest.fixture(scope="module")
def tiny():
    spec = get_spec("tiny-qwen2")
    return spec, random_weights(spec, 0)


def quick_weights(spec, seed):
    """Weights at the spec's exact shapes and the project's scales, from torch's
    generator (the hash of ``random_weights`` takes ~10 s for a Qwen2.5-1.5B layer)."""
    g, w = torch.Generator().manual_seed(seed), {}
    for name, shape in hf_param_shapes(spec).items():
        off, half = _init_scale(name, shape, spec)
        w[name] = ((torch.rand(shape, generator=g) * 2 - 1) * half + off).to(torch.bfloat16)
    if spec.tie_embeddings:
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    return w


def oracle_steps(spec, w, ids, start, steps, max_ctx):
    """The oracle's cache after prefilling ids[:start], then ``steps`` greedy decode
    steps from there: (cache, the sequence, their logits [steps, V])."""
    orc = Oracle(spec, w, max_ctx=max_ctx)
    if start:
        orc.forward(ids[:start], torch.arange(start))
    cache = orc.k_cache.clone(), orc.v_cache.clone()
    seq, ref = ids[:start + 1].tolist(), []
    for i in range(steps):
        lg = orc.forward(torch.tensor([seq[-1]]), torch.tensor([start + i]))[0]
        ref.append(lg)
        seq.append(int(lg.argmax()))
    return cache, seq, torch.stack(ref)


def vm_steps(spec, w, sched, cache, seq, start, steps, stages=4, seed=0, max_ctx=128):
    """The VM teacher-forced over ``seq`` from ``start``: (tokens, logits, machine)."""
    m = V.Machine(spec, w, max_ctx, stages)
    m.adopt_cache(*cache)
    m.start(torch.tensor(seq), start)
    tokens, logits = [], []
    for i in range(steps):
        out = m.step(sched, seed + i)
        assert not m.counters.any()                      # reset by ARGMAX, every step
        tokens.append(out["token"])
        logits.append(out["logits"])
    return tokens, torch.stack(logits), m


def assert_agrees(ref, tokens, logits):
    """Tokens by the agreement rule (exact outside near ties); logits within
    LOGIT_ULPS bf16 ulps of each step's top logit."""
    res = judge_tokens(ref, tokens)
    assert res["ok"], res["flips"]
    for r, g in zip(ref, logits):
        err = float((g - r).abs().max())
        assert err <= LOGIT_ULPS * bf16_ulp(float(r.max())), err


def ids_for(spec, n, seed):
    return torch.randint(0, spec.vocab, (n,), generator=torch.Generator().manual_seed(seed))


# ---- the VM against the oracle -------------------------------------------------------------
@pytest.mark.parametrize("P, stages", [(3, 1), (8, 2), (16, 4)])
def test_tiny_decode_agrees_with_oracle(tiny, P, stages):
    """Five decode steps at a context of ~100 keys (4 and 7 attention splits at P 8 and
    16), each step a new interleaving, one schedule for all of them."""
    spec, w = tiny
    start, steps = 92, 5
    cache, seq, ref = oracle_steps(spec, w, ids_for(spec, 100, P), start, steps, 128)
    sched = S.build(spec, P, start + steps, **TILES)
    loads.check(sched)
    splits = {r[SPLITS] for _, _, r in loads.all_rows(sched) if r[OP] == OP_ATTN_PARTIAL}
    assert splits == {max(1, min(P // spec.kv_heads, 7))}
    tokens, logits, m = vm_steps(spec, w, sched, cache, seq, start, steps, stages, 10 * P)
    assert_agrees(ref, tokens, logits)
    assert int(m.pos) == start + steps
    assert m.argmax[start + 1:start + 1 + steps].tolist() == tokens


def test_vm_fills_its_own_cache_from_position_zero(tiny):
    """One schedule planned at 100 keys runs from position 0 (most splits empty): the VM
    writes every KV slot itself; inside the 4-token prompt a step only fills the cache,
    after it each step appends its token to the sequence."""
    spec, w = tiny
    ids = ids_for(spec, 4, 1)
    orc, seq, ref = Oracle(spec, w, max_ctx=128), ids.tolist(), []
    for i in range(7):
        ref.append(orc.forward(torch.tensor([seq[i]]), torch.tensor([i]))[0])
        if i + 1 >= len(seq):
            seq.append(int(ref[-1].argmax()))
    sched = S.build(spec, 16, 100, **TILES)
    m = V.Machine(spec, w, 128)
    m.start(ids)
    logits = torch.stack([m.step(sched, seed)["logits"] for seed in range(7)])
    tokens = m.argmax[1:8].tolist()
    assert m.seq[:4].tolist() == ids.tolist() and m.seq[4:8].tolist() == tokens[3:]
    assert_agrees(torch.stack(ref), tokens, logits)


def test_every_interleaving_gives_the_same_bits(tiny):
    """Different seeds run the instructions in different orders; each instruction's sums
    are in a fixed order, so the logits are the same bits."""
    spec, w = tiny
    cache, seq, _ = oracle_steps(spec, w, ids_for(spec, 60, 2), 50, 1, 128)
    sched = S.build(spec, 16, 60, **TILES)
    runs = []
    for seed in range(6):
        m = V.Machine(spec, w, 128, stages=1 + seed % 3)
        m.adopt_cache(*cache)
        m.start(torch.tensor(seq), 50)
        runs.append(m.step(sched, seed))
    assert len({tuple(r["order"]) for r in runs}) == len(runs)       # all orders differ
    assert all(torch.equal(r["logits"], runs[0]["logits"]) for r in runs)


def test_full_shape_layer_matches_oracle():
    """One layer of Qwen2.5-1.5B at its exact shapes (random weights, a small head), on
    132 SMs, with the lists the one-launch kernel runs on the GPU
    (``megakernel.step.plan_schedule``: 4 x 256 tiles, planned for every split SM pair):
    the residual after the layer and the new KV slot match the oracle's layer math; the
    token agrees."""
    spec = dataclasses.replace(get_spec("qwen2.5-1.5b"), name="qwen2.5-1.5b-layer",
                               layers=1, vocab=256)
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
    out = m.step(sched, 0)
    scale = float(x_ref.abs().max())
    assert float((out["x"].float() - x_ref.float()).abs().max()) <= 4 * bf16_ulp(scale)
    for got, want in ((m.k_cache, orc.k_cache), (m.v_cache, orc.v_cache)):
        err = (got[0, :, start].float() - want[0, :, start].float()).abs().max()
        assert float(err) <= 2 * bf16_ulp(float(want[0, :, start].abs().max()))
    lg = orc.forward(ids[start:], torch.tensor([start]))
    assert judge_tokens(lg, [out["token"]])["ok"]


def test_exact_ties_go_to_the_lowest_index(tiny):
    """Every vocabulary row the same: all logits tie exactly, within each LM-head
    instruction and across them; the token is 0, as the oracle's argmax (and
    ``lm_head_argmax``) picks."""
    spec, w = tiny
    w = dict(w)
    E = w["model.embed_tokens.weight"][:1].expand(spec.vocab, -1).contiguous()
    w["model.embed_tokens.weight"] = w["lm_head.weight"] = E
    cache, seq, ref = oracle_steps(spec, w, ids_for(spec, 20, 4), 16, 1, 64)
    assert int(ref[0].argmax()) == 0 and bool((ref[0] == ref[0, 0]).all())
    sched = S.build(spec, 8, 20, **TILES)
    assert sum(r[OP] == OP_LM_HEAD for _, _, r in loads.all_rows(sched)) == 8
    tokens, _, _ = vm_steps(spec, w, sched, cache, seq, 16, 1, max_ctx=64)
    assert tokens == [0]


# ---- the schedule ---------------------------------------------------------------------------
def test_schedule_bytes_are_the_plans(tiny):
    """Summed over the instructions, the weight bytes are the plan's (tiny: the engine's
    own plan; Qwen2.5-1.5B: the spec's bytes plus the embedding row, the plan's rule),
    each instruction's tiles are its bytes, and the partials read the cache once."""
    from onelaunch.engine import Engine
    from onelaunch import plan
    spec, w = tiny
    want = {spec.name: plan.bytes_per_step(Engine(spec, w, max_ctx=32).plan)}
    big = get_spec("qwen2.5-1.5b")
    want[big.name] = big.weight_bytes_per_token + big.hidden * 2
    for s, P, ctx, tl in ((spec, 8, 90, TILES), (big, 132, 512, {})):
        sched = S.build(s, P, ctx, **tl)
        rows = [r for _, _, r in loads.all_rows(sched)]
        assert sum(loads.weight_bytes(sched, r) for r in rows) == want[s.name]
        kv = ctx * s.kv_bytes_per_token_of_context()
        assert sum(loads.kv_bytes(s, r, ctx) for r in rows) == kv
        for r in rows:
            ts = loads.tiles(sched, r)
            assert all(n <= sched.tile_n and k <= sched.tile_k for _, _, n, _, k in ts)
            assert sum(n * k * 2 for _, _, n, _, k in ts) + loads.side_bytes(s, r) == \
                loads.weight_bytes(sched, r)
        assert sum(d["bytes"] for d in loads.table(sched)) == want[s.name] + \
            ctx * s.kv_bytes_per_token_of_context()


def test_qwen_schedule_is_balanced_and_in_stage_order():
    """132 SMs: every SM's bytes within 1% of the mean; every op of a layer spread over
    as many SMs as it has instructions (up to 132); each list in layer order."""
    s = get_spec("qwen2.5-1.5b")
    sched = S.build(s, 132, 512)
    loads.check(sched)
    per = [sum(loads.row_bytes(sched, r) for r in sched.rows(sm)) for sm in range(132)]
    mean = sum(per) / len(per)
    assert max(per) <= 1.01 * mean and min(per) >= 0.99 * mean
    tab = loads.table(sched)
    assert [d["op"] for d in tab[:8]] == ["embed", "rms_qkv", "rope_kv", "attn_partial",
                                          "attn_merge", "o_proj", "gate_up", "down"]
    assert all(d["sms"] == min(132, d["instructions"]) for d in tab)
    part = tab[3]
    assert part["instructions"] == 64 and part["waits"] == "rope>=1"   # 2 kv heads x 32
    for sm in range(132):
        key = [-1 if r[OP] == OP_EMBED else s.layers if r[LAYER] == NONE else r[LAYER]
               for r in sched.rows(sm)]
        assert key == sorted(key)


# ---- broken schedules are reported ---------------------------------------------------------
def edited(sched, op, field, value):
    """A copy of ``sched`` whose rows of ``op`` have ``field`` set by ``value(row)``."""
    t = sched.instr.clone()
    sel = t[:, :, OP] == op
    t[:, :, field][sel] = value(t[sel])
    return dataclasses.replace(sched, instr=t)


def run_tiny(tiny, sched, seed, stages=2):
    spec, w = tiny
    m = V.Machine(spec, w, 64, stages)
    m.start(ids_for(spec, 30, 0), 20)
    return m.step(sched, seed)


def test_deadlock_names_sm_instruction_and_counter(tiny):
    sched = S.build(tiny[0], 8, 30, **TILES)
    bad = edited(sched, OP_ATTN_MERGE, TARGET0, lambda r: r[:, TARGET0] + 1)
    with pytest.raises(S.ScheduleError, match="instructions bump it"):
        loads.check(bad)
    with pytest.raises(V.VMDeadlock, match=r"SM \d+ instruction \d+ \(OP_ATTN_MERGE layer 0 "
                       r"row \d idx \d\) waits for counter \d+ \(part\.0\.\d\) >= 3, it is 2"):
        run_tiny(tiny, bad, 0)


def test_missing_wait_is_caught_every_time(tiny):
    """O-projections that do not wait for the merges read attn unordered: every seed."""
    sched = S.build(tiny[0], 8, 30, **TILES)
    bad = edited(sched, OP_O_PROJ, WAIT0, lambda r: torch.full_like(r[:, 0], NONE))
    with pytest.raises(S.ScheduleError, match="never waited"):
        loads.check(bad)
    for seed in range(4):
        with pytest.raises(V.VMHazard, match=r"attn"):
            run_tiny(tiny, bad, seed)


def test_write_after_read_is_caught(tiny):
    """gate/up waiting for the merges instead of O: its RMS reads x while O writes it;
    seen as a read of an unordered write or as a write after read, every seed."""
    sched = S.build(tiny[0], 8, 30, **TILES)
    merge0 = sched.counters.index("merge.0")
    bad = edited(sched, OP_GATE_UP, WAIT0, lambda r: torch.where(
        r[:, 1] == 0, torch.full_like(r[:, 0], merge0), r[:, WAIT0]))
    bad = edited(bad, OP_GATE_UP, TARGET0, lambda r: torch.where(
        r[:, 1] == 0, torch.full_like(r[:, 0], tiny[0].heads), r[:, TARGET0]))
    msgs = set()
    for seed in range(6):
        with pytest.raises(V.VMHazard, match=r" x\[") as e:
            run_tiny(tiny, bad, seed)
        msgs.add("write after read" in str(e.value))
    assert True in msgs


def test_short_target_never_passes_silently(tiny):
    """A merge target one short: each seed either reports a hazard or, where every
    partial happened to arrive first, gives the correct bits; some seed reports it."""
    sched = S.build(tiny[0], 8, 30, **TILES)
    good = run_tiny(tiny, sched, 0)["logits"]
    bad = edited(sched, OP_ATTN_MERGE, TARGET0, lambda r: r[:, TARGET0] - 1)
    with pytest.raises(S.ScheduleError):
        loads.check(bad)
    caught = 0
    for seed in range(8):
        try:
            assert torch.equal(run_tiny(tiny, bad, seed)["logits"], good)
        except V.VMHazard:
            caught += 1
    assert caught > 0


def test_counters_reset_by_the_last_instruction_only(tiny):
    """ARGMAX zeroes the counters only as its SM's last instruction: with one more after
    it the schedule is refused, and the VM refuses the reset."""
    sched = S.build(tiny[0], 3, 30, **TILES)
    t = sched.instr
    t = torch.cat([t, torch.zeros_like(t[:, :1])], 1)
    sm = int((t[:, :, OP] == OP_ARGMAX).any(1).nonzero()[0])
    t[sm, len(sched.rows(sm))] = t[(t[:, :, OP] == OP_EMBED)][0]
    bad = dataclasses.replace(sched, instr=t)
    with pytest.raises(S.ScheduleError):
        loads.check(bad)
    with pytest.raises(V.VMHazard, match="not its SM's last"):
        run_tiny(tiny, bad, 0)


@pytest.mark.parametrize("attention", S.FORMS)
def test_each_forms_stage_count_is_the_kernels(tiny, attention):
    """The kernel's ATT (``step.ATT_STAGES``, a constexpr) counts the stages the schedule
    builds after RMS+QKV, and each form has the words chapter 8 prints
    (``schedule.FORM_TEXT``), the engine's form among them."""
    from onelaunch import plan
    from onelaunch.megakernel import step
    w = S.Walk(tiny[0], 8, 16, 16, 16, {}, attention)
    w.after = (0, 1)
    att = S.block_stages(w, 0, plan.attention_ops())
    assert len(att) - 1 == step.ATT_STAGES[attention]
    assert tuple(S.FORM_TEXT) == S.FORMS and step.ATTENTION in S.FORMS


@pytest.mark.parametrize("P, attention", [(16, "two"), (16, "three")])
def test_fused_attention_gives_the_same_bits(tiny, P, attention):
    """``build(attention="two")`` (the one-launch kernel's lists: RoPE inside the
    partials, the last of each kv head's splits merging its heads) and "three" (the same
    partials, merges as their own stage) over five steps and two interleavings each (16
    SMs: 7 splits a kv head): tokens and logits bit-identical to the four-stage
    attention's, and agreeing with the oracle; the split holding pos writes the new key."""
    spec, w = tiny
    start, steps = 92, 5
    cache, seq, ref = oracle_steps(spec, w, ids_for(spec, 100, P), start, steps, 128)
    plain = S.build(spec, P, start + steps, **TILES)
    fused = S.build(spec, P, start + steps, attention=attention, **TILES)
    loads.check(fused)
    ops = {r[OP] for _, _, r in loads.all_rows(fused)}
    merges = {OP_ATTN_MERGE} if attention == "three" else set()
    assert OP_ATTN_FUSED in ops and ops & {OP_ATTN_PARTIAL, OP_ATTN_MERGE} == merges
    assert OP_ROPE_KV not in ops
    want, want_lg, _ = vm_steps(spec, w, plain, cache, seq, start, steps, 2, 0)
    for seed in (1, 100):
        tokens, logits, m = vm_steps(spec, w, fused, cache, seq, start, steps, 2, seed)
        assert tokens == want and torch.equal(logits, want_lg)
    assert_agrees(ref, tokens, logits)


# ---- the instruction format (isa.py) ---------------------------------------------------------
def every_constructor():
    """One instruction of each opcode, each field a value of its own (so a field packed
    into another's column, or read back from the wrong one, shows)."""
    from onelaunch.megakernel import isa
    out = []
    for op, cls in isa.CONSTRUCTORS.items():
        kw = {}
        for k, name in enumerate(isa.field_names(cls)):
            kw[name] = (100 + k, 200 + k) if name == "lwait" else 100 + k
        if cls is isa.Gemv:
            kw["op"] = op
        out.append(cls(waits=[(7, 8), (9, 10)], bump=11, **kw))
    return out


@pytest.mark.parametrize("ins", every_constructor(), ids=lambda i: type(i).__name__)
def test_each_opcodes_fields_round_trip_through_its_row(ins):
    """An instruction packed into its int32 row and decoded is the same instruction: each
    field has a column of its own, inside the header the kernels read (32 fields)."""
    from onelaunch.megakernel import isa
    row = ins.row()
    assert len(row) == isa.WIDTH and isa.decode(row) == ins
    assert row[isa.OP] in isa.CONSTRUCTORS and row[isa.HOIST] == 0
    mine = [v for name in isa.field_names(type(ins)) for v in
            (getattr(ins, name) if name == "lwait" else (getattr(ins, name),))]
    assert sorted(v for v in row if v >= 100) == sorted(v for v in mine if v >= 100)
    assert all(v == 0 for v in row[isa.BUMP2 + 1:])


def test_every_scheduled_row_decodes_to_what_built_it():
    """Every row of Qwen2.5-1.5B's (each attention form) and OLMoE-1B-7B's lists is an
    instruction of a constructor: decoding and packing it again gives the row (HOIST, which
    the loads set after, aside)."""
    from onelaunch.megakernel import isa
    plans = [plan_schedule(get_spec("qwen2.5-1.5b"), 132, 512, f) for f in S.FORMS]
    plans.append(plan_schedule(get_spec("olmoe-1b-7b"), 132, 512))
    for sched in plans:
        for sm in range(sched.P):
            for r in sched.rows(sm):
                again = isa.decode(r).row()
                again[isa.HOIST] = r[isa.HOIST]
                assert again == r, (isa.OPCODES[r[OP]], r)


def test_a_constructor_refuses_what_its_opcode_cannot_hold():
    from onelaunch.megakernel import isa
    with pytest.raises(ValueError, match="at most two waits"):
        isa.Embed(row0=0, rows=4, waits=[(0, 1), (1, 1), (2, 1)])
    with pytest.raises(ValueError, match="not one of"):
        isa.Gemv(op=isa.OP_DOWN, layer=0, row0=0, rows=4, klen=8, idx=0)
