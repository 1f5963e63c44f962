"""The one-launch step's schedule is built from the plan (``plan.step_ops``): each layer's
instructions run the plan's ops in the plan's order, a change to the plan's ops reaches
the schedule, and an op the megakernel has no instructions for is refused by name."""
from __future__ import annotations

import pytest

from onelaunch import plan
from onelaunch.engine import Engine
from onelaunch.megakernel import isa
from onelaunch.megakernel import schedule as S
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights

TILES = dict(tile_n=16, tile_k=32)
PLAN_OP = {isa.OP_EMBED: ("embed",), isa.OP_RMS_QKV: ("rms_qkv",),   # opcode -> plan ops
           isa.OP_ROPE_KV: ("rope_kv_write",), isa.OP_ATTN_PARTIAL: ("attention_partial",),
           isa.OP_ATTN_MERGE: ("attention_reduce",), isa.OP_O_PROJ: ("o_proj_residual",),
           isa.OP_GATE_UP: ("rms_gate_up_swiglu",), isa.OP_DOWN: ("down_residual",),
           isa.OP_ROUTER: ("moe_router",), isa.OP_TOPK: ("moe_router",),
           isa.OP_EXPERT_GATE_UP: ("moe_gate_up_swiglu",),
           isa.OP_EXPERT_DOWN: ("moe_down_residual",), isa.OP_LM_HEAD: ("lm_head_argmax",),
           isa.OP_ARGMAX: ("lm_head_argmax",)}


def schedule_ops(sched) -> dict[int, list[str]]:
    """Each layer's plan ops (NONE: the embedding's and the head's) in the order the
    schedule runs them, read from the rows alone: an opcode's place is the first counter
    it bumps (counters are made in stage order); a fused partial is RoPE + partial (+ the
    merge, where it bumps a second counter)."""
    first: dict[tuple[int, int, bool], int] = {}
    for sm in range(sched.P):
        for r in sched.rows(sm):
            key = (r[isa.LAYER], r[isa.OP], r[isa.BUMP2] != isa.NONE)
            at = r[isa.BUMP] if r[isa.BUMP] != isa.NONE else len(sched.counters)
            first[key] = min(first.get(key, at), at)
    out: dict[int, list[str]] = {}
    for (layer, op, merges), _ in sorted(first.items(), key=lambda kv: (kv[1], kv[0])):
        ops = (("rope_kv_write", "attention_partial") + ("attention_reduce",) * merges
               if op == isa.OP_ATTN_FUSED else PLAN_OP[op])
        seq = out.setdefault(layer, [])
        seq += [o for o in ops if not seq or seq[-1] != o]
    return out


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmoe"])
@pytest.mark.parametrize("attention", ["plain", "splitk"])
def test_the_plans_ops_are_what_the_engine_launches(name, attention):
    e = Engine(name, random_weights(name, 0), max_ctx=32, attention=attention)
    want = [(li, op) for li, ops in plan.step_ops(e.spec, attention) for op in ops]
    assert [(L.layer, L.op) for L in e.plan] == want


@pytest.mark.parametrize("name, attention", [("tiny-qwen2", f) for f in S.FORMS]
                         + [("tiny-olmoe", "four"), ("qwen2.5-1.5b", "two")])
def test_the_schedules_op_order_per_layer_is_the_plans(name, attention):
    spec = get_spec(name)
    sched = S.build(spec, 8, 40, attention=attention, **({} if spec.layers > 4 else TILES))
    got = schedule_ops(sched)
    assert got.pop(isa.NONE) == ["embed", "lm_head_argmax"]
    assert got == {li: list(ops) for li, ops in plan.step_ops(spec)[1:-1]}


def test_a_change_to_the_plans_ops_reaches_the_schedule(monkeypatch):
    """The schedule reads the plan's op data, no copy of it: a plan of one layer gives a
    schedule of one layer; a split-K attention without its merges is refused, as O reads
    what the merges write."""
    spec = get_spec("tiny-qwen2")
    steps = plan.step_ops(spec)
    one = S.build(spec, 8, 40, ops=[steps[0], steps[1], steps[-1]], **TILES)
    assert set(schedule_ops(one)) == {isa.NONE, 0}
    monkeypatch.setitem(plan.ATTENTION_OPS, "splitk", ("attention_partial",))
    with pytest.raises(S.ScheduleError, match="'o_proj_residual' .* 'attention_reduce'"):
        S.build(spec, 8, 40, **TILES)


@pytest.mark.parametrize("name, attention, op", [
    ("tiny-qwen2", "plain", "attention"), ("tiny-olmoe", "plain", "attention")])
def test_a_plan_op_without_instructions_is_refused_by_name(name, attention, op):
    spec = get_spec(name)
    with pytest.raises(S.ScheduleError, match=f"no instructions for the plan's op '{op}'"):
        S.build(spec, 8, 40, ops=plan.step_ops(spec, attention), **TILES)


def test_an_exchange_or_an_unfused_rope_is_refused():
    """Under TP the plan adds exchanges (``qk_sumsq``, ``all_reduce``): the one launch has
    none. The "three" form runs RoPE only inside a partial, so a RoPE alone is refused;
    a partial before its RoPE reads what RoPE has not written."""
    spec = get_spec("tiny-qwen2")
    (emb, (l0, ops), *rest) = plan.step_ops(spec)
    for bad, form, words in (
            (ops[:1] + ("qk_sumsq",) + ops[1:], "four", "op 'qk_sumsq'"),
            (ops + ("all_reduce",), "four", "op 'all_reduce'"),
            (ops[:2] + ops[3:], "three", "op 'rope_kv_write'"),
            ((ops[0], ops[2], ops[1]) + ops[3:], "four", "'attention_partial' .* 'rope_kv_write'")):
        with pytest.raises(S.ScheduleError, match=words):
            S.build(spec, 8, 40, attention=form, ops=[emb, (l0, bad), *rest], **TILES)
