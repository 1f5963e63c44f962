"""The fp32 Hugging Face reference built one decoder layer at a time (what lets OLMoE's
check run in 24 GB) computes exactly what the one-piece fp32 copy computes."""
from __future__ import annotations

import pytest
import torch

from onelaunch.measure import hf_check
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights


@pytest.mark.parametrize("name", ["tiny-olmoe", "tiny-qwen2"])
def test_piecewise_reference_equals_one_piece(name):
    spec = get_spec(name)
    w = random_weights(spec, seed=1, dtype=torch.bfloat16)         # what the GPU oracle reads
    seq = torch.randint(0, spec.vocab, (1, 19), generator=torch.Generator().manual_seed(2))
    whole = hf_check.fp32_reference(spec, w, piecewise=False)
    piece = hf_check.fp32_reference(spec, w, piecewise=True)
    # while the layers are not running, the piecewise model holds them in bf16 only
    layers = [p for k, p in piece.named_parameters() if k.startswith("model.layers.")]
    assert layers and all(p.dtype == torch.bfloat16 for p in layers)
    assert all(p.dtype == torch.float32 for k, p in piece.named_parameters()
               if not k.startswith("model.layers."))
    seen = []
    for i, layer in enumerate(piece.model.layers):   # at most one layer in fp32 at a time
        layer.register_forward_pre_hook(lambda m, a, i=i: seen.append(
            (i, sum(p.dtype == torch.float32 for p in layers))))
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        with torch.no_grad():
            a = whole(seq, use_cache=False).logits
            b = piece(seq, use_cache=False).logits
    finally:
        torch.set_float32_matmul_precision(old)
    assert a.dtype == b.dtype == torch.float32
    assert torch.equal(a, b), f"max difference {(a - b).abs().max().item()}"
    per_layer = len(layers) // spec.layers
    assert [s[0] for s in seen] == list(range(spec.layers))
    assert all(n == per_layer for _, n in seen)      # this layer, upcast by its own hook
    assert all(p.dtype == torch.bfloat16 for p in layers)


def test_compare_with_hf_piecewise_or_not_same_report():
    """The whole check, bf16 oracle on the CPU: identical reports either way."""
    r1 = hf_check.compare_with_hf(get_spec("tiny-olmoe"), tokens=6, prompt_len=5,
                               oracle_dtype=torch.bfloat16, piecewise=False)
    r2 = hf_check.compare_with_hf(get_spec("tiny-olmoe"), tokens=6, prompt_len=5,
                               oracle_dtype=torch.bfloat16)          # default: piecewise
    assert r1 == r2
