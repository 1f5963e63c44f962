"""The peer rungs: HF generate (eager, static cache), the eager oracle, the compiled oracle.

CPU tests use the tiny models in fp32 and take seconds; the ``gpu`` tests run the rungs at
full shape (bf16, ctx 512) and print the ms/token figures (``pytest -m gpu -s``).
"""
import pytest
import torch

from onelaunch.measure import agree
from onelaunch.peers import gpt_fast, hf, launches, oracle_step, rungs
from onelaunch.prompt import random_prompt
from onelaunch.oracle import Oracle
from onelaunch.specs import get_spec
from onelaunch.weights import hf_model, random_weights

ROW_KEYS = {"model", "rung", "ctx", "ms_per_token", "floor_ms", "agree", "read_tbps"}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def qwen_cpu_rows():
    return rungs.peer_rungs(get_spec("tiny-qwen2"), ctx=40, device="cpu", iters=3, new_tokens=12)


def test_rows_have_the_ladder_keys(qwen_cpu_rows):
    # llama.cpp runs on a GPU only: on the CPU it says so in one line and makes no row
    assert [r["rung"] for r in qwen_cpu_rows] == [g for g in rungs.RUNGS
                                                  if g != "llama.cpp"]
    for r in qwen_cpu_rows:
        assert ROW_KEYS <= set(r), r
        assert r["model"] == "tiny-qwen2" and r["ctx"] == 40
        assert r["floor_ms"] is None and r["read_tbps"] is None   # no floor on the CPU
        assert isinstance(r["ms_per_token"], float)


def test_every_rung_agrees_with_the_oracle_on_cpu(qwen_cpu_rows):
    by = {r["rung"]: r for r in qwen_cpu_rows}
    for rung in ("HF eager", "HF static", "oracle compiled"):
        r = by[rung]
        # teacher-forced at every step, and free-running: fp32 against fp32, all agree
        assert (r["agree"], r["agree_free"], r["flips"]) == ("12/12", "12/12", []), rung
        assert "refused" not in r and "teacher-forced" in r["rule"]
    assert by["oracle eager"]["agree"] is None                   # it is the reference
    assert by["oracle compiled"]["graphs"] <= 1                  # one graph for every step
    assert by["HF static"]["graphs_while_timing"] == 0
    assert "cpu smoke" in by["HF static"]["note"] and "cpu smoke" in by["oracle compiled"]["note"]


def test_rows_write_to_the_ladder(qwen_cpu_rows, tmp_path, monkeypatch):
    from onelaunch.report import results
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    p = results.write_ladder([dict(r) for r in qwen_cpu_rows], device="cpu")
    assert p.exists()


@pytest.fixture(scope="module")
def olmoe():
    spec = get_spec("tiny-olmoe")
    w = random_weights(spec, seed=3, device="cpu", dtype=torch.float32)
    return spec, w


@pytest.mark.parametrize("mode", ["eager", "static"])
def test_hf_generate_matches_the_oracle_moe(olmoe, mode):
    spec, w = olmoe
    prompt = random_prompt(spec, 29, 1003)
    ref, margins = oracle_step.oracle_greedy(Oracle(spec, w, max_ctx=64), prompt, 10)
    assert ref.unique().numel() > 2                                # not a repeated token
    ms, ids = hf.hf_generate_ms(spec, w, 29, new_tokens=10, mode=mode, device="cpu",
                                   prompt=prompt, repeats=1, warmup=1)
    assert ids.shape == (10,) and isinstance(ms, float)
    a = agree.agreement(ids, ref)
    assert a.full, (str(a), a.first_flip)
    # teacher-forced along the oracle's tokens, HF chooses the oracle's token at every step
    m = hf_model(spec, w)
    tf = hf.hf_teacher_forced(m, prompt, ref, mode, 29 + 11 if mode == "static" else None)
    assert torch.equal(tf, ref)


def test_oracle_greedy_matches_oracle_generate(olmoe):
    # the chunked prefill (1 token at a time here) gives the tokens of Oracle.generate
    spec, w = olmoe
    o = Oracle(spec, w, max_ctx=64)
    prompt = random_prompt(spec, 21, 1005)
    want = o.generate(prompt, 8)
    got, margins = oracle_step.oracle_greedy(o, prompt, 8)
    assert torch.equal(got, want)
    assert (margins >= 0).all() and margins.shape == (8,)
    # teacher-forced along other tokens: each step's own choice, from the forced prefix
    other = (want + 1) % spec.vocab
    tf, _, logits = oracle_step.oracle_greedy(o, prompt, 8, forced=other, return_logits=True)
    assert tf[0] == want[0] and torch.equal(tf, logits.argmax(-1)) and logits.shape == (8, spec.vocab)
    ref = o.generate(torch.cat([prompt, other[:3]]), 1)                      # the same prefix
    assert tf[3] == ref[0]


def test_compiled_step_gives_the_eager_tokens_moe(olmoe):
    spec, w = olmoe
    o = Oracle(spec, w, max_ctx=64)
    prompt = random_prompt(spec, 30, 1001)
    ref, _ = oracle_step.oracle_greedy(o, prompt, 9)
    step = oracle_step.compiled_oracle_step(o)
    assert step.backend == "aot_eager" and not step.cudagraphs
    g0 = hf.dynamo_graphs()
    ids, _ = oracle_step.compiled_oracle_greedy(o, prompt, 9, step)
    ms = oracle_step.compiled_oracle_step_ms(o, 30, iters=3, device="cpu", step=step)
    assert hf.dynamo_graphs() - g0 <= 1                      # no recompile per position
    assert torch.equal(ids, ref) and ms > 0


def test_oracle_step_ms_rejects_a_position_outside_the_cache(olmoe):
    spec, w = olmoe
    o = Oracle(spec, w, max_ctx=16)
    assert oracle_step.oracle_step_ms(o, 15, iters=2, device="cpu", warmup=1) > 0
    with pytest.raises(ValueError, match="outside"):
        oracle_step.oracle_step_ms(o, 16, iters=2, device="cpu")


def test_count_launches_counts_aten_ops_on_cpu():
    spec = get_spec("tiny-qwen2")
    w = random_weights(spec, device="cpu", dtype=torch.float32)
    o = Oracle(spec, w, max_ctx=32)
    tok, pos = torch.tensor([5]), torch.tensor([7])
    c = launches.count_launches(lambda: o(tok, pos), device="cpu")
    assert c.unit == "aten ops (cpu proxy)" and int(c) == c.count
    # at least the 7 projections per layer and the lm_head are there
    assert c.count >= 7 * spec.layers + 1
    assert c.by_name.get("aten::linear", 0) >= 7 * spec.layers + 1
    m = hf_model(spec, w)
    with torch.no_grad():
        h = launches.count_launches(lambda: m(torch.tensor([[5, 6]])), device="cpu")
    assert h.count > 0 and h.unit == c.unit


def test_agreement_is_a_prefix():
    ref = torch.tensor([1, 2, 3, 4, 5])
    a = agree.agreement(torch.tensor([1, 2, 9, 4, 5]), ref)
    assert (str(a), a.first_flip, a.full) == ("2/5", 2, False)
    b = agree.agreement(ref[:3], ref)
    assert str(b) == "3/3" and b.full and b.first_flip is None


def test_a_peer_that_flips_is_refused_and_not_timed(monkeypatch):
    """A peer is checked like our rungs: teacher-forced, by the agreement rule, and a real
    flip refuses it: no time (the timing is never run), the flip listed with both logits."""
    spec = get_spec("tiny-qwen2")

    def far(model, prompt, forced, mode="eager", max_cache_len=None):
        out = torch.as_tensor(forced).clone()
        out[2] = (out[2] + spec.vocab // 2) % spec.vocab      # a far token at step 2
        return out

    def never(*a, **k):
        raise AssertionError("a refused peer must not be timed")
    monkeypatch.setattr(rungs, "hf_teacher_forced", far)
    monkeypatch.setattr(rungs, "hf_generate_ms", never)
    rows = rungs.peer_rungs(get_spec("tiny-qwen2"), ctx=12, device="cpu", iters=2, new_tokens=5,
                            rungs=("HF eager",))
    r = rows[0]
    assert r["refused"] and r["ms_per_token"] is None and r["x_floor"] is None
    assert r["agree"] == "4/5" and [f["step"] for f in r["flips"]] == [2]
    f = r["flips"][0]
    assert f["verdict"] == "flip" and f["gap"] == f["ref_top"] - f["ref_got"] >= f["threshold"]
    from onelaunch.report.results import row_passes
    assert not row_passes(r)


def test_fast_decode_module_gives_the_oracles_tokens():
    """The gpt-fast peer's module, uncompiled on the CPU (compiling it is the GPU's job:
    fast_decode_rows): fed the oracle's tokens it chooses the oracle's at every step, and
    greedy on its own it generates them."""
    spec = get_spec("tiny-qwen2")
    w = random_weights(spec, seed=2, device="cpu", dtype=torch.float32)
    prompt = random_prompt(spec, 19, 1002)
    ref, _, logits = oracle_step.oracle_greedy(Oracle(spec, w, max_ctx=40), prompt, 10, return_logits=True)
    fast = gpt_fast.FastDecode(spec, w, max_ctx=40)
    tf, _ = oracle_step.oracle_greedy(fast, prompt, 10, forced=ref)
    j = rungs.check_tokens(logits, tf)
    assert j["ok"] and j["agree"] == "10/10"
    assert torch.equal(oracle_step.oracle_greedy(fast, prompt, 10)[0], ref)
    # it captures as one graph with its cache writes (aot_eager: dynamo, no code generation)
    step, g0 = oracle_step.compiled_oracle_step(fast), hf.dynamo_graphs()
    tf, _ = oracle_step.oracle_greedy(fast, prompt, 10, step=step, compiled=True, forced=ref)
    assert torch.equal(tf, ref) and hf.dynamo_graphs() - g0 <= 1
    # the peer's row on the CPU: the same check, one smoke mode, a time, no floor
    r, = gpt_fast.fast_decode_rows(get_spec("tiny-qwen2"), ctx=8, device="cpu", iters=2, new_tokens=3)
    assert r["agree"] == "3/3" and r["ms_per_token"] > 0 and r["floor_ms"] is None
    assert r["kind"] == "peer" and "cpu smoke" in r["note"] and "refused" not in r


@pytest.mark.gpu
@needs_cuda
def test_fast_decode_peer_full_shape():
    rows = gpt_fast.fast_decode_rows(get_spec("qwen2.5-1.5b"), ctx=512, device="cuda", iters=50, new_tokens=64)
    print("\n", rows)
    r = rows[0]
    assert not r.get("refused"), r
    assert r["ms_per_token"] > 0.5 * r["floor_ms"]


def test_peer_rungs_checks_its_arguments():
    with pytest.raises(ValueError, match="max_ctx"):
        rungs.peer_rungs(get_spec("tiny-qwen2"), ctx=250, device="cpu", new_tokens=16)
    with pytest.raises(ValueError, match="unknown rungs"):
        rungs.peer_rungs(get_spec("tiny-qwen2"), ctx=8, device="cpu", rungs=("vllm",))


# ---------------------------------------------------------------------------------------
# GPU: full shapes, bf16, ctx 512
# ---------------------------------------------------------------------------------------
def _check_and_print(rows):
    print()
    for r in rows:
        extra = {k: r[k] for k in ("agree_free", "graphs", "graphs_while_timing", "note",
                                   "refused") if k in r}
        flips = [(f["step"], round(f["gap"], 4), f["verdict"]) for f in r.get("flips") or []]
        print(f"{r['model']:>14} {r['rung']:>16} ctx {r['ctx']}: {r['ms_per_token']} ms/token"
              f"  floor {r['floor_ms']:.3f} ({r['x_floor']}x)  agree {r['agree']} {flips} "
              f"read {r['read_tbps']} TB/s  {extra}")
    # teacher-forced at every step, by the one agreement rule: a real flip refuses a peer
    assert not [r for r in rows if r.get("refused")], "refused peers above"
    for r in rows:
        assert r["ms_per_token"] > 0 and r["floor_ms"] > 0, r
        assert r["ms_per_token"] > 0.5 * r["floor_ms"], r          # nothing beats the floor
    by = {r["rung"]: r for r in rows}
    assert by["oracle compiled"]["graphs"] <= 1
    assert by["HF static"]["graphs_while_timing"] == 0
    assert by["oracle compiled"]["ms_per_token"] < by["oracle eager"]["ms_per_token"]
    assert by["HF static"]["ms_per_token"] < by["HF eager"]["ms_per_token"]


@pytest.mark.gpu
@needs_cuda
def test_peer_rungs_qwen_full_shape():
    rows = rungs.peer_rungs(get_spec("qwen2.5-1.5b"), ctx=512, device="cuda", iters=50, new_tokens=64)
    _check_and_print(rows)


@pytest.mark.gpu
@needs_cuda
def test_peer_rungs_olmoe_full_shape():
    rows = rungs.peer_rungs(get_spec("olmoe-1b-7b"), ctx=512, device="cuda", iters=30, new_tokens=32)
    _check_and_print(rows)


@pytest.mark.gpu
@needs_cuda
def test_count_launches_eager_vs_compiled_on_gpu():
    spec = get_spec("qwen2.5-1.5b")
    w = random_weights(spec, device="cuda", dtype=torch.bfloat16)
    o = Oracle(spec, w, max_ctx=640)
    tok = torch.tensor([5], device="cuda")
    pos = torch.tensor([512], device="cuda")
    eager = launches.count_launches(lambda: o(tok, pos), device="cuda")
    step = oracle_step.compiled_oracle_step(o)

    def one():
        torch.compiler.cudagraph_mark_step_begin()
        step(tok, pos)

    comp = launches.count_launches(one, device="cuda", warmup=3)
    print(f"\neager oracle step: {eager.count} {eager.unit} ({eager.host_launch_calls} launch "
          f"calls, {eager.memops} memcpy/memset); top {eager.by_name}")
    print(f"compiled step: {comp.count} {comp.unit} ({comp.host_launch_calls} launch calls, "
          f"{comp.memops} memcpy/memset)")
    assert eager.unit == "cuda kernels"
    assert eager.count >= 7 * spec.layers + 1                 # at least one GEMV per weight
    assert comp.count > 0


def test_bench_judges_peers_and_rungs_on_one_prompt_one_oracle_one_bandwidth(monkeypatch):
    """``bench``'s run (``peers.bench.bench_rows``): the peer rows and the rung rows name the
    same prompt (the one of ``--seed``), every check is against ONE oracle run, and every
    row's floor, ratio and bandwidth come from ONE bandwidth (here given: no GPU)."""
    from onelaunch.measure import agree
    from onelaunch.peers import bench
    from onelaunch.prompt import prompt_digest
    spec = get_spec("tiny-qwen2")
    w = random_weights(spec, 0)                      # bf16: what the kernels read
    runs, greedy = [], []
    oracle_tokens = agree.oracle_tokens
    monkeypatch.setattr(agree, "oracle_tokens", lambda *a: runs.append(a) or oracle_tokens(*a))
    og = rungs.oracle_greedy
    monkeypatch.setattr(rungs, "oracle_greedy",
                        lambda *a, **k: greedy.append(k) or og(*a, **k))
    bw, ctx, seed = 1.5, 6, 3
    rows = bench.bench_rows(spec, w, "cpu", ctx=ctx, tokens=2, iters=1, seed=seed,
                            read_tbps=bw, peers=("HF eager", "oracle eager"),
                            peer_tokens=2, rungs=("fused eager",))
    assert [r["rung"] for r in rows] == ["HF eager", "oracle eager", "fused eager"]
    assert len(runs) == 1 and not [k for k in greedy if k.get("return_logits")]
    assert {r["prompt"] for r in rows} == {prompt_digest(random_prompt(spec, ctx, seed))}
    floor = spec.floor_ms(bw, ctx)
    for r in rows:
        assert r["read_tbps"] == bw and r["floor_ms"] == pytest.approx(floor, abs=5e-5)
        assert r["x_floor"] == pytest.approx(r["ms_per_token"] / floor, 1e-2), r["rung"]
        assert r["agree"] in (None, "2/2"), r


def test_bench_runs_the_gpt_fast_peer_on_its_one_oracle_run(monkeypatch):
    """``bench``'s peers include the strongest compiled one (gpt-fast's step) for a dense
    model, on the run's prompt and its one oracle run; a MoE model has no such row."""
    from onelaunch.measure import agree
    from onelaunch.peers import bench, gpt_fast
    from onelaunch.prompt import prompt_digest
    runs = []
    oracle_tokens = agree.oracle_tokens
    monkeypatch.setattr(agree, "oracle_tokens", lambda *a: runs.append(a) or oracle_tokens(*a))
    monkeypatch.setattr(gpt_fast, "oracle_greedy", lambda *a, **k: (
        runs.append(k) if k.get("return_logits") else None) or og(*a, **k))
    og = rungs.oracle_greedy
    spec, ctx, seed = get_spec("tiny-qwen2"), 6, 3
    rows = bench.bench_rows(spec, random_weights(spec, 0), "cpu", ctx=ctx, tokens=2,
                            iters=1, seed=seed, read_tbps=1.5, peers=(gpt_fast.NAME,),
                            peer_tokens=2, rungs=())
    assert [r["rung"] for r in rows] == [gpt_fast.NAME]
    assert len(runs) == 1                      # bench's oracle run, not one of its own
    assert rows[0]["prompt"] == prompt_digest(random_prompt(spec, ctx, seed))
    assert rows[0]["agree"] == "2/2" and rows[0]["ms_per_token"] > 0
    moe = get_spec("tiny-olmoe")
    assert bench.bench_rows(moe, random_weights(moe, 0), "cpu", ctx=ctx, tokens=2, iters=1,
                            seed=seed, read_tbps=1.5, peers=(gpt_fast.NAME,),
                            peer_tokens=2, rungs=()) == []
