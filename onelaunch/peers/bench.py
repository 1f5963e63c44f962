"""``bench``'s run: the peers (:mod:`onelaunch.peers.rungs`, :mod:`onelaunch.peers.gpt_fast`)
beside the rungs of our ladder (:func:`onelaunch.measure.ladder.ladder_rows`), on one
prompt (:func:`onelaunch.prompt.random_prompt` of the run's seed), judged against one
oracle run, with one bandwidth in every row's floor and ratio.
"""
from __future__ import annotations

import torch

from ..measure import agree, ladder
from .gpt_fast import NAME as FAST, fast_decode_rows
from .rungs import RUNGS as PEERS, peer_rungs


def bench_rows(spec, w, device="cuda", ctx=512, tokens=12, iters=100, seed=0,
               read_tbps=None, peers: bool | tuple = True, peer_tokens: int | None = None,
               peer_iters: int | None = None, rungs=ladder.LADDER) -> list[dict]:
    """``bench``'s run: the peers, then every rung of the ladder, on ONE prompt (seed
    ``seed``), judged against ONE oracle run over the weights ``w`` that all of them use,
    with ONE bandwidth (``read_tbps``, measured once by the caller; None on the CPU) in
    every row's ``floor_ms``, ``x_floor`` and ``read_tbps``. Every row names the prompt
    (``prompt``: :func:`onelaunch.prompt.prompt_digest`).

    ``peers``: True (every peer, and for a dense model the strongest compiled one,
    ``gpt-fast compiled``: :func:`gpt_fast.fast_decode_rows`), False, or
    the peers' names (``gpt-fast compiled`` among them); ``peer_tokens``: the
    peers' checked and timed tokens (32 on a GPU, 4 on the CPU);
    ``peer_iters``: their timed steps (``min(iters, 50)``); ``rungs``: ours."""
    cuda = torch.device(device).type == "cuda"
    peer_tokens = peer_tokens or (32 if cuda else 4)
    prompt, _, max_ctx = ladder.ladder_prompt(spec, ctx, tokens, iters, seed)
    n_ref = max(tokens, peer_tokens if peers else tokens)
    max_ctx = max(max_ctx, ctx + n_ref + 1)
    ids, logits = agree.oracle_tokens(spec, w, prompt, n_ref, max_ctx)
    rows = []
    if peers:
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
    rows += ladder.ladder_rows(spec, w, device, ctx=ctx, tokens=tokens, iters=iters,
                               read_tbps=read_tbps, max_ctx=max_ctx, seed=seed, rungs=rungs,
                               ref=(ids[:tokens], logits[:tokens]))
    return rows
