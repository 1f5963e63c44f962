"""Batched prefill: the prompt's KV cache filled in chunks through the oracle's math must
leave the engine where one decode step per prompt token leaves it: the same next tokens,
caches equal to bf16 rounding, the same state (seq, pos, prompt_len).

Tolerance: both sides hold bf16 caches computed in a different order (the engine's kernels
accumulate in fp32 and round once; the oracle rounds after each bf16 op), so a cached key
differs by a few bf16 ulps of the largest value: REL = 2e-2 of the cache's max magnitude
(8 bits of mantissa give 4e-3 per rounding; a wrong position or a skipped RoPE is O(1))."""
from types import SimpleNamespace

import pytest
import torch

from onelaunch.oracle import Oracle
from onelaunch.prefill import PrefillError, prefill
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights

REL = 2e-2


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


def prompt_of(spec, n, seed=3):
    return torch.randint(0, spec.vocab, (n,), generator=torch.Generator().manual_seed(seed))


def stand_in(spec, max_ctx, w=None):
    """An object with exactly the attributes prefill may use of an engine (its contract),
    so the MoE path is tested whatever the engine covers."""
    shape = (spec.layers, spec.kv_heads, max_ctx, spec.head_dim)
    bf = torch.bfloat16
    return SimpleNamespace(
        spec=spec, max_ctx=max_ctx, device=torch.device("cpu"), hf_weights=w,
        k_cache=torch.zeros(shape, dtype=bf), v_cache=torch.zeros(shape, dtype=bf),
        seq=torch.zeros(max_ctx + 1, dtype=torch.int32), pos=torch.zeros(1, dtype=torch.int32),
        prompt_len=torch.zeros(1, dtype=torch.int32))


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmoe"])
def test_oracle_live_prefix_matches_the_masked_cache(name):
    """The oracle's prefill options (attention over the live prefix only, every expert at
    once) against its default step, in fp32: the same numbers to rounding."""
    spec = get_spec(name)
    w = random_weights(spec, 0, dtype=torch.float32)
    ids = prompt_of(spec, 13)
    a, b = Oracle(spec, w, max_ctx=32), Oracle(spec, w, max_ctx=32)
    xa = a.hidden(ids, torch.arange(13))
    xb = torch.cat([b.hidden(ids[lo:lo + 5], torch.arange(lo, min(13, lo + 5)),
                             live=min(13, lo + 5), all_experts=spec.is_moe)
                    for lo in range(0, 13, 5)])
    assert rel(xb, xa) < 1e-5
    assert rel(b.k_cache, a.k_cache) < 1e-5 and rel(b.v_cache, a.v_cache) < 1e-5


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmoe"])
@pytest.mark.parametrize("n, chunk", [(40, 16), (9, 1024)])
def test_prefill_matches_the_oracle(name, n, chunk):
    """bf16, no Triton: prefill into a stand-in engine against the oracle's own forward over
    the prompt (masked static cache, experts gathered per token); then the oracle,
    continuing from the prefilled cache, picks the tokens it picks from its own."""
    spec = get_spec(name)
    w = random_weights(spec, 0)
    ids = prompt_of(spec, n)
    e = stand_in(spec, 64, w)
    prefill(e, ids, chunk=chunk)
    ref = Oracle(spec, w, max_ctx=64)
    ref(ids[:n - 1], torch.arange(n - 1))
    assert rel(e.k_cache[:, :, :n - 1], ref.k_cache[:, :, :n - 1]) < REL
    assert rel(e.v_cache[:, :, :n - 1], ref.v_cache[:, :, :n - 1]) < REL
    assert not e.k_cache[:, :, n - 1:].any() and not e.v_cache[:, :, n - 1:].any()
    assert e.seq[:n].tolist() == ids.tolist() and not e.seq[n:].any()
    assert e.pos.item() == n - 1 and e.prompt_len.item() == n
    # greedy from the prefilled cache = greedy from the oracle's own prefill
    expect = Oracle(spec, w, max_ctx=64).generate(ids, 3)
    o = Oracle(spec, w, cache=(e.k_cache, e.v_cache))
    tok, got = ids[-1:], []
    for p in range(n - 1, n + 2):
        tok = o(tok, torch.tensor([p]))[-1].argmax().view(1)
        got.append(int(tok))
    assert got == expect.tolist()


def test_one_token_prompt_fills_nothing():
    spec = get_spec("tiny-qwen2")
    e = stand_in(spec, 16, random_weights(spec, 0))
    prefill(e, [5])
    assert not e.k_cache.any() and e.seq[:2].tolist() == [5, 0] and e.pos.item() == 0
    assert e.prompt_len.item() == 1


def test_bad_input():
    spec = get_spec("tiny-qwen2")
    with pytest.raises(PrefillError, match="hf_weights, or pass weights="):
        prefill(stand_in(spec, 16), [1, 2, 3])
    e = stand_in(spec, 16, random_weights(spec, 0))
    with pytest.raises(PrefillError, match="1 to 16"):
        prefill(e, list(range(17)))
    with pytest.raises(PrefillError, match="chunk"):
        prefill(e, [1, 2], chunk=0)


# ---- the engine (Triton's interpreter on the CPU) -------------------------------------
def engine_or_skip(spec, w, max_ctx):
    from onelaunch.engine import Engine, EngineError
    try:
        return Engine(spec, w, max_ctx=max_ctx)
    except EngineError as ex:
        pytest.skip(f"the engine does not run {spec.name} yet: {ex}")


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmoe"])
def test_engine_after_prefill_decodes_what_steps_decode(name):
    """One engine prefilled step by step, one in chunks of 2 (positions 0-1, then 2 alone,
    for a 4-token prompt): the same two new tokens, caches within bf16 rounding."""
    spec = get_spec(name)
    w = random_weights(spec, 0)
    ids = prompt_of(spec, 4)
    steps = engine_or_skip(spec, w, 16)
    ref = steps.generate(ids, 2, graph=False)                  # 3 prefill steps + 2
    e = engine_or_skip(spec, w, 16)
    prefill(e, ids, chunk=2, weights=w)
    for _ in range(2):
        e.step(graph=False)
    assert e.seq[4:6].tolist() == ref.tolist()
    assert rel(e.k_cache[:, :, :5], steps.k_cache[:, :, :5]) < REL
    assert rel(e.v_cache[:, :, :5], steps.v_cache[:, :, :5]) < REL
