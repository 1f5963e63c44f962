"""The one agreement rule: when may a token differ from the reference's? And the oracle
run every rung is judged against (:func:`oracle_tokens`, :func:`judge`).

Every comparison of greedy tokens in this project goes through :func:`judge_tokens`: the
oracle against Hugging Face (``check``), each rung of the engine against the oracle
(``bench``, ``generate --check``), and the peers against the oracle. The rule:

    At step i the reference chose ``ref = argmax(ref_logits[i])``; the run under test
    chose ``got``. Let ``gap = ref_logits[i, ref] - ref_logits[i, got]`` (the reference's
    own logit gap between its token and ours; 0 when they are the same token) and
    ``threshold = NEAR_TIE_ULPS * ulp(|ref_logits[i, ref]|)``, ulp being the spacing of
    bf16 numbers at the reference's top logit. Then the step is

    * ``"match"``     when ``got == ref``;
    * ``"near tie"``  when ``got != ref`` and ``gap < threshold`` (strictly);
    * ``"flip"``      otherwise: a real disagreement, and the run is refused.

The rule judges the token the run chose, not the reference's top-1/top-2 margin: a run
that picks an arbitrary token at a step where the reference happens to have a near tie
between two *other* tokens is still a flip. Checks are teacher-forced (the run is fed
the reference's tokens, so every step is judged from the same prefix and one early tie
cannot hide the rest), and each judged step is a row that records both logits.

Why ``NEAR_TIE_ULPS = 8`` bf16 ulps of the top logit. A decode step in bf16 rounds
every activation to 8 significant bits, so two correct implementations that round at
different points (or sum in a different order) give logits that differ by a few bf16
ulps of the logits' own magnitude; a threshold in ulps of the top logit scales with
that magnitude (an absolute number would be loose for small logits and tight for large
ones). The largest difference we must tolerate is the one between a bf16 computation
and an fp32 reference over a whole model: measured for Qwen2.5-1.5B (prompt 16, seed 0)
at up to 0.27 logits, with top logits in [8, 16) where a bf16 ulp is 1/16, so 4.3 ulps.
A swap of two tokens needs both of their logits to move, each by up to that error, hence
twice it: 8 ulps (0.5 logits at a top logit in [8, 16), the value the peers used).
The near ties measured on the H200 lie within it (in logits: the engine 0 and 0.125; the
bf16 oracle against fp32 HF 0.005 to 0.036; HF and the compiled oracle 0.0625 and
0.1875), and real bugs lie far outside it (the QKV bias dropped from the kernel flipped
a token at a step whose margin was 2.47 logits; ``tests/test_gates.py`` measures the
deliberate bugs of ``ci/mutants.py``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch

from ..oracle import Oracle

# The near-tie threshold, in bf16 ulps of the reference's top logit (module docstring).
NEAR_TIE_ULPS = 8

BF16_MANTISSA_BITS = 7     # explicit bits: one ulp of x is 2^(floor(log2 |x|) - 7)


def bf16_ulp(x: float) -> float:
    """The spacing of bf16 numbers at ``x``: 2^(floor(log2 |x|) - 7) (2^-133 at 0)."""
    a = abs(float(x))
    if a == 0.0 or not math.isfinite(a):
        return 2.0 ** (-126 - BF16_MANTISSA_BITS) if a == 0.0 else math.inf
    return 2.0 ** (math.floor(math.log2(a)) - BF16_MANTISSA_BITS)


# The same rule in logits, for records that keep a gap but not the top logit (the
# oracle's check against HF, older ladder rows): 8 ulps at a top logit in [8, 16), 0.5.
NEAR_TIE_LOGITS = NEAR_TIE_ULPS * bf16_ulp(8.0)


def threshold(ref_top: float) -> float:
    """The near-tie threshold at a step whose reference top logit is ``ref_top``."""
    return NEAR_TIE_ULPS * bf16_ulp(ref_top)


def verdict(ref_token: int, got_token: int, gap: float, thr: float) -> str:
    """``"match"``, ``"near tie"`` (a different token whose reference logit is strictly
    within ``thr`` of the top) or ``"flip"``."""
    if int(ref_token) == int(got_token):
        return "match"
    return "near tie" if gap < thr else "flip"


def judge_step(step: int, ref_logits: torch.Tensor, got_token: int) -> dict:
    """The rule at one step. The reference chose the top of its logits ``ref_logits``
    [V]; the run under test chose ``got_token``. The same token is a match; another one
    whose logit, in the reference's own logits, lies strictly within ``NEAR_TIE_ULPS``
    bf16 ulps of the top is a near tie (rounding decided it); anything else, a flip."""
    lg = ref_logits.detach().float().cpu()
    ref = int(lg.argmax())                     # the first index among equal maxima
    got = int(got_token)
    top = float(lg[ref])
    if 0 <= got < lg.numel():
        ref_got = float(lg[got])
        gap = top - ref_got                    # how far the reference prefers its own
    else:
        ref_got, gap = None, math.inf          # not a token: never a near tie
    ulp = bf16_ulp(top)                        # bf16's spacing at the top logit
    thr = threshold(top)                       # NEAR_TIE_ULPS of them
    return {"step": step, "ref_token": ref, "got_token": got, "ref_top": top,
            "ref_got": ref_got, "gap": gap, "gap_ulps": gap / ulp, "threshold": thr,
            "verdict": verdict(ref, got, gap, thr)}


def judge_tokens(ref_logits, got_ids) -> dict:
    """Judge a run's tokens ``got_ids`` [N] against the reference's logits [N, V] at the
    same steps (teacher-forced: step i of both saw the same prefix).

    Returns ``{"ok", "agree", "agree_count", "n", "rows", "flips", "near_ties",
    "max_gap_ulps"}``: ``ok`` is True when no step is a flip; ``agree`` is "k/N", k the
    steps where the tokens are the same; ``rows`` has one dict per step (step, ref_token,
    got_token, ref_top, ref_got, gap, gap_ulps, threshold, verdict); ``flips`` and
    ``near_ties`` are the rows with that verdict."""
    ref_logits = torch.as_tensor(ref_logits)
    got = torch.as_tensor(got_ids).flatten().tolist()
    if ref_logits.dim() != 2 or ref_logits.shape[0] != len(got):
        raise ValueError(f"judge_tokens needs logits [N, V] and N ids; got logits "
                         f"{tuple(ref_logits.shape)} and {len(got)} ids")
    rows = [judge_step(i, ref_logits[i], t) for i, t in enumerate(got)]
    n = len(rows)
    k = sum(r["verdict"] == "match" for r in rows)
    flips = [r for r in rows if r["verdict"] == "flip"]
    ties = [r for r in rows if r["verdict"] == "near tie"]
    gaps = [r["gap_ulps"] for r in rows if r["verdict"] != "match"]
    return {"ok": not flips and n > 0, "agree": f"{k}/{n}", "agree_count": k, "n": n,
            "rows": rows, "flips": flips, "near_ties": ties,
            "max_gap_ulps": max(gaps) if gaps else 0.0}


def disagreements(result: dict) -> list[dict]:
    """The rows of a :func:`judge_tokens` result whose tokens differ (near ties and
    flips), each with ``margin``/``near_tie_below`` as well: the names the ladder files
    and ``results.row_passes`` read (``margin`` is the gap to the chosen token)."""
    return [dict(r, margin=r["gap"], near_tie_below=r["threshold"])
            for r in result["rows"] if r["verdict"] != "match"]


def describe(result: dict) -> str:
    """One line: the agreement, and each step that differs with its gap and verdict."""
    parts = [f"{result['agree']} tokens agree"]
    for r in result["rows"]:
        if r["verdict"] != "match":
            parts.append(f"step {r['step']}: reference {r['ref_token']}, got {r['got_token']}, "
                         f"gap {r['gap']:.4g} ({r['gap_ulps']:.1f} ulps; threshold "
                         f"{r['threshold']:.4g}): {r['verdict']}")
    return "; ".join(parts)


def failures(rows) -> list[dict]:
    """The rows (or one result dict) whose check failed: refused (a rung, a peer, a context
    of the sweep), a kernel or launch configuration whose ``check`` is not "pass", one that
    raised (``error``), or a result with ``ok`` False. A run with any of them fails."""
    if isinstance(rows, dict):
        rows = [rows]
    bad = []
    for r in rows:
        chk = r.get("check")
        if r.get("refused") or r.get("error") or r.get("ok") is False or \
                (chk is not None and chk != "pass"):
            bad.append(r)
    return bad


# ---- judging a run against the oracle ------------------------------------------------
def oracle_tokens(spec, w, prompt, tokens, max_ctx):
    """The oracle's greedy ids [tokens] and the logits that chose them [tokens, V] (fp32,
    on the CPU): the reference every rung is judged against (:func:`judge_tokens`)."""
    o = Oracle(spec, w, max_ctx=max_ctx)
    ids, logits = o.generate(prompt, tokens, return_logits=True)
    del o
    return ids.cpu(), logits.float().cpu()


@dataclass
class Agreement:
    """Free-running greedy tokens of a rung against the reference's: ``k`` is the length
    of the common prefix (after the first flip the two runs continue from different
    contexts, so later positions say nothing; the check that gates a peer is
    teacher-forced: :func:`judge`)."""
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


def judge(engine, prompt, ref, graph: bool) -> dict:
    """The oracle check of one engine mode, by the agreement rule (this module's rule).

    The engine runs teacher-forced: fed the oracle's own tokens, it records its argmax at
    every step, so each step is judged from the oracle's prefix and one early near tie
    cannot hide the later steps. A step passes when the engine's token is the oracle's,
    or when the oracle's logit for the engine's token is strictly within the near-tie
    threshold of the oracle's top logit. Every step that differs is listed (``flips``,
    with both logits, the gap and the verdict); ``ok`` is False on any real flip. The
    free-running tokens (the path the GPU feeds back to itself) are reported too."""
    ref_ids, ref_logits = ref
    n = ref_ids.numel()
    free = engine.generate(prompt, n, graph=graph)
    tf = engine.teacher_forced(prompt, ref_ids, graph=graph)
    j = judge_tokens(ref_logits, tf)
    return {"agree": j["agree"], "agree_free": str(agreement(free, ref_ids)),
            "flips": disagreements(j), "ok": j["ok"], "tokens": free.tolist(),
            "teacher_forced": tf.tolist()}


def refusal(flips: list[dict]) -> str:
    """The reason a row is refused: its real flips, as the agreement rule judged them."""
    real = [{k: f[k] for k in ("step", "ref_token", "got_token", "ref_top", "ref_got", "gap",
                               "threshold", "verdict")} for f in flips if f["verdict"] == "flip"]
    return ("teacher-forced choices differ from the oracle beyond a near tie "
            f"(gap >= {NEAR_TIE_ULPS} bf16 ulps of the top logit): " + json.dumps(real))
