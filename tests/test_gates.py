"""The gates themselves, tested: each check fails loudly, judges the right quantity, and
refuses what it should.

* the agreement rule (``onelaunch.measure.agree``): a far token at a near tie of two *other*
  tokens is a flip; the threshold is strict;
* a stub engine choosing a far token at a tie is refused by ``agree.judge``;
* a patched kernel (the QKV bias dropped) fails its kernel row and gets the rung refused,
  and the sweeps check what they time;
* a failed gate fails the chapter (``chapter.require``), ``bench`` and the CLI.

CPU, Triton's interpreter, tiny-qwen2 at a few positions: about a minute.
"""
import pytest
import torch

from onelaunch import cli
from onelaunch.measure import agree, kernel_rows, ladder, references, sweeps, tune
from onelaunch.report import chapter
from onelaunch import kernels as K
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights

SPEC = get_spec("tiny-qwen2")


@pytest.fixture(scope="module")
def w():
    return random_weights(SPEC, 0)     # bf16, what the kernels read


@pytest.fixture
def bias_dropped(monkeypatch):
    """The QKV kernel without its bias (the bug chapter 3's CPU run once let through)."""
    orig = K.rms_qkv.rms_qkv

    def rms_qkv_no_bias(x, g, w_qkv, b_qkv, out, eps, **kw):
        return orig(x, g, w_qkv, None, out, eps, **kw)
    monkeypatch.setattr(K.rms_qkv, "rms_qkv", rms_qkv_no_bias)


# ---- the rule --------------------------------------------------------------------------
def _logits(rows):
    """[N, V] logits, V = 16, with the given {token: logit} at each step (others -10)."""
    out = torch.full((len(rows), 16), -10.0)
    for i, r in enumerate(rows):
        for t, v in r.items():
            out[i, t] = v
    return out


def test_bf16_ulp_and_threshold():
    assert agree.bf16_ulp(12.5) == 2 ** -4 and agree.bf16_ulp(-8.0) == 2 ** -4
    assert agree.bf16_ulp(1.0) == 2 ** -7 and agree.bf16_ulp(0.75) == 2 ** -8
    assert agree.threshold(12.5) == agree.NEAR_TIE_ULPS * 2 ** -4 == 0.5


def test_rule_judges_the_chosen_token_not_the_reference_margin():
    # step 0: the reference has an exact tie between 3 and 4; step 1: a clear choice
    ref = _logits([{3: 12.0, 4: 12.0, 9: 9.0}, {5: 12.0, 6: 11.0}])
    tie_partner = agree.judge_tokens(ref, [4, 5])
    assert tie_partner["ok"] and tie_partner["agree"] == "1/2"
    assert tie_partner["rows"][0]["verdict"] == "near tie" and tie_partner["rows"][0]["gap"] == 0
    # a far token at the tied step: the reference's margin there is 0, but its logit for
    # the chosen token is 3 below its top, 48 ulps: a flip
    far = agree.judge_tokens(ref, [9, 5])
    assert not far["ok"] and far["flips"][0]["step"] == 0
    r = far["rows"][0]
    assert (r["ref_token"], r["got_token"], r["ref_top"], r["ref_got"], r["gap"]) == (3, 9, 12.0, 9.0, 3.0)
    assert r["verdict"] == "flip" and r["threshold"] == 0.5 and r["gap_ulps"] == 48


def test_rule_is_strict_at_the_threshold():
    thr = agree.threshold(12.0)
    just_in = agree.judge_tokens(_logits([{1: 12.0, 2: 12.0 - thr + 2 ** -4}]), [2])
    at = agree.judge_tokens(_logits([{1: 12.0, 2: 12.0 - thr}]), [2])
    assert just_in["ok"] and just_in["rows"][0]["verdict"] == "near tie"
    assert not at["ok"] and at["rows"][0]["verdict"] == "flip"
    assert not agree.judge_tokens(_logits([{1: 12.0}]), [99])["ok"]     # not even a token


class StubEngine:
    """An engine that returns the oracle's tokens except ``choose`` at some steps."""

    def __init__(self, choose):
        self.choose = choose

    def _ids(self, ref):
        ids = torch.as_tensor(ref).clone()
        for i, t in self.choose.items():
            ids[i] = t
        return ids

    def generate(self, prompt, n, graph=True):
        return self._ids(self.ref[:n])

    def teacher_forced(self, prompt, forced, graph=True):
        return self._ids(forced)


def test_judge_refuses_a_far_token_at_a_tie():
    ref_logits = _logits([{3: 12.0, 4: 12.0, 9: 9.0}, {5: 12.0, 6: 11.0}, {7: 10.0}])
    ref_ids = ref_logits.argmax(-1)
    far, tied = StubEngine({0: 9}), StubEngine({0: 4})
    for e in (far, tied):
        e.ref = ref_ids
    j = agree.judge(far, torch.tensor([1]), (ref_ids, ref_logits), graph=False)
    assert not j["ok"] and j["agree"] == "2/3"
    assert j["flips"][0]["verdict"] == "flip" and "refused" not in j
    assert "9" in agree.refusal(j["flips"])
    j = agree.judge(tied, torch.tensor([1]), (ref_ids, ref_logits), graph=False)
    assert j["ok"] and j["flips"][0]["verdict"] == "near tie"


# ---- a bug in a kernel fails the kernel row and refuses the rung -------------------------
def test_kernel_rows_pass_and_fail_loudly(w, bias_dropped):
    rows = {r["kernel"]: r for r in kernel_rows.kernel_rows(SPEC, w, "cpu", ctx=8, iters=1)}
    bad = rows["rms_qkv"]
    assert bad["check"].startswith("FAIL") and bad["us"] is None and bad["gbps"] is None
    assert bad["rel_err"] > 10 * references.GEMV_TOL               # 6e-2: chapter 3 saw 5.97e-2
    # every other kernel passes, and was timed
    assert [k for k, r in rows.items() if r["check"] != "pass"] == ["rms_qkv"]
    assert all(r["us"] > 0 for k, r in rows.items() if k != "rms_qkv")
    assert [r["kernel"] for r in agree.failures(list(rows.values()))] == ["rms_qkv"]


def test_ladder_refuses_a_rung_with_a_bug(w, bias_dropped):
    rows = ladder.ladder_rows(SPEC, w, "cpu", ctx=4, tokens=2, iters=1, rungs=("fused eager",))
    r = rows[0]
    assert r["ms_per_token"] is None and r["refused"], r
    assert any(f["verdict"] == "flip" for f in r["flips"])
    with pytest.raises(chapter.GateFailed, match="fused eager"):
        chapter.require(rows, "the ladder")


def test_sweep_checks_each_context_before_timing_it(w, monkeypatch):
    rows = sweeps.sweep_rows(SPEC, w, "cpu", ctxs=(9,), iters=2, check_tokens=2)
    assert rows[0]["agree"] == "2/2" and rows[0]["ms_per_token"] > 0
    orig = K.o_proj_residual.o_proj_residual

    def residual_lost(attn, w_o, x, **kw):           # x = W_o @ attn, the residual dropped
        x.zero_()
        return orig(attn, w_o, x, **kw)
    monkeypatch.setattr(K.o_proj_residual, "o_proj_residual", residual_lost)
    timed = []
    monkeypatch.setattr(sweeps, "time_engine_step", lambda *a, **k: timed.append(a) or 1.0)
    rows = sweeps.sweep_rows(SPEC, w, "cpu", ctxs=(9,), iters=2, check_tokens=3)
    assert rows[0]["refused"] and rows[0]["ms_per_token"] is None and not timed


def test_config_sweep_checks_each_config_and_reports_failures(w, monkeypatch, capsys):
    orig = K.rms_qkv.rms_qkv

    def buggy_when_narrow(x, g, wq, b, out, eps, cfg=None, **kw):   # a config-dependent bug
        return orig(x, g, wq, None if cfg["BLOCK_N"] == 4 else b, out, eps, cfg=cfg, **kw)
    monkeypatch.setattr(K.rms_qkv, "rms_qkv", buggy_when_narrow)
    grid = {"rms_qkv": [dict(BLOCK_N=8, BLOCK_K=64, num_warps=4), dict(BLOCK_N=4, BLOCK_K=64, num_warps=4)],
            "o_proj_residual": [dict(BLOCK_N=3, BLOCK_K=64, num_warps=4)]}  # not a power of 2: raises
    rows = tune.config_sweep(SPEC, w, "cpu", iters=2, grid=grid)
    good, wrong, raised = rows
    assert good["check"] == "pass" and good["us"] > 0
    assert wrong["check"].startswith("FAIL") and "us" not in wrong
    assert "error" in raised and "us" not in raised and raised["traceback"]
    assert agree.failures(rows) == [wrong, raised]
    assert "2 of 3 configurations failed" in capsys.readouterr().out


# ---- a failed gate fails the run ---------------------------------------------------------
def test_require_raises_after_showing_the_rows(monkeypatch):
    shown = []
    monkeypatch.setattr(chapter, "markdown", shown.append)
    ok = [{"kernel": "a", "check": "pass", "us": 1.0}]
    chapter.require(ok, "kernels")                                    # nothing to say
    bad = ok + [{"kernel": "b", "check": "FAIL (rel err 6e-02 > 1e-03)", "us": None}]
    with pytest.raises(chapter.GateFailed, match=r"kernels: 1 failed their check: b: FAIL"):
        chapter.require(bad, "kernels", show=True)
    assert "| b | FAIL (rel err 6e-02 > 1e-03) | – |" in shown[0]    # the table came first
    with pytest.raises(chapter.GateFailed):
        chapter.require({"model": "m", "ok": False, "agree": "3/12"}, "long context")


def test_cli_bench_exits_1_on_a_refused_rung(monkeypatch, capsys):
    refused = {"model": "tiny-qwen2", "rung": "fused eager", "ctx": 8, "ms_per_token": None,
               "floor_ms": None, "agree": "1/3", "refused": "teacher-forced choices differ"}
    monkeypatch.setattr(ladder, "ladder_rows", lambda *a, **k: [dict(refused)])
    assert cli.main(["bench", "--model", "tiny-qwen2", "--device", "cpu", "--no-peers",
                     "--ctx", "8", "--tokens", "3", "--iters", "2"]) == 1
    out = capsys.readouterr()
    assert "REFUSED" in out.out and "FAILED" in out.err              # the table, then the verdict


# ---- on the GPU (python -m pytest -m gpu) ---------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_long_context_by_the_rule():
    """At ctx 8192 the graph engine, teacher-forced along the oracle's continuation, passes
    the agreement rule at every step: any flip is judged by the gap to the token it chose
    at that step, not by the smallest margin over all steps."""
    spec = get_spec("qwen2.5-1.5b")
    wq = random_weights(spec, 0, device="cuda")
    r = sweeps.long_context_agreement(spec, wq, "cuda", ctx=8192, tokens=12)
    print(r)
    assert r["ok"], r["flips"]
