"""The measured launch tables (``kernels/tuned.py``): one schema, one reader, one merging
writer. The 4090 owner's command (``bench --what sweepcfg --write-table``) must keep the
shape-keyed entries a step sweep (``--what sweepplan --write-table``) merged in, and the
reverse; ``config.get`` reads what they wrote, nearest shape first."""
import json

import pytest
import torch

from onelaunch import plan
from onelaunch.measure import tune
from onelaunch.kernels import config, tuned
from onelaunch.specs import get_spec
from onelaunch.weights import pack_weights, random_weights


@pytest.fixture
def table_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(tuned, "DIR", str(tmp_path))
    monkeypatch.setattr(config, "arch", lambda device_index=0: "sm_89")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA GeForce RTX 4090")
    tuned.read.cache_clear()
    yield tmp_path
    tuned.read.cache_clear()


def cfg(bn, bk=512, pf=1, w=4):
    return dict(BLOCK_N=bn, BLOCK_K=bk, PREFETCH=pf, num_warps=w)


def test_sweepcfg_keeps_the_shape_keyed_entries(table_dir):
    """A step sweep of OLMoE writes router and o_proj at OLMoE's shapes; then the kernel
    sweep of Qwen writes o_proj and down at Qwen's: every entry is still there, each
    under its own shape, and the meta and both sweeps' notes with them."""
    olmoe, qwen = get_spec("olmoe-1b-7b"), get_spec("qwen2.5-1.5b")
    step = [{"op": "moe_router", "shape": [64, 2048], "cfg": cfg(2), "ms_per_token": 1.0},
            {"op": "o_proj_residual", "shape": [2048, 2048], "cfg": cfg(8), "ms_per_token": 1.0},
            {"op": "o_proj_residual", "shape": [2048, 2048], "cfg": cfg(16), "ms_per_token": 1.5}]
    p = tune.write_plan_table(step, olmoe.name)
    kern = [{"op": "o_proj_residual", "cfg": cfg(4), "check": "pass", "us": 2.0, "pct_of_read": 50},
            {"op": "o_proj_residual", "cfg": cfg(2), "check": "FAIL (x)", "us": None},
            {"op": "down_residual", "cfg": dict(cfg(2, 1024), SPLIT_K=1), "check": "pass", "us": 9.0,
             "pct_of_read": 70}]
    assert tune.write_table(kern, 4.2, qwen.name) == p
    d = json.loads(open(p).read())
    assert d["ops"] == {"moe_router": {"64,2048": cfg(2)},
                        "o_proj_residual": {"2048,2048": cfg(8), "1536,1536": cfg(4)},
                        "down_residual": {"1536,8960": dict(cfg(2, 1024), SPLIT_K=1)}}
    assert d["model"] == qwen.name and d["read_tbps"] == 4.2 and d["arch"] == "sm_89"
    assert set(d["step_sweeps"]) == {"moe_router 64,2048", "o_proj_residual 2048,2048"}
    assert set(d["measured"]) == {"o_proj_residual 1536,1536", "down_residual 1536,8960"}
    # and the step sweep afterwards keeps the kernel sweep's entries in turn
    tune.write_plan_table([{"op": "o_proj_residual", "shape": [2048, 2048], "cfg": cfg(4, 2048),
                             "ms_per_token": 0.9}], olmoe.name)
    ops = tuned.read("sm_89")
    assert ops["o_proj_residual"] == {"2048,2048": cfg(4, 2048), "1536,1536": cfg(4)}
    assert ops["down_residual"] and ops["moe_router"]


def test_get_reads_the_nearest_shape(table_dir):
    """``config.for_arch``: the entry at the shape, else the nearest measured one, else
    the hand-written table."""
    tuned.write_table("sm_89", {"o_proj_residual": {"1536,1536": cfg(4), "2048,2048": cfg(8)}})
    assert config.for_arch("o_proj_residual", "sm_89", (2048, 2048)) == cfg(8)
    assert config.for_arch("o_proj_residual", "sm_89", (1600, 1500)) == cfg(4)
    assert config.for_arch("rms_gate_up_swiglu", "sm_89", (400, 96)) == config.TABLE["sm_89"]["rms_gate_up_swiglu"]


def test_sm90_table_entries_are_not_shadowed():
    """Every GEMV the measured sm_90 table covers has no hand-written sm_90 entry left
    (it could never be read), and the shape keys are the models' weights' shapes."""
    ops = tuned.read("sm_90")
    assert ops and not set(ops) & set(config.TABLE["sm_90"])
    shapes = {f"{op} {key}" for op, by in ops.items() for key in by}
    for name in ("qwen2.5-1.5b", "olmoe-1b-7b"):
        s = get_spec(name)
        for op in ("rms_qkv", "o_proj_residual", "moe_router", "moe_gate_up_swiglu", "moe_down_residual"):
            if (op in ("moe_router", "moe_gate_up_swiglu", "moe_down_residual")) == s.is_moe:
                key = tuned.shape_key(plan.weight_shape(s, op))
                assert f"{op} {key}" in shapes or op not in ops, (name, op)


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmoe"])
def test_weight_shape_is_the_packed_weights(name):
    s = get_spec(name)
    L = pack_weights(s, random_weights(s, 0))["layers"][0]
    names = ({"rms_qkv": "w_qkv", "o_proj_residual": "w_o", "moe_router": "w_router",
              "moe_gate_up_swiglu": "w_experts_gate_up", "moe_down_residual": "w_experts_down"}
             if s.is_moe else {"rms_qkv": "w_qkv", "o_proj_residual": "w_o", "rms_gate_up_swiglu": "w_gate_up",
                               "down_residual": "w_down"})
    for op, w in names.items():
        assert plan.weight_shape(s, op) == tuple(L[w].shape[-2:]), op
