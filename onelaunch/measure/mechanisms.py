"""Which mechanisms a run exercised: each GEMV's tiles and splits, split-K attention's
live splits, the MoE router's ties; and the covering run on the CPU, which drives every
mechanism the GPU run used at tiny shapes and judges it against the oracle
(``generate --check``'s mechanism table, :func:`check_mechanisms`); and the oracle's
judgement of generated tokens (:func:`judge_generated`).
"""
from __future__ import annotations

import torch

from ..oracle import Oracle
from ..prompt import random_prompt
from . import agree
from .hf_check import RouterLog, router_ties


# launcher -> (its weight argument, rows and reduction length of one program's matrix
# from the weight's shape, its launch-configuration key)
GEMVS = {
    "rms_qkv": ("w_qkv", lambda s: (s[0], s[1]), "rms_qkv"),
    "o_proj_residual": ("w_o", lambda s: (s[0], s[1]), "o_proj_residual"),
    "rms_gate_up_swiglu": ("w_gate_up", lambda s: (s[0] // 2, s[1]), "rms_gate_up_swiglu"),
    "down_residual": ("w_down", lambda s: (s[0], s[1]), "down_residual"),
    "lm_head_argmax": ("w", lambda s: (s[0], s[1]), "lm_head_argmax"),
    "moe_router": ("w_router", lambda s: (s[0], s[1]), "moe_router"),
    "moe_gate_up_swiglu": ("w_gate_up", lambda s: (s[1] // 2, s[2]), "moe_gate_up_swiglu"),
    "moe_down_residual": ("w_down", lambda s: (s[1], s[2]), "moe_down_residual"),
}

# the covering run: a seeded prompt of COVER_PROMPT ids prefilled, then COVER_STEPS steps
# (positions 129 and 130) of an engine of COVER_CTX positions (3 splits of 64 a kv head)
# whose live length is shared over at most COVER_LIVE_CAP splits: 3 chunks make a split
# of 2 tiles and a last split of 1, and the third split exits (past the live length), as
# the GPU's cap makes them past 4096 positions; its GEMV tiles are halved until each
# GEMV has 2 row blocks and 2 K tiles (the down projection 2 K splits of 2 tiles)
COVER_PROMPT, COVER_STEPS, COVER_CTX, COVER_LIVE_CAP = 130, 2, 192, 2
# the covering run's logits against the oracle's: the largest difference over the
# vocabulary, in bf16 ulps of the oracle's top logit, may not exceed the agreement rule's
# own near-tie distance (agree.NEAR_TIE_ULPS): two correct bf16 computations differ there
# by a few roundings of the last activations. Measured on the CPU, seeds 0-5: tiny-qwen2
# 1.1-3.5, tiny-olmoe 1.5-2.3 without a bug; with the router's padded lanes in its
# softmax 10.6-18.8 (tiny-olmoe), with the split-K merge not rescaling its partial maxima
# 77-90, with gate/up's last K tile dropped 125-127 (ci/mutants.py): bugs whose greedy
# tokens still agreed, since a token moves only past a margin of one or two logits
COVER_LOGIT_ULPS = agree.NEAR_TIE_ULPS


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def gemv_tiles(e, calls=None) -> dict:
    """Each GEMV launcher of ``e``'s step (``Engine.trace``), once: its configuration
    key and config, rows N, reduction length K, row blocks, K tiles of one split, K
    splits, and whether the last row block and K tile are partial."""
    from ..kernels.down_residual import down_split
    out = {}
    for c in calls if calls is not None else e.trace():
        g = GEMVS.get(c["kernel"])
        if g is None or c["kernel"] in out:
            continue
        arg, shape_of, key = g
        w = c["args"][arg]
        N, Kd = shape_of(tuple(w.shape))
        cfg = dict(c["args"].get("cfg") or e.cfg(key, w))
        span, splits = down_split(Kd, cfg) if key == "down_residual" else (Kd, 1)
        out[c["kernel"]] = dict(
            key=key, cfg=cfg, N=N, K=Kd, row_blocks=_cdiv(N, cfg["BLOCK_N"]),
            rows_partial=N % cfg["BLOCK_N"] != 0, k_tiles=_cdiv(min(span, Kd), cfg["BLOCK_K"]),
            k_partial=Kd % cfg["BLOCK_K"] != 0, splits=splits)
    return out


def _ties_row(t: dict):
    return ("router ties", t["tied"] > 0,
            f"{t['tied']} of {t['calls']} calls, {t['boundary']} at the top-k boundary")


def mechanisms(e, first: int, last: int, ties: dict | None = None) -> list[tuple]:
    """What a run of engine ``e`` whose steps consumed positions ``first..last``
    exercised: rows of (mechanism, exercised, how), from the step's kernel calls, their
    launch configurations and the live lengths; ``ties`` (``router_ties``) adds the
    router's row."""
    from .. import kernels as K
    rows = []
    for g in gemv_tiles(e).values():
        c, key = g["cfg"], g["key"]
        rows += [(f"{key}: several row blocks", g["row_blocks"] >= 2,
                  f"{g['row_blocks']} of {c['BLOCK_N']} rows"),
                 (f"{key}: several K tiles", g["k_tiles"] >= 2,
                  f"{g['k_tiles']} of {c['BLOCK_K']}"
                  + (" a split" if key == "down_residual" else ""))]
        if key == "down_residual":
            rows.append(("down: a split over K", g["splits"] >= 2, f"{g['splits']} splits"))
    p = e.paths
    if p["attention"] == "splitk":
        n_splits = e.partials()[0].shape[1]
        share = K.attention_splitk.live_share(n_splits, e.live_cap)
        bt = min(e.cfg("attention_splitk")["BLOCK_T"], e.chunk)
        live = tiles = 0
        uneven = past = False
        for pos in range(first, last + 1):
            length = pos + 1
            units = _cdiv(length, e.chunk)
            per = _cdiv(units, share)
            n_live = _cdiv(units, per)
            live, tiles = max(live, n_live), max(tiles, _cdiv(min(per * e.chunk, length), bt))
            uneven |= n_live > 1 and units % per != 0
            past |= n_splits > n_live
        rows += [("several live splits", live >= 2, f"{live} of {n_splits}"),
                 ("a split of several tiles", tiles >= 2, f"{tiles}x{bt}"),
                 ("a shorter last live split", uneven, f"shared over {share}"),
                 ("splits past the live length", past, f"{n_splits} a kv head")]
    elif p["attention"] == "plain":
        bt = e.cfg("attention")["BLOCK_T"]
        rows.append(("several key tiles", _cdiv(last + 1, bt) >= 2,
                     f"{_cdiv(last + 1, bt)}x{bt}"))
    if ties is not None:
        rows.append(_ties_row(ties))
    return rows


def covering_cfgs(e) -> dict:
    """``e``'s launch configurations with each GEMV's tiles halved until it has at least
    2 row blocks and 2 K tiles (the down projection 2 K splits of 2 tiles each): the
    many tiles of a full-size model, at a tiny model's shapes."""
    from ..kernels.down_residual import down_split
    out = dict(e.cfgs)
    for g in gemv_tiles(e).values():
        c, down = dict(g["cfg"]), g["key"] == "down_residual"
        if down:
            c["SPLIT_K"] = max(2, c.get("SPLIT_K", 1))
        while c["BLOCK_N"] > 1 and _cdiv(g["N"], c["BLOCK_N"]) < 2:
            c["BLOCK_N"] //= 2
        while c["BLOCK_K"] > 16:
            span, splits = down_split(g["K"], c) if down else (g["K"], 1)
            if _cdiv(min(span, g["K"]), c["BLOCK_K"]) >= 2 and (splits >= 2 or not down):
                break
            c["BLOCK_K"] //= 2
        out[g["key"]] = c
    return out


def _cover_prompt(spec, seed: int) -> torch.Tensor:
    """The covering run's prompt: COVER_PROMPT seeded random ids (a stream apart from the
    run's own prompt)."""
    return random_prompt(spec, COVER_PROMPT, seed ^ 0x5EED0000)


@torch.no_grad()
def tied_router(spec, weights: dict, prompt: torch.Tensor) -> dict:
    """``weights`` with, in every layer, the router row of the expert the bf16 oracle
    ranks last at the prompt's last position replaced by the row of the one it ranks
    ``top_k``-th (a new dict: only the router matrices are new tensors). Two equal rows
    give equal logits at every token, bit for bit in the engine and the oracle, so at
    that step the two tie at the top-k boundary and the tie order (the lower expert
    first) picks which one runs. Natural ties of bf16 logits are common at full size
    but rare in the few router calls of a tiny covering run."""
    w, n = dict(weights), prompt.numel()
    dev = weights["model.embed_tokens.weight"].device
    for li in range(spec.layers):
        o = RouterLog(spec, w, max_ctx=COVER_CTX)
        o.hidden(prompt.to(dev), torch.arange(n, device=dev), live=n)
        order = o.router[li][-1].sort(descending=True, stable=True).indices
        name = f"model.layers.{li}.mlp.gate.weight"
        w[name] = w[name].clone()
        w[name][order[-1]] = w[name][order[spec.top_k - 1]]
    return w


def routing_step(spec, got_ids, router, top_k: int) -> tuple[bool, bool, str]:
    """One step of an MoE engine's routing against the oracle's: ``got_ids`` [layers,
    top_k] the experts the engine ran (its expert log), ``router`` the oracle's router
    logits [E] of each layer at the same step, after the same tokens. Returns (same,
    near, why): same when every layer ran the oracle's experts; else ``why`` names the
    first layer that did not, and ``near`` says whether that is a near tie of the
    oracle's router logits (the agreement rule's threshold at its top-k-th logit, as
    two correct bf16 computations may round apart) rather than a flip. Past that layer
    the two runs' inputs differ, so the step's logits are not comparable."""
    for li in range(spec.layers):
        lg = router[li].float()
        ref = lg.sort(descending=True, stable=True).indices[:top_k].tolist()
        got = [int(x) for x in got_ids[li]]
        if set(ref) == set(got):
            continue
        kth = lg[ref[-1]].item()
        gap = max(kth - lg[x].item() for x in set(got) - set(ref))
        near = gap < agree.threshold(kth)
        return False, near, (f"layer {li} ran experts {sorted(got)}, the oracle "
                             f"{sorted(ref)} (router gap {gap:.4g}: "
                             f"{'a near tie' if near else 'a FLIP'})")
    return True, True, ""


@torch.no_grad()
def cover(e, seed: int = 0) -> dict:
    """The covering run on the CPU: an engine of ``e``'s paths (attention, RoPE,
    persistent layers, PDL) over ``e``'s weights (MoE: with ``tied_router``'s copied
    rows), with the tiles of ``covering_cfgs`` and the live cap COVER_LIVE_CAP, steps at
    positions 129 and 130 after a batched prefill of a seeded prompt. Its tokens are
    judged against the oracle over the same weights (the agreement rule), and so are its
    logits at each step: within COVER_LOGIT_ULPS of the oracle's (MoE: at a step where it
    ran the oracle's experts; a different choice must be a near tie of the router's
    logits, ``routing_step``). The router ties it saw (its router buffer, read after
    each router launch) are counted. Returns ``ok``, ``agree``, the judge's result,
    ``logits`` (one row a step) and the mechanism rows."""
    from ..engine import Engine
    from ..prefill import prefill
    spec, p = e.spec, e.paths
    prompt = _cover_prompt(spec, seed)
    w = tied_router(spec, e.hf_weights, prompt) if spec.is_moe else e.hf_weights
    c = Engine(spec, w, max_ctx=COVER_CTX, attention=p["attention"], pdl=e.pdl,
               persistent=p["persistent"], cfgs=covering_cfgs(e),
               live_cap=COVER_LIVE_CAP)
    prefill(c, prompt, progress=False)
    router, step_logits = [], []
    for _ in range(COVER_STEPS):                 # Engine.step, launch by launch
        for launch in c.plan:
            launch.run()
            if launch.op == "moe_router":
                router.append(c.router_logits.float().cpu().clone())
        step_logits.append(c.logits.float().cpu().clone())
    ids = c.seq[COVER_PROMPT: COVER_PROMPT + COVER_STEPS].cpu().long()
    j = judge_generated(spec, w, prompt, ids, COVER_CTX)
    # the oracle fed the engine's tokens: its logits and router logits at the same steps
    o = RouterLog(spec, w, max_ctx=COVER_CTX)
    seq = torch.cat([prompt, ids[:-1]]).to(c.device)
    ref = o(seq, torch.arange(seq.numel(), device=c.device))[-COVER_STEPS:].float().cpu()
    ok, rows_l = j["ok"], []
    for i in range(COVER_STEPS):
        pos = COVER_PROMPT - 1 + i
        same, near, why = (routing_step(spec, c.expert_log[pos].cpu(),
                                        [r[pos] for r in o.router], spec.top_k)
                           if spec.is_moe else (True, True, ""))
        ulps = None
        if same:
            ulps = (step_logits[i] - ref[i]).abs().max().item() / agree.bf16_ulp(
                ref[i].max().item())
        ok = ok and near and (ulps is None or ulps <= COVER_LOGIT_ULPS)
        rows_l.append({"pos": pos, "ulps": ulps, "routing": why})
    ties = router_ties(router, spec.top_k) if spec.is_moe else None
    rows = mechanisms(c, COVER_PROMPT - 1, COVER_PROMPT + COVER_STEPS - 2, ties)
    return {"ok": ok, "agree": j["agree"], "judge": j, "logits": rows_l, "rows": rows}


def describe_cover(cov: dict) -> str:
    """The covering run's verdict in words: its tokens (the agreement rule), then each
    step's largest logit difference from the oracle's, or why it was not compared."""
    parts = [agree.describe(cov["judge"])]
    for r in cov["logits"]:
        if r["ulps"] is not None:
            parts.append(f"position {r['pos']}: logits at most {r['ulps']:.1f} bf16 ulps "
                         f"of the oracle's top away (bound {COVER_LOGIT_ULPS})"
                         + ("" if r["ulps"] <= COVER_LOGIT_ULPS else ": OVER"))
        else:
            parts.append(f"position {r['pos']}: {r['routing']}, logits not compared")
    return "; ".join(parts)


def mechanism_table(runs: list[tuple[str, list[tuple]]]) -> list[str]:
    """Lines of a table: one row per mechanism, one column per run (title, rows): "yes"
    or "no" and how far it went, "-" where the run does not say."""
    names = list(dict.fromkeys(m for _, rows in runs for m, _, _ in rows))
    cols = [{m: f"{'yes' if ok else 'no '} ({how})" for m, ok, how in rows}
            for _, rows in runs]
    w0 = max(len(n) for n in names + ["mechanism"])
    ws = [max(len(t), *(len(c.get(n, "-")) for n in names)) for (t, _), c in zip(runs, cols)]
    line = lambda first, cells: "  " + first.ljust(w0) + "".join(
        "  " + x.ljust(w) for x, w in zip(cells, ws)).rstrip()
    return [line("mechanism", [t for t, _ in runs])] + [
        line(n, [c.get(n, "-") for c in cols]) for n in names]


def check_mechanisms(e, seed: int = 0) -> tuple[bool, str]:
    """``generate --check``'s second half, after engine ``e``'s run was judged: the
    mechanisms that run exercised and those it did not; on the CPU, when it missed
    any, the covering run (``cover``) as a second column, its tokens judged by the
    agreement rule. Returns (ok, text): ok is False when the covering run's tokens
    fail the rule; the text ends naming what neither run exercised."""
    run = e.last_run or {"first_pos": 0, "last_pos": -1}
    rows = mechanisms(e, run["first_pos"], run["last_pos"])
    runs = [(f"this run ({run['first_pos']}-{run['last_pos']})", rows)]
    missed = [m for m, ok, _ in rows if not ok] + (["router ties"] if e.spec.is_moe else [])
    ok, lines = True, []
    if missed and e.device.type == "cpu" and e.tp is None and e.spec.max_ctx >= COVER_CTX:
        cov = cover(e, seed)
        ok = cov["ok"]
        lines.append(f"covering run (a seeded {COVER_PROMPT}-id prompt prefilled, live "
                     f"splits capped at {COVER_LIVE_CAP}, GEMV tiles shrunk"
                     + (", a router row a layer copied so two experts tie"
                        if e.spec.is_moe else "")
                     + "): oracle: " + describe_cover(cov) + ("" if ok else "; REFUSED"))
        runs.append((f"covering run ({COVER_PROMPT - 1}-{COVER_PROMPT + COVER_STEPS - 2})",
                     cov["rows"]))
    elif missed:
        lines.append("(no covering run: that is the CPU's, in Triton's interpreter, for a "
                     f"model of {COVER_CTX} positions or more; on a GPU a longer "
                     "--prompt-len reaches more splits)")
    done = {m for _, rows in runs for m, ok_, _ in rows if ok_}
    never = [m for m in dict.fromkeys(missed + [m for _, r in runs for m, _, _ in r])
             if m not in done]
    table = mechanism_table(runs)
    never = [m + (" (not observed by this run)"
                  if m == "router ties" and len(runs) == 1 else "") for m in never]
    tail = "not exercised: " + ("; ".join(never) if never else "none")
    return ok, "\n".join(lines + ["what the check exercised (steps at positions):"]
                         + table + [tail])


@torch.no_grad()
def judge_generated(spec, weights, prompt, ids, max_ctx: int) -> dict:
    """The agreement rule (:mod:`onelaunch.measure.agree`) on tokens an engine generated: the
    oracle is fed the engine's own tokens, and each of the engine's choices is judged
    against the oracle's logits for the same prefix (in chunks: a long prompt fits)."""
    ids = torch.as_tensor(ids).cpu().long()
    o = Oracle(spec, weights, max_ctx=max_ctx)
    seq = torch.cat([torch.as_tensor(prompt).cpu().long(), ids[:-1]]).to(o.device)
    n, rows = torch.as_tensor(prompt).numel(), []
    for lo in range(0, seq.numel(), 1024):
        hi = min(seq.numel(), lo + 1024)
        logits = o(seq[lo:hi], torch.arange(lo, hi, device=o.device))   # [hi-lo, V]
        if hi > n - 1:
            rows.append(logits[max(0, n - 1 - lo):].float().cpu())
    return agree.judge_tokens(torch.cat(rows), ids)
