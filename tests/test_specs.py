"""Specs: parameter counts against Hugging Face's own count, and the anchor figures that
every floor in the book is built from (``/work/shared/ANCHORS.md``)."""
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
