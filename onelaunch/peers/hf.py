"""Hugging Face ``generate`` as a peer: greedy at batch 1, eager (dynamic cache) or with
the static cache that transformers compiles on a GPU; timed whole, decode isolated as
``(T(1 + n new) - T(1 new)) / n``, and teacher-forced for the oracle check.
"""
from __future__ import annotations

import torch

from ..measure.timing import time_ms
from ..prompt import random_prompt
from ..weights import hf_model


def hf_static_compiles(device) -> bool:
    """Whether ``generate(cache_implementation="static")`` compiles the forward here
    (transformers 5 auto-compiles on cuda/xpu/tpu only)."""
    return torch.device(device).type in ("cuda", "xpu", "neuron", "tpu")


def set_hf_attn(model, attn: str | None):
    """Switch a HF model's attention implementation (no-op for None or no change)."""
    if attn is not None and model.config._attn_implementation != attn:
        model.set_attn_implementation(attn)
    return model


def hf_generate(model, prompt: torch.Tensor, new_tokens: int, mode: str = "eager",
                max_cache_len: int | None = None) -> torch.Tensor:
    """Greedy ``generate`` of exactly ``new_tokens`` ids [new_tokens] after ``prompt`` [n]."""
    if mode not in ("eager", "static"):
        raise ValueError(f"mode must be 'eager' or 'static', not {mode!r}")
    ids = prompt.view(1, -1)
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
              num_beams=1, attention_mask=torch.ones_like(ids), pad_token_id=0)
    if mode == "static":
        kw.update(cache_implementation="static", max_cache_len=max_cache_len)
    with torch.no_grad():
        out = model.generate(ids, **kw)
    return out[0, ids.shape[1]:]


def hf_teacher_forced(model, prompt: torch.Tensor, forced: torch.Tensor, mode: str = "eager",
                      max_cache_len: int | None = None) -> torch.Tensor:
    """HF's own greedy choice at each of ``len(forced)`` decode steps when fed the
    reference's tokens ``forced`` [n]: the same ``generate`` call as :func:`hf_generate`
    (same decode path, cache and compiled forward), with a logits processor that forces
    ``forced[i]`` at step i and the raw logits kept (``output_logits``). Returns the
    argmax of each step's raw logits: ids [n]."""
    from transformers import LogitsProcessor, LogitsProcessorList

    forced = torch.as_tensor(forced).flatten().to(prompt.device)
    n0 = prompt.numel()

    class ForceTokens(LogitsProcessor):
        def __call__(self, input_ids, scores):
            out = torch.full_like(scores, float("-inf"))
            out[:, forced[input_ids.shape[1] - n0]] = 0.0
            return out

    ids = prompt.view(1, -1)
    kw = dict(max_new_tokens=forced.numel(), min_new_tokens=forced.numel(), do_sample=False,
              num_beams=1, attention_mask=torch.ones_like(ids), pad_token_id=0,
              logits_processor=LogitsProcessorList([ForceTokens()]), output_logits=True,
              return_dict_in_generate=True)
    if mode == "static":
        kw.update(cache_implementation="static", max_cache_len=max_cache_len)
    with torch.no_grad():
        out = model.generate(ids, **kw)
    assert torch.equal(out.sequences[0, n0:], forced), "generate did not follow the forced tokens"
    return torch.stack([lg[0].float().argmax() for lg in out.logits]).cpu()


def hf_generate_ms(spec, weights, ctx: int, new_tokens: int = 128, mode: str = "eager",
                   device="cuda", *, model=None, prompt=None, repeats: int = 3,
                   warmup: int = 2, seed: int = 0, info: dict | None = None,
                   attn: str | None = "sdpa"):
    """ms per decode token of HF ``generate`` (greedy, batch 1) after a ``ctx``-token
    prompt, and the ``new_tokens`` ids it generated: ``(ms_per_token, ids[new_tokens])``.

    Decode is isolated as ``(T(1 + new_tokens) - T(1)) / new_tokens``, each T the median of
    ``repeats`` whole ``generate`` calls (CUDA events around each call; they see the host
    gaps too, since the GPU idles in them). ``warmup`` calls of each length run first; for
    ``mode="static"`` the longer run goes first and the static cache is sized for it, so
    both lengths share one cache length and one compiled graph, and the warm-up absorbs
    compilation and CUDA-graph recording (on a GPU). Each call still builds a fresh
    ``StaticCache`` (transformers does, and re-records its CUDA graphs for the new
    addresses): that is what a user calling ``generate`` pays, amortised over the run.
    Pass ``model`` to reuse a built (and compiled) model; pass a dict as ``info`` to get
    the two whole-call times and the graphs dynamo compiled while timing (should be 0).
    ``attn`` is the HF attention implementation: ``"sdpa"``, transformers' default and
    what a user runs (``spec.hf_config()`` asks for ``"eager"``, the reference's order of
    operations); None keeps the model's.
    """
    model = model if model is not None else hf_model(spec, weights)
    set_hf_attn(model, attn)
    prompt = random_prompt(spec, ctx, seed, device) if prompt is None else prompt.to(device)
    n_long = new_tokens + 1
    cache_len = prompt.numel() + n_long if mode == "static" else None
    last = {}

    def run(n):
        def f():
            last[n] = hf_generate(model, prompt, n, mode, cache_len)
        return f

    # long first: it fixes the static cache length that the short run then reuses
    for n in (n_long, 1):
        for _ in range(warmup):
            run(n)()
    g0 = dynamo_graphs()
    tl = time_ms(run(n_long), iters=repeats, warmup=0, device=device)
    to = time_ms(run(1), iters=repeats, warmup=0, device=device)
    t_long, t_one = tl.median_ms, to.median_ms
    if info is not None:
        # the spread of a decode token: the widest the two calls' spreads allow
        info.update(t_one_ms=t_one, t_long_ms=t_long,
                    ms_min=round((tl.min_ms - to.max_ms) / new_tokens, 4),
                    ms_max=round((tl.max_ms - to.min_ms) / new_tokens, 4), timed=repeats,
                    graphs_while_timing=dynamo_graphs() - g0)
    return (t_long - t_one) / new_tokens, last[n_long][:new_tokens]


def dynamo_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (a global counter: take the
    difference around a region to see that nothing recompiled in it)."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])
