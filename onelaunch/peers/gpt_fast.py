"""The strongest compiled peer: the dense decode step as gpt-fast writes it
(:class:`FastDecode`), compiled, checked against the oracle, then timed
(:func:`fast_decode_rows`).
"""
from __future__ import annotations

import contextlib
import json
import warnings

import torch

from ..measure import agree
from ..measure.timing import floor_ms, run_bandwidth
from ..oracle import Oracle, rope_cos_sin
from ..prompt import prompt_digest, random_prompt
from ..weights import random_weights
from .hf import dynamo_graphs
from .oracle_step import compiled_oracle_step, compiled_oracle_step_ms, oracle_greedy
from .rungs import check_tokens

NAME = "gpt-fast compiled"      # its rung in the ladder


class FastDecode(torch.nn.Module):
    """The dense decode step written as gpt-fast writes it, for ``torch.compile``: the
    weights and a static KV cache are module state (fixed addresses, so a CUDA graph can
    replay the step and the cache writes are allowed inside it), q/k/v are one fused
    projection and gate/up another, RoPE reads a [max_ctx, D] table at the position, and
    attention is ``scaled_dot_product_attention`` over the whole static cache with a mask.
    It rounds where HF's bf16 model (and the oracle) round. Call ``(tokens[T], pos[T]) ->
    fp32 logits [T, V]``: T = 1 is the compiled decode step; a prefill runs the same code
    eagerly. It has the oracle's ``spec``, ``device``, ``dtype``, ``max_ctx`` and
    ``reset``, so :func:`oracle_greedy` drives it."""

    def __init__(self, spec, weights: dict[str, torch.Tensor], max_ctx: int):
        super().__init__()
        if spec.is_moe or spec.qk_norm:
            raise ValueError(f"FastDecode covers the dense family, not {spec.name}")
        self.spec, self.max_ctx = spec, max_ctx
        w0 = weights["model.embed_tokens.weight"]
        self.dtype, self.device = w0.dtype, w0.device
        buf = lambda n, t: self.register_buffer(n, t, persistent=False)
        buf("embed", w0)
        buf("norm", weights["model.norm.weight"])
        buf("lm_head", weights["lm_head.weight"])
        for i in range(spec.layers):
            p, a = f"model.layers.{i}.", f"model.layers.{i}.self_attn."
            buf(f"n1_{i}", weights[p + "input_layernorm.weight"])
            buf(f"n2_{i}", weights[p + "post_attention_layernorm.weight"])
            buf(f"wqkv_{i}", torch.cat([weights[a + f"{x}_proj.weight"] for x in "qkv"]))
            buf(f"bqkv_{i}", torch.cat([weights[a + f"{x}_proj.bias"] for x in "qkv"])
                if spec.qkv_bias else None)
            buf(f"wo_{i}", weights[a + "o_proj.weight"])
            buf(f"wgu_{i}", torch.cat([weights[p + "mlp.gate_proj.weight"],
                                       weights[p + "mlp.up_proj.weight"]]))
            buf(f"wd_{i}", weights[p + "mlp.down_proj.weight"])
        shape = (spec.layers, 1, spec.kv_heads, max_ctx, spec.head_dim)   # [L, B, Hkv, C, D]
        buf("k_cache", torch.zeros(shape, dtype=self.dtype, device=self.device))
        buf("v_cache", torch.zeros(shape, dtype=self.dtype, device=self.device))
        cos, sin = rope_cos_sin(torch.arange(max_ctx, device=self.device), spec.head_dim,
                                spec.rope_theta, self.dtype)
        buf("cos", cos)
        buf("sin", sin)
        buf("keys", torch.arange(max_ctx, device=self.device))

    def reset(self):
        self.k_cache.zero_()
        self.v_cache.zero_()

    def _rms(self, x, g):
        x32 = x.float()
        return g * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.spec.rms_eps)).to(x.dtype)

    def _rope(self, t, pos):
        # t: [1, H, T, D]; HF's rotate_half form: x cos + rotate_half(x) sin
        c, s = self.cos[pos][None, None], self.sin[pos][None, None]              # [1, 1, T, D]
        d = t.shape[-1] // 2
        return t * c + torch.cat((-t[..., d:], t[..., :d]), -1) * s

    def forward(self, tokens, pos):
        s = self.spec
        T, H, Hkv, D = tokens.shape[0], s.heads, s.kv_heads, s.head_dim
        x = self.embed[tokens]                                         # [T, hidden]
        mask = (self.keys[None, :] <= pos[:, None])[None, None]        # [1, 1, T, C]
        for i in range(s.layers):
            g = lambda n: getattr(self, f"{n}_{i}")
            qkv = torch.nn.functional.linear(self._rms(x, g("n1")), g("wqkv"),
                                             g("bqkv"))
            q, k, v = qkv.split([H * D, Hkv * D, Hkv * D], -1)
            # [1, H, T, D]
            q = self._rope(q.view(T, H, D).transpose(0, 1)[None], pos)
            # [1, Hkv, T, D]
            k = self._rope(k.view(T, Hkv, D).transpose(0, 1)[None], pos)
            v = v.view(T, Hkv, D).transpose(0, 1)[None]
            self.k_cache[i].index_copy_(2, pos, k)
            self.v_cache[i].index_copy_(2, pos, v)
            a = torch.nn.functional.scaled_dot_product_attention(
                q, self.k_cache[i], self.v_cache[i], attn_mask=mask, enable_gqa=True)
            x = x + torch.nn.functional.linear(a[0].transpose(0, 1).reshape(T, H * D),
                                               g("wo"))
            gate, up = torch.nn.functional.linear(self._rms(x, g("n2")),
                                                  g("wgu")).chunk(2, -1)
            x = x + torch.nn.functional.linear(torch.nn.functional.silu(gate) * up,
                                               g("wd"))
        return torch.nn.functional.linear(self._rms(x, self.norm), self.lm_head).float()


def fast_decode_rows(spec, ctx: int = 512, device="cuda", iters: int = 50,
                     new_tokens: int = 64, seed: int = 0, weights=None,
                     modes=("max-autotune", "reduce-overhead"),
                     read_tbps: float | None = None, ref=None) -> list[dict]:
    """The gpt-fast peer, checked then timed: one ladder row, "gpt-fast compiled".

    The module is compiled once per mode in ``modes`` (inductor; ``reduce-overhead`` and
    ``max-autotune`` both record CUDA graphs), each compiled step is teacher-forced along
    the eager oracle's greedy tokens and judged by the agreement rule, and the faster mode
    that passes is the row's time (both are in ``modes_ms``); ``ref``: the oracle's greedy
    ``(ids, logits)`` over this prompt when the caller already ran it (``bench``'s one
    oracle run, over ``random_prompt(spec, ctx, seed)``). A mode whose check fails is
    refused. On the CPU (a smoke run: no floor) one mode runs, dynamo with
    ``backend="aot_eager"`` (inductor's CPU code takes minutes to compile), and the row
    says so in its ``note``. ``read_tbps``: the run's bandwidth (measured here when
    None), so that its floor is the other rows' floor. The row carries the best mode's
    spread (``ms_min``, ``ms_max`` over ``timed`` steps)."""
    cuda = torch.device(device).type == "cuda"
    if weights is None:
        weights = random_weights(spec, seed=seed, device=device,
                                 dtype=torch.bfloat16 if cuda else torch.float32)
    if not cuda:
        modes = ("aot_eager",)                        # a backend, not a mode: the smoke run
    bw = read_tbps if read_tbps is not None else run_bandwidth(device)
    floor = floor_ms(spec, bw, ctx)
    prompt = random_prompt(spec, ctx, seed, device)
    max_ctx = ctx + new_tokens + 1
    if ref is None:
        oracle = Oracle(spec, weights, max_ctx=max_ctx).eval()
        ref_ids, _, ref_logits = oracle_greedy(oracle, prompt, new_tokens, return_logits=True)
        del oracle
    else:                                   # over this prompt: random_prompt(spec, ctx, seed)
        if ref[0].numel() < new_tokens:
            raise ValueError(f"the oracle's reference has {ref[0].numel()} tokens; the "
                             f"gpt-fast peer checks {new_tokens}")
        ref_ids, ref_logits = ref[0][:new_tokens].to(device), ref[1][:new_tokens]
    fast = FastDecode(spec, weights, max_ctx).eval()
    times, checks, graphs, spreads = {}, {}, {}, {}
    # gpt-fast's inductor settings: coordinate-descent tuning of the generated kernels
    # (the reductions a GEMV becomes), unique kernel names; and no autotune report
    # (inductor writes each choice's timing to stderr, into the chapter's output)
    tuned = contextlib.nullcontext()
    if cuda:
        icfg = torch._inductor.config
        quiet = {k: v for k, v in (("max_autotune_report_choices_stats", False),
                                   ("autotune_num_choices_displayed", 0))
                 if hasattr(icfg, k)}
        tuned = icfg.patch(coordinate_descent_tuning=True,
                           **{"triton.unique_kernel_names": True}, **quiet)
    with tuned, warnings.catch_warnings():   # compiling happens at the first call: inside
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
        for mode in modes:
            torch._dynamo.reset()
            g0 = dynamo_graphs()
            step = (compiled_oracle_step(fast, mode=mode, backend="inductor") if cuda
                    else compiled_oracle_step(fast, backend=mode))
            tf, _ = oracle_greedy(fast, prompt, new_tokens, step=step, compiled=True,
                                  forced=ref_ids)
            checks[mode] = check_tokens(ref_logits, tf)
            if checks[mode]["ok"]:
                spreads[mode] = {}
                times[mode] = compiled_oracle_step_ms(fast, ctx, iters, device, step=step,
                                                      info=spreads[mode])
            graphs[mode] = dynamo_graphs() - g0
    best = min(times, key=times.get) if times else None
    c = checks[best] if best else checks[modes[0]]
    ms = None if best is None else times[best]
    r = {"model": spec.name, "rung": NAME, "ctx": ctx, "kind": "peer",
         "ms_per_token": None if ms is None else round(ms, 4),
         "floor_ms": None if floor is None else round(floor, 4),
         "read_tbps": None if bw is None else round(bw, 3),
         "x_floor": None if ms is None or floor is None else round(ms / floor, 3),
         "agree": c["agree"], "flips": agree.disagreements(c), "new_tokens": new_tokens,
         "device": str(device), "dtype": str(fast.dtype).replace("torch.", ""),
         "prompt": prompt_digest(prompt),
         **{k: spreads.get(best, {}).get(k) for k in ("ms_min", "ms_max", "timed")},
         "modes_ms": {m: round(t, 4) for m, t in times.items()}, "graphs": graphs,
         "rule": f"teacher-forced; gap < {agree.NEAR_TIE_ULPS} bf16 ulps of the top logit",
         "note": (f"gpt-fast-style module, torch.compile(mode={best!r}), the faster of "
                  f"{list(modes)}, coordinate-descent tuning"
                  if cuda else "cpu smoke: torch.compile(backend='aot_eager'), no CUDA graphs")}
    bad = {m: agree.describe(checks[m]) for m in modes if not checks[m]["ok"]}
    if bad:
        r["refused" if best is None else "refused_modes"] = json.dumps(bad)
    return [r]
