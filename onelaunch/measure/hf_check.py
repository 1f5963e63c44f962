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

from ..oracle import Oracle
from ..prompt import make_prompt, validate_prompt
from ..weights import hf_model, random_weights
from . import agree


# fp32 against fp32: both sides hold the same weights, so the only difference is the order
# of additions (einsum vs HF's matmuls, attention over a masked static cache vs over the
# prefix). That costs ~1e-6 of the logit scale at the tiny shapes; 1e-4 of the logit std
# leaves a wide margin yet still catches a wrong norm epsilon or a skipped rotation.
FP32_REL_TOL = 1e-4


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


def compare_with_hf(spec, device="cpu", tokens: int = 12, prompt_len: int = 7,
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
