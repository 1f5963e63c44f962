"""What ran, not what was asked for: the engine reads the path its plan takes from the
plan's own kernel calls (``Engine.paths``, ``Engine.last_run``), ``generate`` prints it in
its header, and a flag that silently fell back fails here (two runs that took the same
path agree, so a comparison of runs cannot see it). And what the checks exercised: the
mechanism rows of ``mechanisms.mechanisms``, the covering run of ``generate --check`` on the
CPU, the router ties ``check`` counts."""
import pytest
import torch

from onelaunch import tp
from onelaunch.measure import hf_check, mechanisms
from onelaunch.cli import main
from onelaunch.engine import Engine
from onelaunch.kernels import config
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights

SPEC = get_spec("tiny-qwen2")


@pytest.fixture(scope="module")
def w():
    return random_weights(SPEC, 0)


@pytest.mark.parametrize("kw, want", [
    ({}, dict(attention="splitk", persistent=False)),
    ({"attention": "plain"}, dict(attention="plain", persistent=False)),
    ({"persistent": True}, dict(attention="splitk", persistent=True)),
])
def test_engine_reports_the_attention_it_built(w, kw, want):
    e = Engine(SPEC, w, max_ctx=64, **kw)
    assert {k: e.paths[k] for k in want} == want
    assert e.paths["tp"] is None and e.paths["launches"] == len(e.plan)
    words = {"splitk": "split-K attention", "plain": "plain attention"}[want["attention"]]
    assert e.describe().startswith(words) and "one GPU" in e.describe()


@pytest.mark.parametrize("pdl", [True, False])
def test_engine_reports_pdl_from_its_launches(w, monkeypatch, pdl):
    """Where the GPU has PDL (pretended here: no kernel runs, the plan is only traced),
    every launch of the step takes it, or none does."""
    monkeypatch.setattr(config, "pdl_supported", lambda device: True)
    e = Engine(SPEC, w, max_ctx=64, pdl=pdl)
    calls = [c for c in e.trace() if "use_pdl" in c["args"]]
    assert len(calls) == len(e.plan)
    assert e.paths["pdl"] is pdl and ("PDL on" if pdl else "PDL off") in e.describe()


@pytest.mark.parametrize("model", ["tiny-qwen2", "tiny-olmoe"])
@pytest.mark.parametrize("rung, want", [("gloo", "all-reduce"), ("nccl", "all-reduce"),
                                        ("p2p", "p2p"), ("fused", "fused"),
                                        ("none", "none")])
def test_each_tp_rung_reports_how_partial_sums_meet(model, rung, want):
    """Rank 0 of two, built (not run) on the CPU: what its plan does where the ranks'
    partial sums meet. (Without a process group the backend of an all-reduce launch is
    not known: it says all-reduce.)"""
    spec = get_spec(model)
    peers = tp.shared_peers(model, 2) if rung in ("p2p", "fused") else None
    group = tp.Group(0, 2, rung, spec, "cpu", peers=peers)
    e = Engine(tp.shard_spec(spec, 2), tp.shard_weights(spec, random_weights(spec, 0), 0, 2),
               max_ctx=64, tp=group)
    assert e.paths["tp"] == want and "2 ranks" in e.describe()


def test_generate_reports_the_prefill_that_ran(w):
    e = Engine(SPEC, w, max_ctx=64)
    prompt = [5, 400]
    e.generate(prompt, 1, graph=False, batched_prefill=True)
    assert e.last_run == {"prefill": "batched", "first_pos": 1, "last_pos": 1}
    e.generate(prompt, 1, graph=False, batched_prefill=False)
    assert e.last_run == {"prefill": "steps", "first_pos": 0, "last_pos": 1}
    e.generate(prompt[:1], 1, graph=False, batched_prefill=True)  # nothing to prefill
    assert e.last_run["prefill"] == "steps" == e.prefill_mode(1, True)


def test_generate_header_prints_what_ran(capsys):
    rc = main(["generate", "--model", "tiny-qwen2", "--prompt-ids", "5,400", "--tokens", "1",
               "--device", "cpu", "--attention", "plain", "--prefill", "steps", "--no-pdl"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    head = out.out.splitlines()[0]
    assert "plain attention" in head and "PDL off" in head and "one GPU" in head, head
    assert "steps prefill" in head, head


# ---- what the checks exercised --------------------------------------------------------
def test_mechanisms_follow_positions_and_tiles(w):
    """Rows from the plan, its tiles and the live lengths (no kernel runs): a short run
    at the interpreter's tiles reaches one split and one K tile; the covering engine's
    tiles and cap reach the rest at positions 129-130."""
    e = Engine(SPEC, w, max_ctx=70)
    short = {m: ok for m, ok, _ in mechanisms.mechanisms(e, 2, 4)}
    assert not short["several live splits"] and not short["rms_qkv: several K tiles"]
    assert {m: ok for m, ok, _ in mechanisms.mechanisms(e, 64, 65)}["several live splits"]
    c = Engine(SPEC, w, max_ctx=mechanisms.COVER_CTX, cfgs=mechanisms.covering_cfgs(e),
               live_cap=mechanisms.COVER_LIVE_CAP)
    rows = mechanisms.mechanisms(c, mechanisms.COVER_PROMPT - 1, mechanisms.COVER_PROMPT)
    assert all(ok for _, ok, _ in rows), [r for r in rows if not r[1]]
    assert {m for m, _, _ in rows} == set(short)
    assert mechanisms.covering_cfgs(e)["down_residual"]["SPLIT_K"] >= 2


def test_router_ties_are_counted():
    t = hf_check.router_ties([torch.tensor([3.0, 3.0, 1.0, 0.5]),   # a tie inside the top 2
                           torch.tensor([3.0, 2.0, 2.0, 0.5]),   # at the top-2 boundary
                           torch.tensor([4.0, 3.0, 2.0, 1.0])], top_k=2)
    assert t == {"calls": 3, "tied": 2, "boundary": 1, "top_k": 2}


def test_check_counts_the_router_ties_it_saw():
    """``check`` (the oracle against HF) on the MoE model says whether the top-k's tie
    order was reached: one router call per token and layer."""
    r = hf_check.compare_with_hf(get_spec("tiny-olmoe"), tokens=3, prompt_len=4)
    spec = get_spec("tiny-olmoe")
    assert r["ok"] and r["router_ties"]["calls"] == (4 + 3 - 1) * spec.layers
    assert "router ties" in hf_check.format_report(r)
    assert hf_check.compare_with_hf(get_spec("tiny-qwen2"), tokens=2, prompt_len=3)["router_ties"] is None


def test_covering_run_reaches_the_moe_router_ties():
    """The covering run of ``generate --check`` on the MoE model: its seeded prompt is
    one at whose last position the oracle's router ties, and the engine's own router
    logits (read after each router launch) tie there too."""
    spec = get_spec("tiny-olmoe")
    e = Engine(spec, random_weights(spec, 0), max_ctx=64)
    cov = mechanisms.cover(e)
    rows = {m: (ok, how) for m, ok, how in cov["rows"]}
    assert cov["ok"], cov["agree"]
    assert rows["router ties"][0], rows["router ties"]
    assert all(ok for ok, _ in rows.values()), rows
