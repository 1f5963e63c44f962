"""Peers: what a user would run instead of our kernels, measured at batch 1 in this process.

Four rungs, each checked against the eager oracle over the same prompt, then timed per
decode token at context ``ctx``. The check is the one our rungs pass
(:mod:`onelaunch.agree`): each peer is teacher-forced along the oracle's greedy tokens
(fed the oracle's token at every step, its own argmax recorded), every step is judged by
the agreement rule, and a peer with a real flip is refused: its row gets no time.

``HF eager``         transformers ``generate``, greedy, dynamic cache: the default.
``HF static``        ``generate(..., cache_implementation="static")``: transformers compiles
                     the decode forward itself (``torch.compile(mode="reduce-overhead")``,
                     so CUDA graphs) on a GPU; on the CPU it only uses the static cache.
``oracle eager``     :class:`onelaunch.oracle.Oracle`, one decode step (T=1), op by op.
``oracle compiled``  the same step under ``torch.compile(mode="reduce-overhead")``: the
                     gpt-fast recipe. The KV cache and the weights are module buffers
                     (static addresses, so mutating the cache is allowed inside a CUDA
                     graph) and the position is a device tensor, so one graph serves
                     every step.
``gpt-fast compiled`` (:func:`fast_decode_rows`, GPU only, not in :data:`RUNGS` yet)
                     :class:`FastDecode`, the step as gpt-fast writes it (fused QKV and
                     gate/up, weights and static cache as module state, SDPA), compiled
                     with ``mode="max-autotune"`` and ``"reduce-overhead"``; the faster
                     mode that passes the check is shown. The strongest compiled peer.

``generate`` is timed whole and decode isolated as
``(T(1 + n new) - T(1 new)) / n``: the prefill and the per-call set-up cancel. The oracle
steps are timed per step with :func:`onelaunch.timing.time_ms` at position ``ctx``.
Compiling the HF forward ourselves is not a rung: on transformers 5.17 wrapping
``model.forward`` in ``torch.compile(mode="reduce-overhead")`` fails on the static cache
("skipping cudagraphs due to mutated inputs", then an overwrite error);
``cache_implementation="static"`` is the supported path.

On the CPU (tiny models, fp32) every rung runs, for smoke tests only: there is no floor
(``floor_ms`` is None), HF static is not compiled (transformers compiles on GPUs only), and
the compiled oracle uses ``backend="aot_eager"`` by default (dynamo capture and
functionalisation of the cache writes, no code generation, no CUDA graphs). Every such
row carries a ``note`` saying so.
"""
from __future__ import annotations

import contextlib
import json
import warnings
from dataclasses import dataclass, asdict, field

import torch

from . import agree
from .oracle import Oracle
from .specs import get_spec
from .timing import read_bandwidth, time_ms
from .weights import hf_model, random_weights

RUNGS = ("HF eager", "HF static", "oracle eager", "oracle compiled")

def _is_cuda(device) -> bool:
    return torch.device(device).type == "cuda"


def _sync(device):
    if _is_cuda(device):
        torch.cuda.synchronize(device)


def make_prompt(spec, ctx: int, seed: int = 0, device="cpu") -> torch.Tensor:
    """A seeded random prompt of ``ctx`` token ids: [ctx] int64 (same ids on any device)."""
    spec = get_spec(spec)
    g = torch.Generator().manual_seed(1000 + seed)
    return torch.randint(0, spec.vocab, (ctx,), generator=g).to(device)


# ---------------------------------------------------------------------------------------
# Agreement
# ---------------------------------------------------------------------------------------
@dataclass
class Agreement:
    """Free-running greedy tokens of a rung against the reference's: ``k`` is the length
    of the common prefix (after the first flip the two runs continue from different
    contexts, so later positions say nothing; the check that gates a peer is
    teacher-forced: :func:`check_tokens`)."""
    k: int
    n: int
    first_flip: int | None = None

    def __str__(self):
        return f"{self.k}/{self.n}"

    @property
    def full(self) -> bool:
        return self.k == self.n


def agreement(ids, ref_ids) -> Agreement:
    """Compare greedy ids [n] with the reference's [>= n] (prefix agreement)."""
    a = torch.as_tensor(ids).flatten().cpu()
    b = torch.as_tensor(ref_ids).flatten().cpu()[: a.numel()]
    n = a.numel()
    diff = (a != b).nonzero()
    if diff.numel() == 0:
        return Agreement(n, n)
    i = int(diff[0])
    return Agreement(i, n, i)


def check_tokens(ref_logits: torch.Tensor, forced_choices) -> dict:
    """The gate of a peer: its teacher-forced choices [n] judged against the oracle's
    logits [>= n, V] by the agreement rule (:func:`onelaunch.agree.judge_tokens`)."""
    got = torch.as_tensor(forced_choices).flatten().cpu()
    return agree.judge_tokens(ref_logits[: got.numel()], got)


# ---------------------------------------------------------------------------------------
# Hugging Face generate
# ---------------------------------------------------------------------------------------
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
    spec = get_spec(spec)
    model = model if model is not None else hf_model(spec, weights)
    set_hf_attn(model, attn)
    prompt = make_prompt(spec, ctx, seed, device) if prompt is None else prompt.to(device)
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
    t_long = time_ms(run(n_long), iters=repeats, warmup=0, device=device).median_ms
    t_one = time_ms(run(1), iters=repeats, warmup=0, device=device).median_ms
    if info is not None:
        info.update(t_one_ms=t_one, t_long_ms=t_long,
                    graphs_while_timing=dynamo_graphs() - g0)
    return (t_long - t_one) / new_tokens, last[n_long][:new_tokens]


def dynamo_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (a global counter: take the
    difference around a region to see that nothing recompiled in it)."""
    from torch._dynamo.utils import counters
    return int(counters["stats"]["unique_graphs"])


# ---------------------------------------------------------------------------------------
# The oracle, eager and compiled
# ---------------------------------------------------------------------------------------
def _prefill_chunk(spec, n: int, itemsize: int = 4, budget_bytes: float = 1 << 30) -> int:
    """Tokens per prefill chunk. The oracle's MoE branch gathers each token's top-k
    expert matrices ([T, k, 2I, H] and [T, k, H, I]), so a 512-token OLMoE prefill in one
    call would gather ~50 GB; chunks keep it under ``budget_bytes``."""
    if not spec.is_moe:
        return n
    per_tok = spec.top_k * 3 * spec.intermediate * spec.hidden * itemsize
    return max(1, min(n, int(budget_bytes // per_tok)))


@torch.no_grad()
def oracle_greedy(oracle: Oracle, prompt: torch.Tensor, new_tokens: int, step=None,
                  compiled: bool = False, forced=None, return_logits: bool = False):
    """Greedy decoding with the oracle: a chunked eager prefill, then ``new_tokens - 1``
    decode steps through ``step(tok[1], pos[1]) -> logits[1, V]`` (the oracle itself by
    default, or :func:`compiled_oracle_step`). Returns ``(ids[new_tokens],
    margins[new_tokens])``, margins being top-1 minus top-2 logit of each choice, and with
    ``return_logits`` also the logits [new_tokens, V] (fp32, on the CPU).

    ``forced`` (ids [>= new_tokens - 1]) teacher-forces the run: step i + 1 is fed
    ``forced[i]`` instead of the argmax at step i; ``ids`` are still the step's own
    argmax choices, which is what the agreement rule judges.

    The position is a device tensor advanced in place and the token never leaves the
    device, so the loop makes no host sync until the end."""
    step = oracle if step is None else step
    dev = oracle.device
    prompt = prompt.to(dev)
    n = prompt.numel()
    if n + new_tokens > oracle.max_ctx:
        raise ValueError(f"prompt ({n}) + new tokens ({new_tokens}) exceeds the oracle's "
                         f"cache ({oracle.max_ctx})")
    if forced is not None:
        forced = torch.as_tensor(forced).flatten().to(dev)
    oracle.reset()
    c = _prefill_chunk(oracle.spec, n, oracle.dtype.itemsize)
    for lo in range(0, n, c):
        hi = min(n, lo + c)
        logits = oracle(prompt[lo:hi], torch.arange(lo, hi, device=dev))
    last = logits[-1]                                                          # [V] fp32
    pos = torch.tensor([n], device=dev)                                        # [1]
    cur = torch.zeros(1, dtype=torch.long, device=dev)                         # [1]
    ids, margins, all_logits = [], [], []
    for i in range(new_tokens):
        tok = last.argmax()                                                    # first max, as HF
        top2 = last.topk(2).values
        ids.append(tok)
        margins.append(top2[0] - top2[1])
        if return_logits:
            all_logits.append(last.float().cpu())
        if i + 1 < new_tokens:
            # a plain [1] tensor, like the timed call's: no recompile on views
            cur.copy_(tok if forced is None else forced[i])
            if compiled:
                torch.compiler.cudagraph_mark_step_begin()
            last = step(cur, pos)[-1]  # read before the next replay overwrites it
            pos += 1
    out = (torch.stack(ids), torch.stack(margins))
    return out + (torch.stack(all_logits),) if return_logits else out


def oracle_step_ms(oracle: Oracle, ctx: int, iters: int = 50, device="cuda",
                   warmup: int = 5) -> float:
    """Median ms of one eager oracle decode step (T=1) at position ``ctx``."""
    if ctx >= oracle.max_ctx:
        raise ValueError(f"position {ctx} is outside the oracle's cache ({oracle.max_ctx})")
    tok = torch.tensor([1], device=device)
    pos = torch.tensor([ctx], device=device)
    with torch.no_grad():
        return time_ms(lambda: oracle(tok, pos), iters=iters, warmup=warmup,
                       device=device).median_ms


@dataclass
class CompiledStep:
    """A compiled decode step: call ``step(tok[1], pos[1]) -> logits[1, V]`` (call
    ``torch.compiler.cudagraph_mark_step_begin()`` before each call under
    ``reduce-overhead``; :func:`oracle_greedy` and :func:`compiled_oracle_step_ms` do)."""
    fn: object
    mode: str | None
    backend: str
    note: str = ""
    cudagraphs: bool = field(default=False)

    def __call__(self, tok, pos):
        return self.fn(tok, pos)


def compiled_oracle_step(oracle: Oracle, mode: str | None = None, backend: str | None = None,
                         fullgraph: bool = True) -> CompiledStep:
    """The oracle's decode step under ``torch.compile``.

    On a GPU the default is the gpt-fast recipe: inductor, ``mode="reduce-overhead"``
    (CUDA graphs). ``Oracle.forward`` compiles as it is: the weights and the KV cache are
    module buffers, which dynamo marks as static inputs, so the in-place cache writes are
    allowed inside the graph; attention runs over the whole static cache with a mask, so
    the step has one shape at every position. Only the T=1 step is compiled; the prefill
    stays eager on the same buffers.

    On the CPU the default is ``backend="aot_eager"``: it checks that the step captures
    as one graph with its cache mutations, in seconds; pass ``backend="inductor"`` for CPU
    code generation (slow to compile, and no CUDA graphs)."""
    cuda = oracle.device.type == "cuda"
    if backend is None:
        backend = "inductor" if cuda else "aot_eager"
    if mode is None and backend == "inductor":
        mode = "reduce-overhead" if cuda else "default"
    kw = dict(backend=backend, fullgraph=fullgraph)
    if mode is not None:
        kw["mode"] = mode
    fn = torch.compile(oracle, **kw)
    graphs = cuda and backend == "inductor" and mode in ("reduce-overhead", "max-autotune")
    note = "" if cuda else (f"cpu smoke: torch.compile(backend={backend!r}"
                            + (f", mode={mode!r}" if mode else "") + "), no CUDA graphs")

    def step(tok, pos):
        with torch.no_grad():
            return fn(tok, pos)

    return CompiledStep(step, mode, backend, note, graphs)


def compiled_oracle_step_ms(oracle: Oracle, ctx: int, iters: int = 50, device="cuda",
                            step: CompiledStep | None = None, warmup: int = 5) -> float:
    """Median ms of one compiled decode step at position ``ctx`` (one CUDA-graph replay
    under reduce-overhead). Compiles first when ``step`` is None; the warm-up calls cover
    compilation and graph recording, which :func:`oracle_greedy` has usually done already."""
    if ctx >= oracle.max_ctx:
        raise ValueError(f"position {ctx} is outside the oracle's cache ({oracle.max_ctx})")
    step = compiled_oracle_step(oracle) if step is None else step
    tok = torch.tensor([1], device=device)
    pos = torch.tensor([ctx], device=device)

    def one():
        torch.compiler.cudagraph_mark_step_begin()
        step(tok, pos)

    return time_ms(one, iters=iters, warmup=max(3, warmup), device=device).median_ms


def compiled_oracle_greedy(oracle: Oracle, prompt: torch.Tensor, new_tokens: int,
                           step: CompiledStep | None = None):
    """Greedy ids through the compiled step (eager prefill): ``(ids, margins)``."""
    step = compiled_oracle_step(oracle) if step is None else step
    return oracle_greedy(oracle, prompt, new_tokens, step=step, compiled=True)


# ---------------------------------------------------------------------------------------
# The strongest compiled peer: a gpt-fast-style decode module
# ---------------------------------------------------------------------------------------
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
        from .oracle import rope_cos_sin
        spec = get_spec(spec)
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


def fast_decode_rows(spec_name, ctx: int = 512, device="cuda", iters: int = 50,
                     new_tokens: int = 64, seed: int = 0, weights=None,
                     modes=("max-autotune", "reduce-overhead")) -> list[dict]:
    """The gpt-fast peer, checked then timed: one ladder row, "gpt-fast compiled".

    The module is compiled once per mode in ``modes`` (inductor; ``reduce-overhead`` and
    ``max-autotune`` both record CUDA graphs), each compiled step is teacher-forced along
    the eager oracle's greedy tokens and judged by the agreement rule, and the faster mode
    that passes is the row's time (both are in ``modes_ms``). A mode whose check fails is
    refused. On the CPU (a smoke run: fp32 weights, no floor) one mode runs, dynamo with
    ``backend="aot_eager"`` (inductor's CPU code takes minutes to compile), and the row
    says so in its ``note``."""
    cuda = _is_cuda(device)
    spec = get_spec(spec_name)
    if weights is None:
        weights = random_weights(spec, seed=seed, device=device,
                                 dtype=torch.bfloat16 if cuda else torch.float32)
    if not cuda:
        modes = ("aot_eager",)                        # a backend, not a mode: the smoke run
    bw = read_bandwidth(device) if cuda else None
    floor = spec.floor_ms(bw, ctx) if bw else None
    prompt = make_prompt(spec, ctx, seed, device)
    max_ctx = ctx + new_tokens + 1
    oracle = Oracle(spec, weights, max_ctx=max_ctx).eval()
    ref_ids, _, ref_logits = oracle_greedy(oracle, prompt, new_tokens, return_logits=True)
    del oracle
    fast = FastDecode(spec, weights, max_ctx).eval()
    times, checks, graphs = {}, {}, {}
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
                times[mode] = compiled_oracle_step_ms(fast, ctx, iters, device, step=step)
            graphs[mode] = dynamo_graphs() - g0
    best = min(times, key=times.get) if times else None
    c = checks[best] if best else checks[modes[0]]
    ms = None if best is None else times[best]
    r = {"model": spec.name, "rung": "gpt-fast compiled", "ctx": ctx, "kind": "peer",
         "ms_per_token": None if ms is None else round(ms, 4),
         "floor_ms": None if floor is None else round(floor, 4),
         "read_tbps": None if bw is None else round(bw, 3),
         "x_floor": None if ms is None or floor is None else round(ms / floor, 3),
         "agree": c["agree"], "flips": agree.disagreements(c), "new_tokens": new_tokens,
         "device": str(device), "dtype": str(fast.dtype).replace("torch.", ""),
         "modes_ms": {m: round(t, 4) for m, t in times.items()}, "graphs": graphs,
         "rule": f"teacher-forced; gap < {agree.NEAR_TIE_ULPS} bf16 ulps of the top logit",
         "note": (f"gpt-fast-style module, torch.compile(mode={best!r}), the faster of "
                  f"{list(modes)}, coordinate-descent tuning"
                  if cuda else "cpu smoke: torch.compile(backend='aot_eager'), no CUDA graphs")}
    bad = {m: agree.describe(checks[m]) for m in modes if not checks[m]["ok"]}
    if bad:
        r["refused" if best is None else "refused_modes"] = json.dumps(bad)
    return [r]


# ---------------------------------------------------------------------------------------
# Counting launches
# ---------------------------------------------------------------------------------------
# aten ops that only make a view or read metadata: no kernel on a GPU
_NO_KERNEL = {
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::transpose", "aten::t",
    "aten::permute", "aten::expand", "aten::unsqueeze", "aten::squeeze", "aten::select",
    "aten::slice", "aten::chunk", "aten::split", "aten::split_with_sizes", "aten::unbind",
    "aten::as_strided", "aten::alias", "aten::detach", "aten::_unsafe_view", "aten::empty",
    "aten::empty_strided", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg",
    "aten::view_as", "aten::narrow", "aten::numpy_T", "aten::item", "aten::_local_scalar_dense",
    "aten::is_nonzero", "aten::to", "aten::_to_copy", "aten::type_as",
}


@dataclass
class LaunchCount:
    """What one call of a function made. ``count`` is the headline number, in ``unit``:
    ``"cuda kernels"`` on a GPU (kernels that ran, from CUPTI; memcpy/memset are in
    ``memops``; ``host_launch_calls`` counts cudaLaunchKernel/cuLaunchKernel/cudaGraphLaunch
    calls, so a CUDA-graph replay is many kernels but one launch call), or on the CPU
    ``"aten ops (cpu proxy)"``: top-level aten calls that are not views, each at least one
    kernel launch on a GPU (``to``/``_to_copy`` are left out: on a GPU they launch only
    when they convert)."""
    count: int
    unit: str
    memops: int = 0
    host_launch_calls: int | None = None
    by_name: dict = field(default_factory=dict)

    def __int__(self):
        return self.count

    def as_dict(self):
        return asdict(self)


def count_launches(fn, device="cuda", warmup: int = 1, top: int = 15) -> LaunchCount:
    """Kernels (GPU) or aten ops (CPU) that one call of ``fn`` makes, with torch.profiler.
    ``fn`` is called ``warmup`` times first (cuBLAS handles, compilation, autotuning)."""
    from collections import Counter
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        for _ in range(warmup):
            fn()
        _sync(device)
        cuda = _is_cuda(device)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=acts) as prof:
            fn()
            _sync(device)
    events = prof.events()
    if cuda:
        kern, mem = Counter(), 0
        host = 0
        for e in events:
            if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False):
                if e.name.startswith(("Memcpy", "Memset")):
                    mem += 1
                else:
                    kern[e.name] += 1
            elif e.name.startswith(("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch",
                                    "cuGraphLaunch", "cudaLaunchCooperativeKernel")):
                host += 1
        return LaunchCount(sum(kern.values()), "cuda kernels", mem, host,
                           dict(kern.most_common(top)))
    ops = Counter()
    for e in events:
        if not e.name.startswith("aten::") or e.name in _NO_KERNEL:
            continue
        p, nested = e.cpu_parent, False
        while p is not None:
            if p.name.startswith("aten::"):
                nested = True
                break
            p = p.cpu_parent
        if not nested:
            ops[e.name] += 1
    return LaunchCount(sum(ops.values()), "aten ops (cpu proxy)", 0, None,
                       dict(ops.most_common(top)))


# ---------------------------------------------------------------------------------------
# The rungs, as ladder rows
# ---------------------------------------------------------------------------------------
def peer_rungs(spec_name, ctx: int = 512, device="cuda", iters: int = 50,
               new_tokens: int = 64, seed: int = 0, eager_new_tokens: int | None = None,
               rungs=RUNGS, weights=None, hf_attn: str = "sdpa") -> list[dict]:
    """Check, then measure, the peer rungs of one model at context ``ctx``: ladder rows
    ``{model, rung, ctx, ms_per_token, floor_ms, agree, read_tbps, ...}``.

    Random weights are built once (bf16 on a GPU, fp32 on the CPU) and shared by every
    rung (pass ``weights`` to reuse a dict). Each peer is first teacher-forced along the
    eager oracle's greedy tokens over the same prompt and judged by the agreement rule
    (:mod:`onelaunch.agree`): ``agree`` is "k/N" over every step, ``flips`` lists each
    step that differs (both logits, the gap, the verdict), and a peer with a real flip is
    refused (``refused``, no time), as our rungs are. ``agree_free`` is the prefix its
    free-running timed run shares with the oracle. HF eager runs ``eager_new_tokens``
    (default: 32 on a GPU, where it is slow, else ``new_tokens``); the other rungs
    ``new_tokens``. The floor comes from the streaming-read bandwidth measured here (no
    floor on the CPU). ``hf_attn`` is the HF rungs' attention (sdpa, as a user runs it)."""
    spec = get_spec(spec_name)
    cuda = _is_cuda(device)
    dtype = torch.bfloat16 if cuda else torch.float32
    if eager_new_tokens is None:
        eager_new_tokens = min(32, new_tokens) if cuda else new_tokens
    bad = [r for r in rungs if r not in RUNGS]
    if bad:
        raise ValueError(f"unknown rungs {bad}; known: {RUNGS}")
    max_ctx = ctx + max(new_tokens, eager_new_tokens) + 1
    if max_ctx > spec.max_ctx:
        raise ValueError(f"ctx {ctx} + {new_tokens} new tokens exceeds {spec.name}'s "
                         f"max_ctx {spec.max_ctx}")
    if weights is None:
        weights = random_weights(spec, seed=seed, device=device, dtype=dtype)
    bw = read_bandwidth(device) if cuda else None
    floor = spec.floor_ms(bw, ctx) if bw else None
    prompt = make_prompt(spec, ctx, seed, device)
    oracle = Oracle(spec, weights, max_ctx=max_ctx).eval()
    n_ref = max(new_tokens, eager_new_tokens)
    ref_ids, _, ref_logits = oracle_greedy(oracle, prompt, n_ref, return_logits=True)

    def row(rung, n, check: dict | None, note=""):
        r = {"model": spec.name, "rung": rung, "ctx": ctx, "ms_per_token": None,
             "floor_ms": None if floor is None else round(floor, 4),
             "agree": None if check is None else check["agree"],
             "read_tbps": None if bw is None else round(bw, 3), "x_floor": None,
             "new_tokens": n, "device": str(device), "dtype": str(dtype).replace("torch.", "")}
        if check is not None:
            r["flips"] = agree.disagreements(check)
            r["rule"] = f"teacher-forced; gap < {agree.NEAR_TIE_ULPS} bf16 ulps of the top logit"
            if not check["ok"]:
                r["refused"] = ("teacher-forced choices differ from the oracle beyond a near "
                                "tie: " + agree.describe(check))
        if note:
            r["note"] = note
        return r

    def timed(r, ms):
        if not r.get("refused"):                   # a refused peer's time is never shown
            r["ms_per_token"] = round(ms, 4)
            r["x_floor"] = None if floor is None else round(ms / floor, 3)
        return r

    rows = []
    hf = None
    for rung in rungs:
        if rung in ("HF eager", "HF static"):
            mode = "eager" if rung == "HF eager" else "static"
            n = eager_new_tokens if mode == "eager" else new_tokens
            hf = set_hf_attn(hf_model(spec, weights), hf_attn) if hf is None else hf
            cache_len = prompt.numel() + n + 1 if mode == "static" else None   # as the timing's
            tf = hf_teacher_forced(hf, prompt, ref_ids[:n], mode, cache_len)
            note = ""
            if mode == "static" and not hf_static_compiles(device):
                note = "cpu smoke: static cache, not compiled (transformers compiles on GPUs only)"
            r = row(rung, n, check_tokens(ref_logits, tf), note)
            if not r.get("refused"):
                info = {}
                ms, ids = hf_generate_ms(spec, weights, ctx, n, mode, device, model=hf,
                                         prompt=prompt, seed=seed, info=info, attn=hf_attn)
                timed(r, ms)
                r.update(agree_free=str(agreement(ids, ref_ids)),
                         t_one_ms=round(info["t_one_ms"], 3), t_long_ms=round(info["t_long_ms"], 3),
                         graphs_while_timing=info["graphs_while_timing"])
            r["attn"] = hf_attn
            rows.append(r)
        elif rung == "oracle eager":
            ms = oracle_step_ms(oracle, ctx, iters, device)
            rows.append(timed(row(rung, n_ref, None, "the reference for agree"), ms))
        else:
            g0 = dynamo_graphs()
            step = compiled_oracle_step(oracle)
            tf, _ = oracle_greedy(oracle, prompt, new_tokens, step=step, compiled=True,
                                  forced=ref_ids)
            mode = step.mode or "default"
            note = step.note or f"torch.compile(mode={mode!r}, backend={step.backend!r})"
            r = row(rung, new_tokens, check_tokens(ref_logits, tf), note)
            if not r.get("refused"):
                ids, _ = compiled_oracle_greedy(oracle, prompt, new_tokens, step)
                timed(r, compiled_oracle_step_ms(oracle, ctx, iters, device, step=step))
                r["agree_free"] = str(agreement(ids, ref_ids))
            r["graphs"] = dynamo_graphs() - g0  # new graphs: 1 (0 if reused), never more
            rows.append(r)
    return rows
