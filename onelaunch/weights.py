"""Weights: seeded random tensors at exact shapes, and real checkpoints.

Weights live in one flat dict keyed by Hugging Face's own state-dict names (for the
installed transformers version), so the oracle, the HF reference model and the kernel
packer all read the same tensors: nothing is copied to build the reference.

Random weights come from a counter-based hash (murmur3's 32-bit finaliser over the element
index and a per-tensor seed) evaluated with integer tensor ops. Integer arithmetic is exact
on every device, so the same seed gives bit-identical weights on the CPU and the GPU, and
the GPU can generate OLMoE's 6.9B parameters in a second. Every value is rounded to bf16,
so an fp32 copy holds exactly the numbers the bf16 engine reads.
"""
from __future__ import annotations

import zlib

import torch

from .specs import ModelSpec, get_spec

_MASK32 = 0xFFFFFFFF


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    # murmur3 finaliser on 32-bit values held in int64 (products wrap; the mask keeps
    # the low 32 bits, which two's-complement wrapping leaves exact)
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _MASK32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _MASK32
    x = x ^ (x >> 16)
    return x


def hash_uniform(shape, seed: int, scale: float, device="cpu", chunk: int = 1 << 26) -> torch.Tensor:
    """Uniform values in [-scale, scale], bit-identical on any device, rounded to bf16."""
    n = 1
    for d in shape:
        n *= d
    out = torch.empty(n, dtype=torch.bfloat16, device=device)
    s = _fmix32(torch.tensor(seed & _MASK32, dtype=torch.int64)).item()
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        i = torch.arange(lo, hi, dtype=torch.int64, device=device)
        x = _fmix32(((i * 0x9E3779B1) & _MASK32) ^ s)
        x = _fmix32(x ^ (i >> 32))
        k = (x >> 8) - (1 << 23)                       # exact integer in [-2^23, 2^23)
        # one int->float conversion (exact) and one multiply: a single IEEE rounding
        out[lo:hi] = (k.to(torch.float32) * (scale / float(1 << 23))).to(torch.bfloat16)
    return out.view(*shape)


def _tensor_seed(seed: int, name: str) -> int:
    return zlib.crc32(f"{seed}:{name}".encode()) & _MASK32


def hf_param_shapes(spec: ModelSpec) -> dict[str, tuple[int, ...]]:
    """The HF state-dict names and shapes for ``spec`` (built on the meta device)."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(spec.hf_config())
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _init_scale(name: str, shape, spec: ModelSpec) -> tuple[float, float]:
    """(offset, half-width) of the uniform init for one tensor."""
    if name.endswith("norm.weight") or "layernorm" in name:
        return 1.0, 0.1                      # norm gains near 1, not exactly 1
    if name.endswith("bias"):
        return 0.0, 0.1
    if "embed_tokens" in name or "lm_head" in name:
        # logits = x_norm . E: std ~ 3 makes the next-token distribution peaked like a
        # trained model's, so greedy decoding is not a string of near-ties
        return 0.0, 3.0 * 3 ** 0.5 / spec.hidden ** 0.5
    fan_in = shape[-1]
    gain = 1.0
    if "o_proj" in name or "down_proj" in name:
        # layer outputs several times the size of a token's own embedding row: with tied
        # embeddings a small residual would make every model repeat its input token
        gain = 3.0
    return 0.0, gain * 3 ** 0.5 / fan_in ** 0.5


def random_tensor(spec, name: str, shape, seed: int = 0, device="cpu",
                  dtype=torch.bfloat16) -> torch.Tensor:
    """One seeded random tensor, by HF name: the same bits whichever tensors are made with it."""
    spec = get_spec(spec)
    off, half = _init_scale(name, shape, spec)
    t = hash_uniform(shape, _tensor_seed(seed, name), half, device=device)
    if off:
        t = (t.float() + off).to(torch.bfloat16)
    return t.to(dtype)


def random_weights(spec, seed: int = 0, device="cpu", dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """Seeded random weights under HF names. Same seed, same bits, on any device."""
    spec = get_spec(spec)
    w = {name: random_tensor(spec, name, shape, seed, device, dtype)
         for name, shape in hf_param_shapes(spec).items() if not (spec.tie_embeddings and name == "lm_head.weight")}
    if spec.tie_embeddings:
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    return w


# ---------------------------------------------------------------------------------------
# Hugging Face model over our tensors (no copy)
# ---------------------------------------------------------------------------------------
def hf_model(spec, weights: dict[str, torch.Tensor]):
    """A transformers model whose parameters *are* ``weights`` (assigned, not copied).

    Built on the meta device, so no memory is allocated for HF's own init; the rotary
    buffers are then rebuilt on the weights' device.
    """
    from transformers import AutoModelForCausalLM
    spec = get_spec(spec)
    cfg = spec.hf_config()
    any_w = next(iter(weights.values()))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=any_w.dtype)
    model.load_state_dict(weights, assign=True, strict=True)
    if spec.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    for name, mod in model.named_modules():
        if name.endswith("rotary_emb"):
            parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            with torch.device(any_w.device):
                setattr(parent, name.rsplit(".", 1)[-1], type(mod)(config=cfg))
    for name, buf in model.named_buffers():
        if buf.is_meta:
            raise RuntimeError(f"buffer {name} was left on the meta device")
    model.eval()
    model.config.use_cache = True
    return model


# ---------------------------------------------------------------------------------------
# Packing: the layouts the kernels read
# ---------------------------------------------------------------------------------------
def pack_weights(spec, w: dict[str, torch.Tensor]) -> dict:
    """Per-layer tensors in the layouts the kernels read, made once from the HF-named dict.

    Attention: ``w_qkv = [W_q; W_k; W_v]`` [(Hq + 2Hkv) D, H] (one GEMV; a copy) and
    ``b_qkv`` (Qwen), ``q_norm``/``k_norm`` (OLMoE). Dense MLP: ``w_gate_up = [W_gate;
    W_up]`` [2I, H] (a copy), ``w_down``. MoE: ``w_router`` [E, H] and the experts as HF
    already stacks them, ``w_experts_gate_up`` [E, 2I, H] and ``w_experts_down`` [E, H, I]
    (views, no copy). Everything else is the dict's own tensor."""
    spec = get_spec(spec)
    layers = []
    for i in range(spec.layers):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        L = {
            "input_norm": w[p + "input_layernorm.weight"],
            "post_norm": w[p + "post_attention_layernorm.weight"],
            "w_qkv": torch.cat([w[a + "q_proj.weight"], w[a + "k_proj.weight"], w[a + "v_proj.weight"]]),
            "b_qkv": (torch.cat([w[a + "q_proj.bias"], w[a + "k_proj.bias"], w[a + "v_proj.bias"]])
                      if spec.qkv_bias else None),
            "w_o": w[a + "o_proj.weight"],
        }
        if spec.qk_norm:
            L["q_norm"], L["k_norm"] = w[a + "q_norm.weight"], w[a + "k_norm.weight"]
        if spec.is_moe:
            L["w_router"] = w[p + "mlp.gate.weight"]
            L["w_experts_gate_up"] = w[p + "mlp.experts.gate_up_proj"]
            L["w_experts_down"] = w[p + "mlp.experts.down_proj"]
        else:
            L["w_gate_up"] = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
            L["w_down"] = w[p + "mlp.down_proj.weight"]
        layers.append(L)
    return {"layers": layers, "embed": w["model.embed_tokens.weight"],
            "norm": w["model.norm.weight"], "lm_head": w["lm_head.weight"]}
