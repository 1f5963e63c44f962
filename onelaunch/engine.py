"""The engine: packed weights, static buffers, one decode step as a list of launches,
captured once into a CUDA graph and replayed for every token.

Everything that changes from one token to the next lives in a device tensor that the
kernels read on replay:

    seq        int32 [max_ctx]   the tokens: the prompt, then what greedy decoding chose
    pos        int32 [1]         position of the token the next step consumes
    prompt_len int32 [1]         steps before this only fill the cache (prefill)

The step reads seq[pos], writes K/V at slot pos, attends over pos + 1 keys, writes its
argmax to seq[pos + 1] (once past the prompt) and advances pos, all on the GPU. So the
host launches one graph per token and reads tokens back in batches. The attention length,
the KV slot and the input token are all derived from ``pos``: a recorded launch is
byte-identical at every step, while the sequence grows underneath it.

Modes: ``graph=False`` runs the same launches eagerly (the "fused eager" rung);
``attention="plain"`` uses one program per query head, ``"splitk"`` the flash-decode pair;
``pdl=True`` launches every kernel with programmatic dependent launch (Hopper+);
``fuse_rope=True`` (with split-K) does RoPE and the KV write inside the split-K partial
kernel, one launch fewer per layer (``kernels/attention_onekernel.py``); on the H200 it
measured 0.01-0.03 ms a token slower than the separate RoPE kernel, so no rung uses it.
The engine covers the dense family; the MoE engine is a later chapter.
"""
from __future__ import annotations

import torch

from . import kernels as K
from .kernels import config
from .oracle import rope_cos_sin
from .specs import get_spec


class EngineError(ValueError):
    """Bad input to the engine: the message says what to do."""


def pack_weights(spec, w: dict[str, torch.Tensor]) -> dict:
    """Per-layer packed tensors in the layouts the kernels read (one copy, made once):
    W_qkv = [W_q; W_k; W_v] and b_qkv, W_gate_up = [W_gate; W_up]."""
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
            "w_gate_up": torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]),
            "w_down": w[p + "mlp.down_proj.weight"],
        }
        layers.append(L)
    return {"layers": layers, "embed": w["model.embed_tokens.weight"],
            "norm": w["model.norm.weight"], "lm_head": w["lm_head.weight"]}


class Engine:
    def __init__(self, spec, weights: dict[str, torch.Tensor], max_ctx: int | None = None,
                 attention: str = "splitk", pdl: bool = False, fuse_rope: bool = False,
                 device=None):
        self.spec = spec = get_spec(spec)
        if spec.is_moe:
            raise EngineError(f"{spec.name} is a mixture of experts; this engine runs the dense "
                              "family (qwen2.5-1.5b, tiny-qwen2)")
        if attention not in ("plain", "splitk"):
            raise EngineError("attention must be 'plain' or 'splitk'")
        w0 = weights["model.embed_tokens.weight"]
        self.device = torch.device(device or w0.device)
        if self.device.type == "cpu" and not config.interpreting():
            raise EngineError("the Triton kernels need a CUDA GPU; on a CPU set TRITON_INTERPRET=1 "
                              "(slow: tiny models only)")
        if w0.dtype != torch.bfloat16:
            raise EngineError("the kernels read bf16 weights: build them with dtype=torch.bfloat16")
        self.max_ctx = max_ctx or spec.max_ctx
        self.attention = attention
        self.pdl = bool(pdl) and config.pdl_supported(self.device)
        if fuse_rope and (spec.qk_norm or attention != "splitk"):
            raise EngineError("fuse_rope needs split-K attention and a model without q/k norm "
                              "(whose RMS spans all heads)")
        self.fuse_rope = bool(fuse_rope)
        self.W = pack_weights(spec, weights)
        dev, bf = self.device, torch.bfloat16
        s = spec
        # ---- per-step state (read by the kernels on replay) -----------------------------
        self.seq = torch.zeros(self.max_ctx + 1, dtype=torch.int32, device=dev)
        self.argmax = torch.zeros(self.max_ctx + 1, dtype=torch.int32, device=dev)  # every step's argmax
        self.pos = torch.zeros(1, dtype=torch.int32, device=dev)
        self.prompt_len = torch.zeros(1, dtype=torch.int32, device=dev)
        # ---- activations: each one named, none reallocated -------------------------------
        self.x = torch.zeros(s.hidden, dtype=bf, device=dev)            # residual stream
        self.qkv = torch.zeros(s.qkv_size, dtype=bf, device=dev)        # q|k|v before RoPE
        self.q = torch.zeros(s.q_size, dtype=bf, device=dev)            # q after RoPE
        self.attn = torch.zeros(s.q_size, dtype=bf, device=dev)         # attention output
        self.h = torch.zeros(s.intermediate, dtype=bf, device=dev)      # SwiGLU output
        self.logits = torch.zeros(s.vocab, dtype=torch.float32, device=dev)
        # ---- caches: [layers, Hkv, max_ctx, D], one timeline per (layer, kv head) -----
        shape = (s.layers, s.kv_heads, self.max_ctx, s.head_dim)
        self.k_cache = torch.zeros(shape, dtype=bf, device=dev)
        self.v_cache = torch.zeros(shape, dtype=bf, device=dev)
        cos, sin = rope_cos_sin(torch.arange(self.max_ctx, device=dev), s.head_dim, s.rope_theta, bf)
        self.cos, self.sin = cos.contiguous(), sin.contiguous()          # [max_ctx, D]
        # ---- split-K attention partials [Hq, n_splits(, D)] ---------------------------
        self.chunk = K.chunk_for(self.max_ctx)
        n_splits = K.n_splits_for(self.max_ctx, self.chunk)
        self.part_o = torch.zeros(s.heads, n_splits, s.head_dim, dtype=torch.float32, device=dev)
        self.part_m = torch.zeros(s.heads, n_splits, dtype=torch.float32, device=dev)
        self.part_l = torch.zeros(s.heads, n_splits, dtype=torch.float32, device=dev)
        # ---- last-arrival reductions: counters zero between calls, kept zero by the kernels
        self.down_scratch = torch.zeros(16 * s.hidden, dtype=torch.float32, device=dev)  # [SPLIT_K, N]
        self.down_counter = torch.zeros(s.hidden, dtype=torch.int32, device=dev)
        n_prog = K.programs_for(s.vocab, dev)
        self.lm_val = torch.zeros(n_prog, dtype=torch.float32, device=dev)
        self.lm_idx = torch.zeros(n_prog, dtype=torch.int32, device=dev)
        self.lm_counter = torch.zeros(1, dtype=torch.int32, device=dev)
        self.attn_counter = torch.zeros(s.kv_heads, dtype=torch.int32, device=dev)
        self.cfg = {op: config.get(op, dev) for op in
                    ("rms_qkv", "o_proj", "gate_up", "down", "lm_head", "attention", "attn_split")}
        self.graph = None

    # ------------------------------------------------------------------------------------
    def launches_per_step(self) -> int:
        per_layer = 6 + (1 if self.attention == "splitk" else 0) - (1 if self.fuse_rope else 0)
        return 2 + per_layer * self.spec.layers

    def step_launches(self):
        """Launch one decode step. Reads seq/pos on the GPU; no host synchronisation."""
        s, W, pdl, eps = self.spec, self.W, self.pdl, self.spec.rms_eps
        K.embed(W["embed"], self.x, self.seq, self.pos, use_pdl=pdl)
        for li, L in enumerate(W["layers"]):
            kc, vc = self.k_cache[li], self.v_cache[li]
            K.rms_qkv(self.x, L["input_norm"], L["w_qkv"], L["b_qkv"], self.qkv, eps,
                      use_pdl=pdl, cfg=self.cfg["rms_qkv"])
            if self.fuse_rope:   # RoPE + KV write + split-K partial, then the reduce kernel
                K.attention_onekernel(self.qkv, kc, vc, self.cos, self.sin, self.attn, self.pos,
                                      self.part_o, self.part_m, self.part_l, self.attn_counter,
                                      s.heads, s.kv_heads, s.head_dim, self.chunk,
                                      self.cfg["attn_split"], use_pdl=pdl, fuse_reduce=False)
            else:
                K.rope_kv_write(self.qkv, self.q, kc, vc, self.cos, self.sin, self.pos,
                                s.heads, s.kv_heads, s.head_dim, use_pdl=pdl)
                if self.attention == "plain":
                    K.attention(self.q, kc, vc, self.attn, self.pos, s.heads, s.kv_heads,
                                s.head_dim, self.cfg["attention"], use_pdl=pdl)
                else:
                    K.attention_splitk(self.q, kc, vc, self.attn, self.pos, self.part_o,
                                       self.part_m, self.part_l, s.heads, s.kv_heads, s.head_dim,
                                       self.chunk, self.cfg["attn_split"], use_pdl=pdl)
            K.o_proj_residual(self.attn, L["w_o"], self.x, use_pdl=pdl, cfg=self.cfg["o_proj"])
            K.rms_gate_up_swiglu(self.x, L["post_norm"], L["w_gate_up"], self.h, eps,
                                 use_pdl=pdl, cfg=self.cfg["gate_up"])
            K.down_residual(self.h, L["w_down"], self.x, self.down_scratch, self.down_counter,
                            use_pdl=pdl, cfg=self.cfg["down"])
        K.lm_head_argmax(self.x, W["norm"], W["lm_head"], self.logits, self.lm_val, self.lm_idx,
                         self.lm_counter, self.seq, self.pos, self.prompt_len, eps,
                         use_pdl=pdl, cfg=self.cfg["lm_head"], argmax=self.argmax)

    def capture(self):
        """Record one step into a CUDA graph (after a warm-up that compiles every kernel).
        The warm-up runs real steps, so callers reset the state afterwards."""
        if self.device.type != "cuda":
            # CPU smoke runs (Triton's interpreter): there is no graph to record, so a
            # "graph" step runs the same launches eagerly. Only the GPU measures graphs.
            self.graph = "emulated"
            return self.graph
        saved = self.pos.clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                self.step_launches()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.step_launches()
        torch.cuda.synchronize()
        self.pos.copy_(saved)
        return self.graph

    def step(self, graph: bool = True):
        if graph:
            if self.graph is None:
                self.capture()
            if self.graph == "emulated":
                self.step_launches()
            else:
                self.graph.replay()
        else:
            self.step_launches()

    # ------------------------------------------------------------------------------------
    def check_prompt(self, prompt_ids, max_new_tokens: int):
        ids = torch.as_tensor(prompt_ids).flatten()
        if ids.numel() == 0:
            raise EngineError("the prompt is empty: give at least one token id")
        if max_new_tokens < 1:
            raise EngineError("max_new_tokens must be at least 1")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= self.spec.vocab:
            raise EngineError(f"token id {lo if lo < 0 else hi} is out of range for "
                              f"{self.spec.name} (vocabulary 0..{self.spec.vocab - 1})")
        if ids.numel() + max_new_tokens > self.max_ctx:
            raise EngineError(f"prompt ({ids.numel()}) + new tokens ({max_new_tokens}) exceeds the "
                              f"engine's context ({self.max_ctx}); shorten the prompt or build the "
                              f"engine with a larger max_ctx")
        return ids

    def start(self, prompt_ids):
        """Load a prompt into the sequence buffer and rewind to position 0."""
        ids = torch.as_tensor(prompt_ids).flatten()
        self.seq.zero_()
        self.seq[: ids.numel()] = ids.to(device=self.device, dtype=torch.int32)
        self.pos.zero_()
        self.prompt_len.fill_(ids.numel())

    @torch.no_grad()
    def generate(self, prompt_ids, max_new_tokens: int, graph: bool = True,
                 on_tokens=None, read_every: int = 64):
        """Greedy decoding. Prefill runs the same step over the prompt (each step writes one
        KV slot); every step after the prompt appends its argmax on the GPU and the next
        step reads it there. The host never waits per token: with ``on_tokens`` (a
        callback taking a list of ids) it reads the new tokens every ``read_every``
        steps, a batched read for streaming output; otherwise once, at the end."""
        ids = self.check_prompt(prompt_ids, max_new_tokens)
        n = ids.numel()
        if graph and self.graph is None:
            self.capture()
        self.start(ids)
        steps = n - 1 + max_new_tokens
        done = 0                                       # tokens handed to on_tokens so far
        for i in range(steps):
            self.step(graph)
            ready = i + 2 - n                          # tokens generated after this step
            if on_tokens is not None and ready - done >= read_every:
                on_tokens(self.seq[n + done: n + ready].tolist())
                done = ready
        out = self.seq[n: n + max_new_tokens].tolist()
        if on_tokens is not None and done < max_new_tokens:
            on_tokens(out[done:])
        return torch.tensor(out, dtype=torch.long)

    @torch.no_grad()
    def teacher_forced(self, prompt_ids, forced_ids, graph: bool = True):
        """Run the step over prompt + forced tokens (all treated as prompt) and return the
        argmax chosen at each forced position: the engine's greedy choice given the same
        prefix as the reference, so a near tie early on cannot hide later steps."""
        ids = torch.cat([torch.as_tensor(prompt_ids).flatten(), torch.as_tensor(forced_ids).flatten()])
        n, m = torch.as_tensor(prompt_ids).numel(), torch.as_tensor(forced_ids).numel()
        self.check_prompt(ids, 1)
        if graph and self.graph is None:
            self.capture()
        self.start(ids)
        self.argmax.zero_()
        for _ in range(n + m - 1):
            self.step(graph)
        return self.argmax[n: n + m].cpu().long()

    def adopt_cache(self, k_cache: torch.Tensor, v_cache: torch.Tensor, upto: int, tokens):
        """Start decoding at position ``upto`` from a cache filled elsewhere (the oracle's
        batched prefill: same layout). ``tokens`` are the ids at positions 0..upto."""
        C = min(self.max_ctx, k_cache.shape[2])
        self.k_cache[:, :, :C].copy_(k_cache[:, :, :C])
        self.v_cache[:, :, :C].copy_(v_cache[:, :, :C])
        t = torch.as_tensor(tokens).flatten()
        self.seq.zero_()
        self.seq[: t.numel()] = t.to(self.device, torch.int32)
        self.pos.fill_(upto)
        self.prompt_len.fill_(t.numel())
