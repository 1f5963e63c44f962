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


def test_the_plan_is_data():
    """Each launch holds its launcher (a function of ``onelaunch.kernels``, no closure) and
    its arguments; ``trace`` reads them without running a kernel, and ``run`` issues the
    call they describe."""
    from onelaunch import kernels as K
    e = Engine("tiny-qwen2", random_weights("tiny-qwen2", 0), max_ctx=32)
    before = {n: t.clone() for n, t in e.buffers.items()}
    calls = e.trace()
    assert all(torch.equal(before[n], t) for n, t in e.buffers.items())     # nothing ran
    assert [c["kernel"] for c in calls] == [L.op for L in e.plan]
    for L, c in zip(e.plan, calls):
        assert L.fn is getattr(K.LAUNCHERS[L.op], L.op) and L.fn.__closure__ is None
        assert c["args"]["use_pdl"] is L.kwargs["use_pdl"] and c["layer"] == L.layer
    e.seq[0] = 7
    e.plan[0].run()                                     # embed: x = the row of token 7
    assert torch.equal(e.x, e.W["embed"][7])
    e.plan[1].run()                                     # rms_qkv reads x, writes qkv
    assert e.qkv.float().abs().sum() > 0


def test_replan_carries_a_new_setting_into_the_launches(monkeypatch):
    """A launch holds its arguments, so a setting changed after the build reaches the step
    through ``replan`` (the context sweep's caps on live splits), and the same buffers
    stay in use."""
    from onelaunch.measure import sweeps
    w = random_weights("tiny-qwen2", 0)
    e = Engine("tiny-qwen2", w, max_ctx=64)
    caps = lambda: {c["args"]["live_cap"] for c in e.trace() if c["kernel"] == "attention_partial"}
    assert caps() == {e.live_cap}
    x = e.x
    e.replan(live_cap=1)
    assert caps() == {1} and e.live_cap == 1 and e.x is x and e.plan[0].args[1] is x
    seen = []                           # the sweep: each pass runs the cap it names

    def checked(e, o, c, forced, graph):
        seen.append(caps())
        return {"ok": False, "agree": "0/1", "rows": []}
    monkeypatch.setattr(sweeps, "forced_from_cache", checked)
    monkeypatch.setattr(sweeps, "timed_if_agreed", lambda e, r, *a: r)
    monkeypatch.setattr(sweeps, "make_engine", lambda *a, **k: e)
    sweeps.sweep_rows(get_spec("tiny-qwen2"), w, "cpu", ctxs=(8,), iters=1,
                      live_caps=(None, 2))
    assert seen == [{None}, {2}]
