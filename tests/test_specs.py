"""Specs: parameter counts against Hugging Face's own count, and the anchor figures that
every floor in the book is built from."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from onelaunch.specs import SPECS, UnknownModel, get_spec


def _meta_model(spec):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(spec.hf_config())


@pytest.mark.parametrize("name", list(SPECS))
def test_params_match_hf(name):
    spec = get_spec(name)
    model = _meta_model(spec)
    assert spec.params == sum(p.numel() for p in model.parameters())  # tied counted once


@pytest.mark.parametrize("name", list(SPECS))
def test_active_params_from_hf(name):
    # what one decode step reads, counted from HF's modules: everything, less the embedding
    # when it is a separate matrix (one row is looked up), less the experts not routed to
    spec = get_spec(name)
    model = _meta_model(spec)
    n = sum(p.numel() for p in model.parameters())
    if not spec.tie_embeddings:
        n -= model.model.embed_tokens.weight.numel()
    if spec.is_moe:
        experts = sum(p.numel() for k, p in model.named_parameters() if ".experts." in k)
        n -= experts * (spec.experts - spec.top_k) // spec.experts
    assert spec.active_params == n


def test_anchor_figures():
    qwen, olmoe = get_spec("qwen2.5-1.5b"), get_spec("olmoe-1b-7b")
    assert qwen.params == 1_543_714_304
    assert olmoe.params == 6_919_161_856
    assert round(qwen.weight_bytes_per_token / 1e9, 2) == 3.09
    assert round(olmoe.weight_bytes_per_token / 1e9, 2) == 2.36
    assert qwen.kv_bytes_per_token_of_context() == 28 * 1024
    assert olmoe.kv_bytes_per_token_of_context() == 128 * 1024


def test_floor():
    qwen = get_spec("qwen2.5-1.5b")
    assert qwen.floor_ms(4.0) == pytest.approx(0.772, abs=1e-3)  # 3.09 GB / 4 TB/s
    # context adds its KV cache: 512 tokens x 28 KiB
    extra = qwen.floor_ms(4.0, ctx=512) - qwen.floor_ms(4.0)
    assert extra == pytest.approx(512 * 28 * 1024 / 4e12 * 1e3)


def test_unknown_model_lists_known():
    with pytest.raises(UnknownModel, match="known models: .*qwen2.5-1.5b.*olmoe-1b-7b"):
        get_spec("llama-7b")


# ---- the full-size specs against their checkpoints' published configurations ------------
# Every reference (HF, the oracle, the GPU checks) is built from the same ModelSpec as the
# engine, so a wrong constant in a spec passes all of them. These are the config.json files
# published with the checkpoints on the Hugging Face hub (Qwen/Qwen2.5-1.5B-Instruct,
# allenai/OLMoE-1B-7B-0924-Instruct), written out here: the numbers are the test. Left
# out: token ids (the tokenizer's, read from a real checkpoint), training-only fields
# (initializer_range, router_aux_loss_coef, output_router_logits), dtype and versions,
# and Qwen's max_window_layers (read only with use_sliding_window, which is false).
PUBLISHED = {
    "qwen2.5-1.5b": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "max_position_embeddings": 32768,
        "num_attention_heads": 12,
        "num_hidden_layers": 28,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "use_sliding_window": False,
        "tie_word_embeddings": True,
        "vocab_size": 151936,
    },
    "olmoe-1b-7b": {
        "architectures": ["OlmoeForCausalLM"],
        "model_type": "olmoe",
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "clip_qkv": None,
        "hidden_size": 2048,
        "intermediate_size": 1024,
        "max_position_embeddings": 4096,
        "norm_topk_prob": False,
        "num_attention_heads": 16,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 16,
        "num_key_value_heads": 16,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "vocab_size": 50304,
    },
}
HF_IDS = {"qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B-Instruct",
          "olmoe-1b-7b": "allenai/OLMoE-1B-7B-0924-Instruct"}
# what the architectures fix in code, not in config.json (transformers' modelling files):
# Qwen2Attention's q/k/v projections carry a bias and no q/k norm; OlmoeAttention's bias
# is attention_bias, and its q_norm/k_norm span the whole q and k projections
ARCH = {"qwen2": {"qkv_bias": True, "qk_norm": False},
        "olmoe": {"qk_norm": True}}
# the engine's context past the checkpoint's positions: a 32768-token prompt and the 512
# tokens a long-context run generates after it
EXTRA_CTX = {"qwen2.5-1.5b": 512, "olmoe-1b-7b": 0}


def _published_config(name, tmp_path):
    """The published config.json loaded the way a checkpoint's is (AutoConfig)."""
    import json
    from transformers import AutoConfig
    (tmp_path / "config.json").write_text(json.dumps(PUBLISHED[name]))
    return AutoConfig.from_pretrained(tmp_path)


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_full_size_spec_is_the_published_config(name):
    """Every field a full-size spec encodes, against the published number."""
    from dataclasses import fields
    spec, pub = get_spec(name), PUBLISHED[name]
    heads = pub["num_attention_heads"]
    expected = {
        "name": name, "family": pub["model_type"], "hidden": pub["hidden_size"],
        "layers": pub["num_hidden_layers"], "heads": heads,
        "kv_heads": pub["num_key_value_heads"],
        "head_dim": pub.get("head_dim", pub["hidden_size"] // heads),
        "intermediate": pub["intermediate_size"], "vocab": pub["vocab_size"],
        "rope_theta": pub["rope_theta"], "rms_eps": pub["rms_norm_eps"],
        "tie_embeddings": pub["tie_word_embeddings"],
        "qkv_bias": ARCH[pub["model_type"]].get("qkv_bias", pub.get("attention_bias")),
        "qk_norm": ARCH[pub["model_type"]]["qk_norm"],
        "experts": pub.get("num_experts", 0), "top_k": pub.get("num_experts_per_tok", 0),
        "max_ctx": pub["max_position_embeddings"] + EXTRA_CTX[name],
        "max_positions": (pub["max_position_embeddings"] if EXTRA_CTX[name] else 0),
        "hf_id": HF_IDS[name],
    }
    assert [f.name for f in fields(spec)] == list(expected)        # every field is pinned
    got = spec.as_dict()
    wrong = {k: (got[k], v) for k, v in expected.items() if got[k] != v}
    assert not wrong, f"{name}: (spec, published) {wrong}"
    # what the engine and the oracle build in: no sliding window, no q/k/v clipping, no
    # RoPE scaling, SwiGLU, and for OLMoE routing weights not renormalised over the top k
    assert not pub.get("use_sliding_window", False) and pub.get("clip_qkv") is None
    assert pub.get("rope_scaling") is None and pub["hidden_act"] == "silu"
    assert pub.get("norm_topk_prob", False) is False
    assert (spec.max_positions or spec.max_ctx) == pub["max_position_embeddings"]


# the config fields the HF reference computes with (a field this transformers version
# does not have is skipped: a missing one is compared as absent on both sides)
HF_FIELDS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
             "rms_norm_eps", "tie_word_embeddings", "max_position_embeddings", "hidden_act",
             "attention_dropout", "rope_theta", "rope_parameters", "rope_scaling",
             "use_sliding_window", "sliding_window", "layer_types", "max_window_layers",
             "attention_bias", "clip_qkv", "num_experts", "num_experts_per_tok",
             "norm_topk_prob")


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_hf_config_from_spec_is_the_published_one(name, tmp_path):
    """``spec.hf_config()`` (what hf_model, random_weights and the checkpoint loader build
    on) against the published config.json loaded by transformers, field by field, and the
    model each builds: the same tensor names and shapes."""
    spec = get_spec(name)
    ours, pub = spec.hf_config(), _published_config(name, tmp_path)
    missing = object()
    head_dim = lambda c: getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    wrong = {}
    for f in HF_FIELDS:
        a, b = getattr(ours, f, missing), getattr(pub, f, missing)
        if f == "head_dim":
            a, b = head_dim(ours), head_dim(pub)
        if f == "max_window_layers" and not getattr(pub, "use_sliding_window", False):
            continue                            # read only with a sliding window
        if a != b:
            wrong[f] = (a, b)
    assert not wrong, f"{name}: (ours, published) {wrong}"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(pub)
    assert type(model).__name__ == PUBLISHED[name]["architectures"][0]
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    from onelaunch.weights import hf_param_shapes
    assert shapes == hf_param_shapes(spec)
