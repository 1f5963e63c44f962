"""The ladder: each rung of our engine checked against the oracle's greedy tokens, then
timed against the floor; and ``bench``'s run, which puts the peers beside it.

One run has one prompt (:func:`onelaunch.prompt.random_prompt` of the run's seed), one
oracle run that every rung and every peer is judged against, and one bandwidth that every
row's floor and ratio use (:func:`bench_rows`).
"""
from __future__ import annotations

import torch

from ..prompt import prompt_digest, random_prompt
from . import agree
from .rungs import LADDER, RUNGS
from .timing import floor_ms, run_ctx, time_engine_timing


def ladder_prompt(spec, ctx: int, tokens: int, iters: int, seed: int = 0, max_ctx=None):
    """The ladder's prompt (``ctx`` seeded random ids) and engine size: ``(prompt, tokens,
    max_ctx)``, the arguments of :func:`agree.oracle_tokens` after the spec and weights."""
    return random_prompt(spec, ctx, seed), tokens, max_ctx or run_ctx(ctx, tokens, iters)


def ladder_rows(spec, w, device="cuda", ctx=512, tokens=12, iters=100, read_tbps=None,
                max_ctx=None, seed=0, rungs=LADDER, ref=None) -> list[dict]:
    """One row per rung: checked (:func:`agree.judge`), then timed only if the check
    passed: ``ms_per_token`` the median of the timed steps, ``ms_min``/``ms_max`` their
    spread, ``timed`` how many. A refused row has ``ms_per_token`` None and ``refused`` (the flips, as JSON).
    ``ref``: the oracle's ``(ids, logits)`` for this prompt (computed here when None)."""
    dev = torch.device(device)
    prompt, _, max_ctx = ladder_prompt(spec, ctx, tokens, iters, seed, max_ctx)
    ref = ref if ref is not None else agree.oracle_tokens(spec, w, prompt, tokens, max_ctx)
    floor = floor_ms(spec, read_tbps, ctx)
    digest = prompt_digest(prompt)
    rows, eager_tokens, prev_tokens = [], None, None
    for name in rungs:
        rung = RUNGS[name]
        if not rung.runs_on(dev) or not rung.supported(spec):
            continue                     # later rungs keep their other steps, without PDL
        e = rung.engine(spec, w, max_ctx)
        j = agree.judge(e, prompt, ref, rung.graph)
        r = {"model": spec.name, "rung": name, "ctx": ctx, "agree": j["agree"],
             "agree_free": j["agree_free"], "flips": j["flips"], "floor_ms": floor,
             "read_tbps": read_tbps, "launches": e.launches_per_step(),
             "order": 10 + (LADDER.index(name) if name in LADDER else len(LADDER)),
             "kind": rung.kind, "prompt": digest,
             "rule": f"gap < {agree.NEAR_TIE_ULPS} bf16 ulps of the top logit"}
        if rung.graph and e.graph == "emulated":
            r["note"] = "CPU smoke run: the graph is emulated by eager launches"
        if name == "fused eager":
            eager_tokens = j["tokens"]
        elif eager_tokens is not None:
            r["same_tokens_as_fused_eager"] = j["tokens"] == eager_tokens
        if prev_tokens is not None:
            r["same_tokens_as_previous_rung"] = j["tokens"] == prev_tokens
        prev_tokens = j["tokens"]
        if j["ok"]:
            p0 = int(e.pos)
            # eager steps are slow: a quarter of the replays, at least 10 (or all of a few)
            n = iters if rung.graph else max(min(iters, 10), iters // 4)
            t = time_engine_timing(e, rung.graph, n, dev)
            e.check_stalls()             # a step that ran out of a wait bound: no time
            ms = t.median_ms
            r["ms_per_token"] = ms
            r.update(t.spread())          # min and max over the n timed steps
            r["x_floor"] = ms / floor if floor else None
            if spec.is_moe:      # the timed steps read many experts, not one set from L2
                r["distinct_experts"] = e.distinct_experts(p0, int(e.pos))
                r["timed_steps"] = int(e.pos) - p0
        else:
            r["ms_per_token"] = None
            r["refused"] = agree.refusal(j["flips"])
        rows.append(r)
        del e
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def bench_rows(spec, w, device="cuda", ctx=512, tokens=12, iters=100, seed=0,
               read_tbps=None, peers: bool | tuple = True, peer_tokens: int | None = None,
               peer_iters: int | None = None, rungs=LADDER) -> list[dict]:
    """``bench``'s run: the peers, then every rung of the ladder, on ONE prompt (seed
    ``seed``), judged against ONE oracle run over the weights ``w`` that all of them use,
    with ONE bandwidth (``read_tbps``, measured once by the caller; None on the CPU) in
    every row's ``floor_ms``, ``x_floor`` and ``read_tbps``. Every row names the prompt
    (``prompt``: :func:`onelaunch.prompt.prompt_digest`).

    ``peers``: True (every peer, and for a dense model the strongest compiled one,
    ``gpt-fast compiled``: :func:`onelaunch.peers.gpt_fast.fast_decode_rows`), False, or
    the peers' names (``gpt-fast compiled`` among them); ``peer_tokens``: the
    peers' checked and timed tokens (32 on a GPU, 4 on the CPU);
    ``peer_iters``: their timed steps (``min(iters, 50)``); ``rungs``: ours."""
    cuda = torch.device(device).type == "cuda"
    peer_tokens = peer_tokens or (32 if cuda else 4)
    prompt, _, max_ctx = ladder_prompt(spec, ctx, tokens, iters, seed)
    n_ref = max(tokens, peer_tokens if peers else tokens)
    max_ctx = max(max_ctx, ctx + n_ref + 1)
    ids, logits = agree.oracle_tokens(spec, w, prompt, n_ref, max_ctx)
    rows = []
    if peers:
        from ..peers.gpt_fast import NAME as FAST, fast_decode_rows
        from ..peers.rungs import RUNGS as PEERS, peer_rungs
        names = PEERS + (FAST,) if peers is True else tuple(peers)
        rest = tuple(n for n in names if n != FAST)
        if rest:
            rows += peer_rungs(spec, ctx=ctx, device=device,
                               iters=peer_iters or min(iters, 50), new_tokens=peer_tokens,
                               seed=seed, weights=w, prompt=prompt, ref=(ids, logits),
                               read_tbps=read_tbps, rungs=rest)
        if FAST in names and (spec.is_moe or spec.qk_norm):
            print(f"[bench] {FAST}: no row for {spec.name} (gpt-fast's step is the dense "
                  "family's)", flush=True)
        elif FAST in names:
            rows += fast_decode_rows(spec, ctx=ctx, device=device,
                                     iters=peer_iters or min(iters, 50),
                                     new_tokens=peer_tokens, seed=seed, weights=w,
                                     read_tbps=read_tbps, ref=(ids, logits))
    rows += ladder_rows(spec, w, device, ctx=ctx, tokens=tokens, iters=iters,
                        read_tbps=read_tbps, max_ctx=max_ctx, seed=seed, rungs=rungs,
                        ref=(ids[:tokens], logits[:tokens]))
    return rows
