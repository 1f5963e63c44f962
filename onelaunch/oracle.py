"""The oracle: one decode step in plain PyTorch, op by op. It imports torch only.

Every kernel in this project is diffed against this file. It follows Hugging Face's
modelling code in the order and precision of its operations (RMSNorm in fp32, then cast;
softmax in fp32), so in fp32 it matches HF to rounding, and in bf16 it is the reference
the bf16 kernels are held to.

The KV cache has the layout the kernels use:  k_cache, v_cache: [layers, kv_heads,
max_ctx, head_dim], one contiguous timeline per (layer, kv head). Attention always runs
over the whole static cache with a mask (``key position <= query position``), so the
step has one fixed shape at every position: the form ``torch.compile`` and CUDA graphs
need, and the form the split-K kernel uses.

A batched prefill (``prefill.py``) takes two options of the same code: ``live`` attends
only over the keys before ``live`` (the filled prefix) through
``scaled_dot_product_attention`` with a lower-right causal mask (flash attention on a
GPU), instead of the whole static cache; ``all_experts`` runs every expert over every
token as one batched matmul, which reads each expert once instead of once per (token,
slot). The defaults are the step above, unchanged.

MoE is a branch of the same step (``spec.is_moe``), not a copy of it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # x: [T, N]; statistics in fp32, result cast back, then the gain (HF's order)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * x32.to(x.dtype)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float, dtype):
    # positions: [T] -> cos, sin: [T, head_dim]  (the two halves repeat: HF's layout)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64,
                                             device=positions.device).float()
                                / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[-1] // 2
    return torch.cat((-x[..., d:], x[..., :d]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: [T, heads, D]; cos/sin: [T, D]
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


class Oracle(torch.nn.Module):
    """The reference model over a weights dict (HF names). Weights are registered as
    buffers, not copied; the KV cache is a pair of static buffers. ``cache=(k, v)``
    makes those buffers the given tensors (an engine's, say; no copy), and ``max_ctx``
    their length."""

    MOE_TOKENS_PER_GATHER = 16

    def __init__(self, spec, weights: dict[str, torch.Tensor], max_ctx: int | None = None,
                 cache: tuple[torch.Tensor, torch.Tensor] | None = None):
        super().__init__()
        self.spec = spec
        self.max_ctx = cache[0].shape[2] if cache is not None else (max_ctx or spec.max_ctx)
        w0 = weights["model.embed_tokens.weight"]
        self.dtype, self.device = w0.dtype, w0.device
        self._names = {}
        for k, t in weights.items():
            b = k.replace(".", "__")
            self._names[k] = b
            self.register_buffer(b, t, persistent=False)
        shape = (spec.layers, spec.kv_heads, self.max_ctx, spec.head_dim)
        if cache is None:
            cache = tuple(torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in "kv")
        elif any(tuple(c.shape) != shape or c.dtype != self.dtype for c in cache):
            raise ValueError(f"cache must be two {self.dtype} tensors of shape {shape}")
        self.register_buffer("k_cache", cache[0], persistent=False)
        self.register_buffer("v_cache", cache[1], persistent=False)

    def w(self, name: str) -> torch.Tensor:
        return getattr(self, self._names[name])

    def reset(self):
        self.k_cache.zero_()
        self.v_cache.zero_()

    # ---- one layer's pieces ---------------------------------------------------------
    def attention(self, li: int, x: torch.Tensor, pos: torch.Tensor,
                  live: int | None = None) -> torch.Tensor:
        # x: [T, hidden] (already normed); pos: [T] absolute positions
        # live: None attends over the whole static cache, masked; an int attends over
        # keys [0, live) only, and then pos must be the last T of them
        # (live - T .. live - 1)
        s, p = self.spec, f"model.layers.{li}.self_attn."
        T = x.shape[0]
        q = F.linear(x, self.w(p + "q_proj.weight"),
                     self._maybe(p + "q_proj.bias"))              # [T, Hq*D]
        k = F.linear(x, self.w(p + "k_proj.weight"),
                     self._maybe(p + "k_proj.bias"))              # [T, Hkv*D]
        v = F.linear(x, self.w(p + "v_proj.weight"),
                     self._maybe(p + "v_proj.bias"))              # [T, Hkv*D]
        if s.qk_norm:  # OLMoE: RMSNorm over the whole projection, before RoPE
            q = rms_norm(q, self.w(p + "q_norm.weight"), s.rms_eps)
            k = rms_norm(k, self.w(p + "k_norm.weight"), s.rms_eps)
        q = q.view(T, s.heads, s.head_dim)
        k = k.view(T, s.kv_heads, s.head_dim)
        v = v.view(T, s.kv_heads, s.head_dim)
        cos, sin = rope_cos_sin(pos, s.head_dim, s.rope_theta, x.dtype)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # write this step's keys/values into the static cache at their positions
        self.k_cache[li].index_copy_(1, pos, k.transpose(0, 1))   # [Hkv, T, D]
        self.v_cache[li].index_copy_(1, pos, v.transpose(0, 1))
        if live is not None:
            # imported here: it imports torch._dynamo (and so triton), which must not
            # happen before the CLI has chosen Triton's interpreter
            from torch.nn.attention.bias import causal_lower_right
            # [Hkv, live, D]
            K, V = self.k_cache[li, :, :live], self.v_cache[li, :, :live]
            if s.heads > s.kv_heads:
                # GQA: one K/V head per query head for the flash kernel (expand +
                # reshape is repeat_interleave without an index tensor)
                g, shape = s.heads // s.kv_heads, (s.heads, live, s.head_dim)
                K = K[:, None].expand(-1, g, -1, -1).reshape(shape)  # [Hq, live, D]
                V = V[:, None].expand(-1, g, -1, -1).reshape(shape)
            out = F.scaled_dot_product_attention(                 # [1, Hq, T, D]
                q.transpose(0, 1)[None], K[None], V[None],
                attn_mask=causal_lower_right(T, live))
            out = out[0].transpose(0, 1).reshape(T, s.q_size)     # [T, Hq*D]
            return F.linear(out, self.w(p + "o_proj.weight"))
        K, V = self.k_cache[li], self.v_cache[li]                 # [Hkv, C, D]
        g = s.heads // s.kv_heads
        K = K.repeat_interleave(g, dim=0)                         # [Hq, C, D]
        V = V.repeat_interleave(g, dim=0)
        scores = torch.einsum("thd,hcd->htc", q, K) * (s.head_dim ** -0.5)  # [Hq, T, C]
        keys = torch.arange(self.max_ctx, device=x.device)
        visible = keys[None, :] <= pos[:, None]                   # [T, C]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(x.dtype)
        out = torch.einsum("htc,hcd->thd", probs, V).reshape(T, s.q_size)  # [T, Hq*D]
        return F.linear(out, self.w(p + "o_proj.weight"))

    def mlp(self, li: int, x: torch.Tensor, all_experts: bool = False) -> torch.Tensor:
        s, p = self.spec, f"model.layers.{li}.mlp."
        if not s.is_moe:
            gate = F.linear(x, self.w(p + "gate_proj.weight"))
            up = F.linear(x, self.w(p + "up_proj.weight"))
            return F.linear(F.silu(gate) * up, self.w(p + "down_proj.weight"))
        # router: softmax over all experts in fp32, top-k, no renormalisation. Router
        # logits are bf16, so exact ties between experts are common; torch.topk leaves
        # their order unspecified (on the CPU it put expert 25 before a tied 20), so the
        # top-k is a stable sort: most probable first, the lower index first among
        # equals
        logits = F.linear(x, self.w(p + "gate.weight"))           # [T, E]
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        topw, topi = torch.sort(probs, dim=-1, descending=True, stable=True)
        topw, topi = topw[:, :s.top_k], topi[:, :s.top_k]         # [T, k]
        topw = topw.to(x.dtype)
        if all_experts:
            # every expert over every token: two matmuls that read each expert once
            # (a prefill chunk of T tokens would otherwise copy T * k experts), then the
            # top-k slots' outputs are picked and summed as below. OLMoE, T = 1024:
            # [T, E, 2I] and [T, E, H] in bf16 are 268 MB each.
            h = torch.einsum("th,eoh->teo", x,
                             self.w(p + "experts.gate_up_proj"))  # [T, E, 2I]
            gate, up = h.chunk(2, dim=-1)
            y = torch.einsum("tei,ehi->teh", F.silu(gate) * up,
                             self.w(p + "experts.down_proj"))     # [T, E, H]
            y = y.gather(1, topi[:, :, None].expand(-1, -1, y.shape[-1]))  # [T, k, H]
            return (y * topw[:, :, None]).sum(1)                  # [T, H]
        out = []
        # the gather below copies k experts' weights per token (OLMoE: 67 MB a token),
        # so a long prefill goes through it a few tokens at a time
        for t0 in range(0, x.shape[0], self.MOE_TOKENS_PER_GATHER):
            sl = slice(t0, t0 + self.MOE_TOKENS_PER_GATHER)
            gu = self.w(p + "experts.gate_up_proj")[topi[sl]]     # [t, k, 2I, H]
            dn = self.w(p + "experts.down_proj")[topi[sl]]        # [t, k, H, I]
            h = torch.einsum("tkoh,th->tko", gu, x[sl])           # [t, k, 2I]
            gate, up = h.chunk(2, dim=-1)
            y = torch.einsum("tkhi,tki->tkh", dn, F.silu(gate) * up)  # [t, k, H]
            out.append((y * topw[sl, :, None]).sum(1))            # [t, H]
        return torch.cat(out)

    def _maybe(self, name):
        return self.w(name) if name in self._names else None

    # ---- the step --------------------------------------------------------------------
    def hidden(self, tokens: torch.Tensor, pos: torch.Tensor, live: int | None = None,
               all_experts: bool = False) -> torch.Tensor:
        """The residual stream after the last layer, [T, H], writing every layer's K/V
        at ``pos`` into the cache (``live``, ``all_experts``: see ``attention`` and
        ``mlp``)."""
        s = self.spec
        x = self.w("model.embed_tokens.weight")[tokens]                     # [T, H]
        for li in range(s.layers):
            p = f"model.layers.{li}."
            h = rms_norm(x, self.w(p + "input_layernorm.weight"), s.rms_eps)
            x = x + self.attention(li, h, pos, live)
            h = rms_norm(x, self.w(p + "post_attention_layernorm.weight"), s.rms_eps)
            x = x + self.mlp(li, h, all_experts)
        return x

    def forward(self, tokens: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """tokens: [T] ids at positions pos: [T] (consecutive). Returns fp32 logits
        [T, V].

        T = 1 is the decode step; T > 1 is a batched prefill through the same code."""
        s = self.spec
        x = rms_norm(self.hidden(tokens, pos), self.w("model.norm.weight"), s.rms_eps)
        return F.linear(x, self.w("lm_head.weight")).float()

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, new_tokens: int, return_logits: bool = False):
        """Greedy decoding: a batched prefill, then one step per token.
        Returns the generated ids [new_tokens] (and the logits that chose each)."""
        prompt = prompt.to(self.device)
        n = prompt.numel()
        if n + new_tokens > self.max_ctx:
            raise ValueError(f"prompt ({n}) + new tokens ({new_tokens}) exceeds the cache "
                             f"({self.max_ctx}); use a shorter prompt or a larger max_ctx")
        self.reset()
        logits = self.forward(prompt, torch.arange(n, device=self.device))[-1:]
        out, all_logits = [], []
        for i in range(new_tokens):
            tok = logits[-1].argmax()
            out.append(tok)
            all_logits.append(logits[-1])
            if i + 1 < new_tokens:
                logits = self.forward(tok.view(1), torch.tensor([n + i], device=self.device))
        ids = torch.stack(out)
        return (ids, torch.stack(all_logits)) if return_logits else ids
