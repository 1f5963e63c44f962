"""Seeded random weights: deterministic, bf16-representable, at the intended scale, and
shared (not copied) with the Hugging Face reference model."""
import pytest
import torch

from onelaunch.specs import get_spec
from onelaunch.weights import hash_uniform, hf_model, random_weights

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmoe"])
def test_same_seed_same_bits(name):
    a, b = random_weights(name, seed=3), random_weights(name, seed=3)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(_bits(a[k]), _bits(b[k])), k


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmoe"])
def test_other_seed_other_values(name):
    a, b = random_weights(name, seed=0), random_weights(name, seed=1)
    for k in a:
        assert (a[k] != b[k]).float().mean() > 0.5, k


def test_tensors_of_one_shape_differ():
    # every tensor has its own stream: layer 0 and layer 1 are not copies of each other
    w = random_weights("tiny-qwen2")
    p = "model.layers.{}.self_attn.q_proj.weight"
    assert (w[p.format(0)] != w[p.format(1)]).float().mean() > 0.9


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmoe"])
def test_fp32_holds_the_bf16_values(name):
    # the fp32 reference must read exactly the numbers the bf16 engine reads
    w32, w16 = random_weights(name, dtype=torch.float32), random_weights(name)
    for k in w32:
        assert w32[k].dtype == torch.float32
        assert torch.equal(w32[k], w16[k].float()), k
        assert torch.equal(w32[k].to(torch.bfloat16).float(), w32[k]), k


def test_hash_uniform_distribution():
    x = hash_uniform((1 << 20,), seed=7, scale=0.5).float()
    assert x.min() >= -0.5 and x.max() <= 0.5  # [-a, a) before rounding to bf16
    assert abs(x.mean().item()) < 2e-3
    assert x.std().item() == pytest.approx(0.5 / 3 ** 0.5, rel=5e-3)  # uniform: a / sqrt(3)
    counts = torch.histc(x, bins=10, min=-0.5, max=0.5) / x.numel()
    assert torch.allclose(counts, torch.full_like(counts, 0.1), atol=3e-3)


def test_hash_uniform_chunks_do_not_matter():
    a = hash_uniform((3000,), seed=5, scale=1.0)
    b = hash_uniform((3000,), seed=5, scale=1.0, chunk=1024)
    assert torch.equal(_bits(a), _bits(b))


def test_scales():
    spec = get_spec("tiny-qwen2")
    w = random_weights(spec, dtype=torch.float32)
    H, I = spec.hidden, spec.intermediate
    std = lambda k: w[k].std().item()
    # projections: std gain / sqrt(fan_in); outputs of a block (o, down) have gain 3
    assert std("model.layers.0.self_attn.q_proj.weight") == pytest.approx(H ** -0.5, rel=0.05)
    assert std("model.layers.0.mlp.up_proj.weight") == pytest.approx(H ** -0.5, rel=0.05)
    assert std("model.layers.0.self_attn.o_proj.weight") == pytest.approx(3 * H ** -0.5, rel=0.05)
    assert std("model.layers.0.mlp.down_proj.weight") == pytest.approx(3 * I ** -0.5, rel=0.05)
    # embedding: logits of std ~3, so greedy decoding is not a string of near-ties
    assert std("model.embed_tokens.weight") == pytest.approx(3 * H ** -0.5, rel=0.05)
    n = w["model.norm.weight"]
    assert (n - 1).abs().max() <= 0.1 and n.std() > 0.01  # gains near 1, not all 1


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmoe"])
def test_hf_model_shares_storage(name):
    spec = get_spec(name)
    w = random_weights(spec, dtype=torch.float32)
    model = hf_model(spec, w)
    sd = model.state_dict()
    for k, t in w.items():
        assert sd[k].data_ptr() == t.data_ptr(), k
    assert model.lm_head.weight.data_ptr() == w["lm_head.weight"].data_ptr()
    if spec.tie_embeddings:
        assert w["lm_head.weight"] is w["model.embed_tokens.weight"]


@pytest.mark.gpu
@gpu
def test_cuda_bits_equal_cpu_bits():
    a = random_weights("tiny-olmoe", seed=11)
    b = random_weights("tiny-olmoe", seed=11, device="cuda")
    for k in a:
        assert torch.equal(_bits(a[k]), _bits(b[k].cpu())), k
