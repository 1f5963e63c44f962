"""The ladder: each rung of our engine checked against the oracle's greedy tokens, then
timed against the floor. ``bench``'s run, which puts the peers beside it on one prompt,
one oracle run and one bandwidth, is :func:`onelaunch.peers.bench.bench_rows`.
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
