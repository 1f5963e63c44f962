"""The oracle against Hugging Face: does our reference decode what transformers decodes?

Everything else in the project is held to the oracle, so the oracle is held to HF.

* On the CPU both run in fp32 over one shared weights dict (``weights.hf_model`` assigns
  our tensors into the HF model), so they differ only by the order of floating-point
  operations: logits agree to ~1e-5 and every greedy token is the same.
* On a GPU, at full shapes, the oracle runs in bf16, as the engine will, against an fp32
  HF reference over the same numbers (random weights are bf16-representable by
  construction, so the fp32 copy holds exactly the values the bf16 oracle reads). Here a
  near-tie between the top two logits can flip a token; such a flip is reported with the
  reference's margin, never hidden.

Method: the oracle greedily generates ``tokens`` ids from the prompt; HF then runs one
teacher-forced forward over prompt + generated ids, which gives its logits at every step.
When every step agrees this is exactly HF's greedy decode; on the CPU we also run HF's own
``generate(do_sample=False)`` to confirm it.
"""
from __future__ import annotations

import torch

from . import agree
from .oracle import Oracle
from .specs import ModelSpec, get_spec
from .weights import hf_model, random_weights

# fp32 against fp32: both sides hold the same weights, so the only difference is the order
# of additions (einsum vs HF's matmuls, attention over a masked static cache vs over the
# prefix). That costs ~1e-6 of the logit scale at the tiny shapes; 1e-4 of the logit std
# leaves a wide margin yet still catches a wrong norm epsilon or a skipped rotation.
FP32_REL_TOL = 1e-4


class UsageError(ValueError):
    """Bad input from a user (prompt too long, ids out of range, ...). The message says
    how to fix it; the CLI prints it as one line and exits 2."""


def validate_prompt(spec: ModelSpec, prompt: torch.Tensor, new_tokens: int, max_ctx: int) -> None:
    """Raise :class:`UsageError` unless ``prompt`` (ids [L]) plus ``new_tokens`` fit."""
    L = prompt.numel()
    if L < 1:
        raise UsageError("the prompt is empty; give at least one token (--prompt-len 1 or more)")
    if new_tokens < 1:
        raise UsageError(f"--tokens must be at least 1 (got {new_tokens})")
    if L + new_tokens > max_ctx:
        raise UsageError(f"prompt ({L}) + new tokens ({new_tokens}) = {L + new_tokens} exceeds "
                         f"the context of {spec.name} ({max_ctx}); use a shorter prompt or "
                         "fewer --tokens")
    lo, hi = int(prompt.min()), int(prompt.max())
    if lo < 0 or hi >= spec.vocab:
        bad = lo if lo < 0 else hi
        raise UsageError(f"token id {bad} is out of range for {spec.name}; ids must be in "
                         f"[0, {spec.vocab - 1}]")


def make_prompt(spec: ModelSpec, prompt_len: int, seed: int, prompt_ids=None) -> torch.Tensor:
    """The given ids, or ``prompt_len`` random ids from a seeded generator. Returns [L] int64."""
    if prompt_ids is not None:
        return torch.as_tensor(list(prompt_ids), dtype=torch.int64)
    if prompt_len < 1:
        raise UsageError(f"--prompt-len must be at least 1 (got {prompt_len})")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, spec.vocab, (prompt_len,), generator=g)


def _convert(weights: dict[str, torch.Tensor], device, dtype) -> dict[str, torch.Tensor]:
    """``weights`` on ``device`` in ``dtype`` (tensors already there are not copied); a
    tensor shared under two names (tied embeddings) stays shared."""
    seen: dict[int, torch.Tensor] = {}
    out = {}
    for k, t in weights.items():
        if id(t) not in seen:
            seen[id(t)] = t.to(device=device, dtype=dtype)
        out[k] = seen[id(t)]
    return out


def _top2_margin(logits: torch.Tensor) -> torch.Tensor:
    # logits: [N, V] -> [N], top-1 minus top-2
    top = logits.topk(2, dim=-1).values
    return top[:, 0] - top[:, 1]


@torch.no_grad()
def _oracle_decode(spec, weights, prompt, tokens, cache):
    oracle = RouterLog(spec, weights, max_ctx=cache)
    ids, logits = oracle.generate(prompt, tokens, return_logits=True)  # [N], [N, V] fp32
    # MoE: the ties among the router's top k + 1 at every token of every layer
    rows = [row for r in oracle.router for row in r]
    ties = router_ties(rows, spec.top_k) if spec.is_moe else None
    return ids.cpu(), logits.cpu(), ties


@torch.no_grad()
def _hf_teacher_forced(model, prompt, ids):
    # one forward over prompt + generated: logits at positions L-1 .. L+N-2 chose ids[0..N-1]
    L, N = prompt.numel(), ids.numel()
    seq = torch.cat([prompt, ids]).to(model.device)[None]                      # [1, L+N]
    return model(seq, use_cache=False).logits[0, L - 1:L - 1 + N].float().cpu()  # [N, V]


@torch.no_grad()
def _hf_generate(model, prompt, tokens):
    seq = prompt.to(model.device)[None]
    out = model.generate(seq, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                         num_beams=1, temperature=None, top_p=None, top_k=None)
    return out[0, prompt.numel():].cpu()


LAYER_PREFIX = "model.layers."


def _upcast_one_layer_at_a_time(model) -> None:
    """Hooks on each decoder layer: before it runs, its parameters become fp32 copies of
    their (bf16) values; after it, the copies are dropped. The layer computes exactly as
    an fp32 layer would, but only one layer's fp32 copy exists at any time."""
    def before(layer, args):
        layer._onelaunch_held = [(p, p.data) for p in layer.parameters()]
        for p, data in layer._onelaunch_held:
            p.data = data.to(torch.float32)

    def after(layer, args, out):
        for p, data in layer._onelaunch_held:
            p.data = data
        del layer._onelaunch_held

    for layer in model.model.layers:
        layer.register_forward_pre_hook(before)
        layer.register_forward_hook(after)


def fp32_reference(spec, weights: dict[str, torch.Tensor], piecewise: bool):
    """The Hugging Face model that computes in fp32 over ``weights`` (whose values are
    bf16-representable). Whole: an fp32 copy of every tensor (OLMoE: 28 GB). Piecewise:
    the embedding, final norm and LM head in fp32, the decoder layers kept as they are and
    upcast one at a time while they run (OLMoE: its 13.8 GB of bf16 plus one layer in fp32,
    1.7 GB), with the same numbers."""
    if not piecewise:
        return hf_model(spec, _convert(weights, None, torch.float32))
    outer = _convert({k: t for k, t in weights.items() if not k.startswith(LAYER_PREFIX)},
                     None, torch.float32)
    first = "model.embed_tokens.weight"      # hf_model builds in the first tensor's dtype
    mixed = {first: outer[first], **outer,
             **{k: t for k, t in weights.items() if k.startswith(LAYER_PREFIX)}}
    model = hf_model(spec, mixed)
    _upcast_one_layer_at_a_time(model)
    return model


def compare_with_hf(spec_or_name, device="cpu", tokens: int = 12, prompt_len: int = 7,
                    seed: int = 0, prompt_ids=None, max_ctx: int | None = None,
                    weights: dict[str, torch.Tensor] | None = None,
                    hf_generate: bool | None = None, oracle_dtype=None,
                    piecewise: bool | None = None) -> dict:
    """Run the oracle and HF on one prompt and report how far apart they are.

    ``weights`` (HF names, any dtype) replaces the seeded random weights, e.g. a loaded
    checkpoint. ``max_ctx`` bounds prompt + tokens (default: the model's context) and sets
    the oracle's cache; on a GPU the cache defaults to prompt + tokens, to save memory.
    ``hf_generate`` (default: on the CPU) also runs HF's own greedy ``generate``.
    ``oracle_dtype`` defaults to bf16 on a GPU and fp32 on the CPU; the reference is fp32.
    ``piecewise`` (default: whenever the oracle is not fp32) builds that reference one
    decoder layer at a time (:func:`fp32_reference`), so OLMoE's check fits in 24 GB.

    Returns a dict: ``agree`` ("k/N"), ``max_abs_err``, ``rel_err`` (over the std of HF's
    logits), ``min_margin``, ``disagreements`` (step, ids, HF margin and the gap HF sees
    between its choice and the oracle's), ``ok`` and the inputs.
    """
    spec = get_spec(spec_or_name)
    device = torch.device(device)
    cuda = device.type == "cuda"
    prompt = make_prompt(spec, prompt_len, seed, prompt_ids)
    limit = max_ctx or spec.max_ctx
    validate_prompt(spec, prompt, tokens, limit)
    cache = max_ctx or (prompt.numel() + tokens if cuda else spec.max_ctx)
    hf_generate = (not cuda) if hf_generate is None else hf_generate
    oracle_dtype = oracle_dtype or (torch.bfloat16 if cuda else torch.float32)

    old_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")   # no TF32 in the fp32 reference
    try:
        if weights is None:
            weights = random_weights(spec, seed=seed, device=device, dtype=oracle_dtype)
        else:
            weights = _convert(weights, device, oracle_dtype)
        ids, o_logits, ties = _oracle_decode(spec, weights, prompt, tokens, cache)
        # the fp32 reference: on the CPU the same dict; on a GPU fp32 copies of the bf16
        # values, made after the oracle's cache is gone, one decoder layer at a time
        # (OLMoE in fp32 is 28 GB, more than a 24 GB GPU holds)
        if piecewise is None:
            piecewise = oracle_dtype != torch.float32
        model = fp32_reference(spec, weights, piecewise)
        del weights
        h_logits = _hf_teacher_forced(model, prompt, ids)
        gen_ids = _hf_generate(model, prompt, tokens) if hf_generate else None
        del model
    finally:
        torch.set_float32_matmul_precision(old_precision)
        if cuda:
            torch.cuda.empty_cache()
    return dict(_report(spec, device, oracle_dtype, prompt, prompt_ids is not None, seed,
                        ids, o_logits, h_logits, gen_ids), router_ties=ties)


def _report(spec, device, oracle_dtype, prompt, given, seed, ids, o_logits, h_logits, gen_ids):
    N = ids.numel()
    err = (o_logits - h_logits).abs().max().item()
    std = h_logits.std().item()
    margins = _top2_margin(h_logits)                                            # [N]
    # the one agreement rule (onelaunch.agree): HF's teacher-forced logits judge the
    # oracle's token at every step
    j = agree.judge_tokens(h_logits, ids)
    disagreements = [dict(r, oracle_token=r["got_token"], hf_token=r["ref_token"],
                          hf_margin=margins[r["step"]].item(), hf_gap=r["gap"])
                     for r in j["rows"] if r["verdict"] != "match"]
    step = int(margins.argmin())
    fp32 = oracle_dtype == torch.float32
    logits_ok = (err <= FP32_REL_TOL * std) if fp32 else None
    gen_match = None if gen_ids is None else bool(torch.equal(gen_ids, ids))
    ok = j["ok"] and logits_ok is not False and gen_match is not False
    return {
        "model": spec.name, "device": str(device),
        "oracle_dtype": str(oracle_dtype).replace("torch.", ""), "reference_dtype": "float32",
        "prompt_len": prompt.numel(), "prompt": "given" if given else f"random, seed {seed}",
        "tokens": N, "seed": seed,
        "agree": j["agree"], "agree_count": j["agree_count"],
        "near_ties": len(j["near_ties"]), "flips": len(j["flips"]),
        "rule": f"gap < {agree.NEAR_TIE_ULPS} bf16 ulps of HF's top logit",
        "max_abs_err": err, "logit_std": std, "rel_err": err / std,
        "logits_ok": logits_ok, "rel_tol": FP32_REL_TOL if fp32 else None,
        "min_margin": margins[step].item(), "min_margin_step": step,
        "disagreements": disagreements,
        "oracle_ids": ids.tolist(),
        "hf_generate_match": gen_match,
        "ok": ok,
    }


def format_report(r: dict) -> str:
    """The report as a few lines of text (what ``python -m onelaunch check`` prints)."""
    gen = {None: "", True: "; HF generate: same ids", False: "; HF generate: DIFFERENT ids"}
    tol = "" if r["rel_tol"] is None else f", tolerance {r['rel_tol']:.0e}"
    ids = "id" if r["prompt_len"] == 1 else "ids"
    lines = [
        f"check {r['model']} on {r['device']}: oracle {r['oracle_dtype']} vs HF "
        f"{r['reference_dtype']},",
        f"  prompt of {r['prompt_len']} {ids} ({r['prompt']}), {r['tokens']} greedy tokens",
        f"  agreement         {r['agree']}{gen[r['hf_generate_match']]}",
        f"  max |logit err|   {r['max_abs_err']:.3g} ({r['rel_err']:.2g} of the logit std "
        f"{r['logit_std']:.3g}{tol})",
        f"  smallest margin   {r['min_margin']:.4g} (top-1 minus top-2 of HF's logits, "
        f"step {r['min_margin_step']})",
    ]
    t = r.get("router_ties")
    if t is not None:      # MoE: does this check reach the top-k's tie order?
        lines.append(f"  router ties       {t['tied']} of {t['calls']} router calls "
                     f"({t['boundary']} at the top-{t['top_k']} boundary)"
                     + ("" if t["tied"] else ": the tie order was not exercised"))
    for d in r["disagreements"]:
        lines.append(f"  step {d['step']}: oracle {d['oracle_token']}, HF {d['hf_token']}; "
                     f"HF margin {d['hf_margin']:.4g},\n    HF gap to the oracle's token "
                     f"{d['hf_gap']:.4g} (threshold {d['threshold']:.4g}): {d['verdict']}")
    lines.append("  PASS" if r["ok"] else "  FAIL")
    return "\n".join(lines)


@torch.no_grad()
def judge_generated(spec, weights, prompt, ids, max_ctx: int) -> dict:
    """The agreement rule (:mod:`onelaunch.agree`) on tokens an engine generated: the
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


# ---- what a check exercised ------------------------------------------------------------
# A kernel bug hides in a mechanism the check never reaches: a second row block or K tile
# of a GEMV (a dropped last tile), the down projection's split over K, a second live
# split of split-K attention, a split of several tiles, a last split shorter than the
# others, the router's ties. At its default prompt a CPU run reaches few of them: a
# 16-token prompt lives in one split, and at the interpreter's wide tiles most GEMVs of a
# tiny model are one K tile wide. So ``generate --check`` lists what its run exercised
# and what it did not, and on the CPU adds a covering run (``cover``) that reaches the
# rest; ``check`` (the oracle against HF) counts the router ties it saw.

# launcher -> (its weight argument, rows and reduction length of one program's matrix
# from the weight's shape, its launch-configuration key)
GEMVS = {
    "rms_qkv": ("w_qkv", lambda s: (s[0], s[1]), "rms_qkv"),
    "o_proj_residual": ("w_o", lambda s: (s[0], s[1]), "o_proj"),
    "rms_gate_up_swiglu": ("w_gate_up", lambda s: (s[0] // 2, s[1]), "gate_up"),
    "down_residual": ("w_down", lambda s: (s[0], s[1]), "down"),
    "lm_head_argmax": ("w", lambda s: (s[0], s[1]), "lm_head"),
    "moe_router": ("w_router", lambda s: (s[0], s[1]), "router"),
    "moe_gate_up_swiglu": ("w_gate_up", lambda s: (s[1] // 2, s[2]), "moe_gate_up"),
    "moe_down_residual": ("w_down", lambda s: (s[1], s[2]), "moe_down"),
}

# the covering run: a seeded prompt of COVER_PROMPT ids prefilled, then COVER_STEPS steps
# (positions 129 and 130) of an engine of COVER_CTX positions (3 splits of 64 a kv head)
# whose live length is shared over at most COVER_LIVE_CAP splits: 3 chunks make a split
# of 2 tiles and a last split of 1, and the third split exits (past the live length), as
# the GPU's cap makes them past 4096 positions; its GEMV tiles are halved until each
# GEMV has 2 row blocks and 2 K tiles (the down projection 2 K splits of 2 tiles)
COVER_PROMPT, COVER_STEPS, COVER_CTX, COVER_LIVE_CAP = 130, 2, 192, 2
# the covering run's logits against the oracle's: the largest difference over the
# vocabulary, in bf16 ulps of the oracle's top logit. On the tiny models (seeds 0 to 5):
# 1.1 to 3.5 without a bug; 77 to 90 with the split-K merge not rescaling its partial
# maxima, 125 to 127 with gate/up's last K tile dropped (ci/mutants.py), bugs whose greedy
# tokens still agreed: a token moves only past a margin of one or two logits
COVER_LOGIT_ULPS = 16


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def gemv_tiles(e, calls=None) -> dict:
    """Each GEMV launcher of ``e``'s step (``Engine.trace``), once: its configuration
    key and config, rows N, reduction length K, row blocks, K tiles of one split, K
    splits, and whether the last row block and K tile are partial."""
    from .kernels.down_residual import down_split
    out = {}
    for c in calls if calls is not None else e.trace():
        g = GEMVS.get(c["kernel"])
        if g is None or c["kernel"] in out:
            continue
        arg, shape_of, key = g
        w = c["args"][arg]
        N, Kd = shape_of(tuple(w.shape))
        cfg = dict(c["args"].get("cfg") or e.cfg(key, w))
        span, splits = down_split(Kd, cfg) if key == "down" else (Kd, 1)
        out[c["kernel"]] = dict(
            key=key, cfg=cfg, N=N, K=Kd, row_blocks=_cdiv(N, cfg["BLOCK_N"]),
            rows_partial=N % cfg["BLOCK_N"] != 0, k_tiles=_cdiv(min(span, Kd), cfg["BLOCK_K"]),
            k_partial=Kd % cfg["BLOCK_K"] != 0, splits=splits)
    return out


def router_ties(logits, top_k: int) -> dict:
    """Ties among the ``top_k + 1`` largest of each router call's logits (equal logits
    are equal probabilities: the tie order, lower expert first, decides the ids),
    and at the top-k boundary (it decides which experts run)."""
    tied = boundary = 0
    for lg in logits:
        top = lg.float().flatten().sort(descending=True).values[: top_k + 1]
        tied += bool((top[1:] == top[:-1]).any())
        boundary += bool(top[top_k - 1] == top[top_k])
    return {"calls": len(logits), "tied": tied, "boundary": boundary, "top_k": top_k}


def _ties_row(t: dict):
    return ("router ties", t["tied"] > 0,
            f"{t['tied']} of {t['calls']} calls, {t['boundary']} at the top-k boundary")


def mechanisms(e, first: int, last: int, ties: dict | None = None) -> list[tuple]:
    """What a run of engine ``e`` whose steps consumed positions ``first..last``
    exercised: rows of (mechanism, exercised, how), from the step's kernel calls, their
    launch configurations and the live lengths; ``ties`` (``router_ties``) adds the
    router's row."""
    from . import kernels as K
    rows = []
    for g in gemv_tiles(e).values():
        c, key = g["cfg"], g["key"]
        rows += [(f"{key}: several row blocks", g["row_blocks"] >= 2,
                  f"{g['row_blocks']} of {c['BLOCK_N']} rows"),
                 (f"{key}: several K tiles", g["k_tiles"] >= 2,
                  f"{g['k_tiles']} of {c['BLOCK_K']}" + (" a split" if key == "down" else ""))]
        if key == "down":
            rows.append(("down: a split over K", g["splits"] >= 2, f"{g['splits']} splits"))
    p = e.paths
    if p["attention"] == "splitk":
        n_splits = e.partials()[0].shape[1]
        share = K.live_share(n_splits, e.live_cap)
        bt = min(e.cfg("attn_split")["BLOCK_T"], e.chunk)
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
    from .kernels.down_residual import down_split
    out = dict(e.cfgs)
    for g in gemv_tiles(e).values():
        c, down = dict(g["cfg"]), g["key"] == "down"
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


class RouterLog(Oracle):
    """The oracle, keeping every MoE router call's logits (rows [T, E]) in ``router``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.router: list[torch.Tensor] = []

    def mlp(self, li, x, all_experts=False):
        if self.spec.is_moe:
            w = self.w(f"model.layers.{li}.mlp.gate.weight")
            self.router.append(torch.nn.functional.linear(x, w).float().cpu())
        return super().mlp(li, x, all_experts)


def _cover_prompt(spec, seed: int) -> torch.Tensor:
    """The covering run's prompt: COVER_PROMPT seeded random ids (a stream apart from the
    run's own prompt)."""
    g = torch.Generator().manual_seed(seed ^ 0x5EED0000)
    return torch.randint(0, spec.vocab, (COVER_PROMPT,), generator=g)


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
    from .engine import Engine
    from .prefill import prefill
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
