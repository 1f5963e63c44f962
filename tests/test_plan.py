"""The step as data: the plan's launches, the bytes they claim, and what each model picks."""
import pytest
import torch

from onelaunch.engine import Engine
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmoe"])
def test_plan_bytes_are_the_specs_bytes(name):
    """Summed over the plan, the weight bytes are what the spec says a step reads (plus
    the one embedding row the step looks up), and the KV bytes per token of context are
    the spec's: the floor and the plan count the same bytes."""
    spec = get_spec(name)
    e = Engine(spec, random_weights(spec, 0), max_ctx=32)
    weights = sum(L.weight_bytes for L in e.plan)
    assert weights == spec.weight_bytes_per_token + spec.hidden * 2
    assert sum(L.kv_bytes_per_ctx for L in e.plan) == spec.kv_bytes_per_token_of_context()


def test_models_differ_only_in_the_blocks_they_pick():
    ops = {}
    for name in ("tiny-qwen2", "tiny-olmoe"):
        spec = get_spec(name)
        e = Engine(spec, random_weights(spec, 0), max_ctx=32)
        ops[name] = [L.op for L in e.plan if L.layer == 0]
        assert [L.op for L in e.plan][0] == "embed" and e.plan[-1].op == "lm_head_argmax"
        assert len(e.plan) == 2 + spec.layers * len(ops[name])
    attn = ["rms_qkv", "rope_kv_write", "attention_partial", "attention_reduce", "o_proj_residual"]
    assert ops["tiny-qwen2"] == attn + ["rms_gate_up_swiglu", "down_residual"]
    assert ops["tiny-olmoe"] == attn + ["moe_router", "moe_gate_up_swiglu", "moe_down_residual"]


def test_buffers_follow_the_plan():
    """An engine allocates what its plan uses: no split-K partials for plain attention,
    no expert buffers for a dense model, no dense-MLP scratch for the MoE."""
    q = Engine("tiny-qwen2", random_weights("tiny-qwen2", 0), max_ctx=32, attention="plain")
    assert "part_o" not in q.buffers and "expert_ids" not in q.buffers and "h" in q.buffers
    m = Engine("tiny-olmoe", random_weights("tiny-olmoe", 0), max_ctx=32)
    assert "part_o" in m.buffers and "expert_ids" in m.buffers
    assert "down_scratch" not in m.buffers and "h" not in m.buffers


def test_l2_prefetch_is_one_more_launch_that_counts_no_bytes(monkeypatch):
    """ONELAUNCH_L2_AHEAD_MB (or the l2_prefetch entry's MB): a dense layer gets one launch
    right after its QKV projection that asks the L2 for the first megabytes of its gate
    and up rows. It claims no bytes (the gate/up launch reads them), the step's results
    do not change (on the CPU it launches nothing), and a MoE layer gets none (its
    experts are known only after the router)."""
    from onelaunch import plan
    spec = get_spec("tiny-qwen2")
    w = random_weights(spec, 0)
    off = Engine(spec, w, max_ctx=32)
    monkeypatch.setenv("ONELAUNCH_L2_AHEAD_MB", "0.01")
    on = Engine(spec, w, max_ctx=32)
    ops = [L.op for L in on.plan if L.layer == 0]
    assert ops[:2] == ["rms_qkv", "l2_prefetch"] and len(on.plan) == len(off.plan) + spec.layers
    assert plan.bytes_per_step(on.plan, 16) == plan.bytes_per_step(off.plan, 16)
    for e in (off, on):
        e.adopt_cache(*(torch.zeros(spec.layers, spec.kv_heads, 32, spec.head_dim,
                                    dtype=torch.bfloat16) for _ in range(2)), 3,
                      torch.arange(4))
        e.step(False)
    assert torch.equal(off.logits, on.logits)
    m = get_spec("tiny-olmoe")
    assert "l2_prefetch" not in [L.op for L in Engine(m, random_weights(m, 0), max_ctx=32).plan]
    monkeypatch.setenv("ONELAUNCH_L2_AHEAD_MB", "0")
    assert "l2_prefetch" not in [L.op for L in Engine(spec, w, max_ctx=32).plan]
