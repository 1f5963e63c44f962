"""Model specs: the shapes of the two models we build, and tiny variants for the CPU.

Shapes are data (one table, looked up by name), as in gpt-fast's ``ModelArgs``. A spec
knows everything the rest of the package needs without building anything: the matching
Hugging Face config, the parameter count, and the bytes one decode step must read, which
is the numerator of every bandwidth floor in the book.
"""
from __future__ import annotations

from dataclasses import dataclass, asdict

BF16_BYTES = 2


class UnknownModel(ValueError):
    """Raised for a model name that is not in :data:`SPECS`."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: str                 # "qwen2" (dense) or "olmoe" (mixture of experts)
    hidden: int                 # d_model
    layers: int
    heads: int                  # query heads
    kv_heads: int               # key/value heads (GQA when < heads)
    head_dim: int
    intermediate: int           # MLP width (per expert for MoE)
    vocab: int
    rope_theta: float
    rms_eps: float
    tie_embeddings: bool        # lm_head reads the embedding matrix
    qkv_bias: bool              # Qwen2 adds a bias to q, k and v
    qk_norm: bool               # OLMoE RMS-normalises the whole q and k projections
    experts: int = 0            # 0 for dense
    top_k: int = 0
    max_ctx: int = 32768        # longest context the specs allow (prompt + generated)
    max_positions: int = 0      # the checkpoint's max_position_embeddings (0: max_ctx)
    hf_id: str = ""             # the checkpoint these shapes come from

    # ---- derived shapes ---------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def q_size(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qkv_size(self) -> int:
        return self.q_size + 2 * self.kv_size

    # ---- Hugging Face ---------------------------------------------------------------
    def hf_config(self):
        """The transformers config with these exact shapes (eager attention, so the
        reference does the arithmetic in the order we can reason about)."""
        if self.family == "qwen2":
            from transformers import Qwen2Config
            cfg = Qwen2Config(
                hidden_size=self.hidden, intermediate_size=self.intermediate,
                num_hidden_layers=self.layers, num_attention_heads=self.heads,
                num_key_value_heads=self.kv_heads, head_dim=self.head_dim,
                vocab_size=self.vocab, rope_theta=self.rope_theta,
                rms_norm_eps=self.rms_eps, tie_word_embeddings=self.tie_embeddings,
                max_position_embeddings=self.max_positions or self.max_ctx,
                use_sliding_window=False,
                bos_token_id=None, eos_token_id=None, pad_token_id=None,
            )
        elif self.family == "olmoe":
            from transformers import OlmoeConfig
            cfg = OlmoeConfig(
                hidden_size=self.hidden, intermediate_size=self.intermediate,
                num_hidden_layers=self.layers, num_attention_heads=self.heads,
                num_key_value_heads=self.kv_heads, vocab_size=self.vocab,
                rope_theta=self.rope_theta, rms_norm_eps=self.rms_eps,
                tie_word_embeddings=self.tie_embeddings, num_experts=self.experts,
                num_experts_per_tok=self.top_k, norm_topk_prob=False,
                max_position_embeddings=self.max_positions or self.max_ctx,
                bos_token_id=None, eos_token_id=None, pad_token_id=None,
            )
        else:  # pragma: no cover - the table only holds the two families
            raise ValueError(f"unknown family {self.family!r}")
        # rope_theta moved into rope_parameters in transformers 5; set both ways
        rp = getattr(cfg, "rope_parameters", None)
        if isinstance(rp, dict):
            rp["rope_theta"] = self.rope_theta
        cfg._attn_implementation = "eager"
        return cfg

    # ---- counting ---------------------------------------------------------------------
    def layer_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shapes of one layer's tensors, keyed by their role."""
        H, I = self.hidden, self.intermediate
        s = {
            "input_norm": (H,), "post_attn_norm": (H,),
            "q": (self.q_size, H), "k": (self.kv_size, H), "v": (self.kv_size, H),
            "o": (H, self.q_size),
        }
        if self.qkv_bias:
            s.update(q_bias=(self.q_size,), k_bias=(self.kv_size,), v_bias=(self.kv_size,))
        if self.qk_norm:
            s.update(q_norm=(self.q_size,), k_norm=(self.kv_size,))
        if self.is_moe:
            s.update(router=(self.experts, H), experts_gate_up=(self.experts, 2 * I, H),
                     experts_down=(self.experts, H, I))
        else:
            s.update(gate=(I, H), up=(I, H), down=(H, I))
        return s

    @staticmethod
    def _numel(shape) -> int:
        n = 1
        for d in shape:
            n *= d
        return n

    @property
    def params(self) -> int:
        """Parameter count as Hugging Face counts it (a tied lm_head counted once)."""
        per_layer = sum(self._numel(s) for s in self.layer_shapes().values())
        emb = self.vocab * self.hidden
        head = 0 if self.tie_embeddings else emb
        return self.layers * per_layer + emb + head + self.hidden

    def bytes_per_token(self, ctx: int = 0) -> int:
        """The bytes one decode step must read from memory at context ``ctx``: each
        weight it multiplies by, once, in bf16, and the keys and values of the ``ctx``
        tokens before it. The embedding's one looked-up row is left out (negligible); a
        tied lm_head reads the embedding matrix, so it is counted once either way."""
        per_layer = 0
        for role, shape in self.layer_shapes().items():
            n = self._numel(shape)
            if role.startswith("experts_"):          # MoE: a token reads top_k experts
                n = n // self.experts * self.top_k
            per_layer += n
        lm_head = self.vocab * self.hidden           # [vocab, hidden], tied or not
        weights = self.layers * per_layer + lm_head + self.hidden   # + the final norm
        kv = ctx * self.layers * 2 * self.kv_heads * self.head_dim  # K and V, a layer
        return (weights + kv) * BF16_BYTES

    @property
    def active_params(self) -> int:
        """Parameters one decode step reads (:meth:`bytes_per_token` at no context)."""
        return self.bytes_per_token(0) // BF16_BYTES

    @property
    def weight_bytes_per_token(self) -> int:
        """Bytes of bf16 weights one decode step must stream from memory."""
        return self.bytes_per_token(0)

    def kv_bytes_per_token_of_context(self) -> int:
        """Bytes of keys and values one step reads per token of context."""
        return self.bytes_per_token(1) - self.bytes_per_token(0)

    def floor_ms(self, bandwidth_tbps: float, ctx: int = 0) -> float:
        """The bandwidth floor in ms/token: bytes read / bandwidth."""
        return self.bytes_per_token(ctx) / (bandwidth_tbps * 1e12) * 1e3

    def as_dict(self) -> dict:
        return asdict(self)


SPECS: dict[str, ModelSpec] = {}


def _add(spec: ModelSpec) -> ModelSpec:
    SPECS[spec.name] = spec
    return spec


QWEN25_15B = _add(ModelSpec(
    name="qwen2.5-1.5b", family="qwen2", hidden=1536, layers=28, heads=12, kv_heads=2,
    head_dim=128, intermediate=8960, vocab=151936, rope_theta=1e6, rms_eps=1e-6,
    tie_embeddings=True, qkv_bias=True, qk_norm=False, max_ctx=32768 + 512,
    max_positions=32768, hf_id="Qwen/Qwen2.5-1.5B-Instruct"))

OLMOE_1B_7B = _add(ModelSpec(
    name="olmoe-1b-7b", family="olmoe", hidden=2048, layers=16, heads=16, kv_heads=16,
    head_dim=128, intermediate=1024, vocab=50304, rope_theta=1e4, rms_eps=1e-5,
    tie_embeddings=False, qkv_bias=False, qk_norm=True, experts=64, top_k=8,
    max_ctx=4096, hf_id="allenai/OLMoE-1B-7B-0924-Instruct"))

# Tiny variants keep every feature of their family (GQA, bias, tied embeddings; q/k norm,
# routing) at sizes the Triton interpreter runs on two CPU cores. Hidden, MLP and vocab
# sizes are deliberately not powers of two, so masks get exercised.
TINY_QWEN2 = _add(ModelSpec(
    name="tiny-qwen2", family="qwen2", hidden=96, layers=2, heads=6, kv_heads=2,
    head_dim=16, intermediate=200, vocab=997, rope_theta=1e6, rms_eps=1e-6,
    tie_embeddings=True, qkv_bias=True, qk_norm=False, max_ctx=256))

TINY_OLMOE = _add(ModelSpec(
    name="tiny-olmoe", family="olmoe", hidden=96, layers=2, heads=6, kv_heads=6,
    head_dim=16, intermediate=48, vocab=611, rope_theta=1e4, rms_eps=1e-5,
    tie_embeddings=False, qkv_bias=False, qk_norm=True, experts=12, top_k=4,
    max_ctx=256))


def get_spec(name: str) -> ModelSpec:
    """Look a spec up by name; an unknown name lists the known ones."""
    if isinstance(name, ModelSpec):
        return name
    try:
        return SPECS[name]
    except KeyError:
        known = ", ".join(SPECS)
        raise UnknownModel(f"unknown model {name!r}; known models: {known}") from None
