"""The oracle as a peer: its decode step eager, and under ``torch.compile`` (the gpt-fast
recipe: weights and KV cache as module buffers, the position a device tensor, so one CUDA
graph serves every step); greedy decoding through either, optionally teacher-forced.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..measure.timing import time_ms
from ..oracle import Oracle


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
                   warmup: int = 5, info: dict | None = None) -> float:
    """Median ms of one eager oracle decode step (T=1) at position ``ctx``; ``info``
    (a dict) gets the spread of the timed steps (``Timing.spread``)."""
    if ctx >= oracle.max_ctx:
        raise ValueError(f"position {ctx} is outside the oracle's cache ({oracle.max_ctx})")
    tok = torch.tensor([1], device=device)
    pos = torch.tensor([ctx], device=device)
    with torch.no_grad():
        t = time_ms(lambda: oracle(tok, pos), iters=iters, warmup=warmup, device=device)
    if info is not None:
        info.update(t.spread())
    return t.median_ms


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
                            step: CompiledStep | None = None, warmup: int = 5,
                            info: dict | None = None) -> float:
    """Median ms of one compiled decode step at position ``ctx`` (one CUDA-graph replay
    under reduce-overhead); ``info`` (a dict) gets the spread of the timed steps. Compiles first when ``step`` is None; the warm-up calls cover
    compilation and graph recording, which :func:`oracle_greedy` has usually done already."""
    if ctx >= oracle.max_ctx:
        raise ValueError(f"position {ctx} is outside the oracle's cache ({oracle.max_ctx})")
    step = compiled_oracle_step(oracle) if step is None else step
    tok = torch.tensor([1], device=device)
    pos = torch.tensor([ctx], device=device)

    def one():
        torch.compiler.cudagraph_mark_step_begin()
        step(tok, pos)

    t = time_ms(one, iters=iters, warmup=max(3, warmup), device=device)
    if info is not None:
        info.update(t.spread())
    return t.median_ms


def compiled_oracle_greedy(oracle: Oracle, prompt: torch.Tensor, new_tokens: int,
                           step: CompiledStep | None = None):
    """Greedy ids through the compiled step (eager prefill): ``(ids, margins)``."""
    step = compiled_oracle_step(oracle) if step is None else step
    return oracle_greedy(oracle, prompt, new_tokens, step=step, compiled=True)
