"""The engine end to end: greedy tokens against the oracle (CPU: Triton's interpreter on
tiny-qwen2), its bad-input errors, the CLI's generate and bench, and (marked gpu) the
full-shape graph engine on the H200."""
import io
import re
import subprocess
import sys

import pytest
import torch

from onelaunch import cli
from onelaunch.engine import Engine, EngineError
from onelaunch.oracle import Oracle
from onelaunch.specs import get_spec
from onelaunch.weights import random_weights

SPEC = get_spec("tiny-qwen2")


@pytest.fixture(scope="module")
def w():
    return random_weights(SPEC, 0)     # bf16, what the kernels read


@pytest.mark.parametrize("attention", ["plain", "splitk"])
def test_engine_matches_oracle(w, attention):
    prompt = torch.randint(0, SPEC.vocab, (5,), generator=torch.Generator().manual_seed(7))
    ref = Oracle(SPEC, w, max_ctx=64).generate(prompt, 3).cpu()
    e = Engine(SPEC, w, max_ctx=64, attention=attention)
    assert e.launches_per_step() == 2 + SPEC.layers * (6 + (attention == "splitk"))
    assert e.launches_per_step() == len(e.plan)
    chunks = []
    got = e.generate(prompt, 3, graph=False, on_tokens=chunks.append, read_every=3)
    assert got.tolist() == ref.tolist()
    assert chunks == [ref[:1].tolist(), ref[1:].tolist()]   # the first at once, then batches
    # teacher-forced: the engine's argmax given the oracle's own prefix, step by step
    assert e.teacher_forced(prompt, ref, graph=False).tolist() == ref.tolist()


def test_engine_rejects_bad_input(w):
    e = Engine(SPEC, w, max_ctx=32)
    with pytest.raises(EngineError, match="out of range"):
        e.check_prompt([1, SPEC.vocab], 2)
    with pytest.raises(EngineError, match="exceeds"):
        e.check_prompt(list(range(30)), 5)
    with pytest.raises(EngineError, match="empty"):
        e.check_prompt([], 5)
    with pytest.raises(EngineError, match="exceeds tiny-qwen2's context"):
        Engine(SPEC, w, max_ctx=SPEC.max_ctx + 1)
    with pytest.raises(EngineError, match="bf16"):
        Engine(SPEC, {k: v.float() for k, v in w.items()})


def test_bench_table_never_prints_a_refused_time():
    rows = [
        {"model": "m", "rung": "fused eager", "ctx": 8, "ms_per_token": 3.0, "floor_ms": 1.0,
         "agree": "4/4"},
        {"model": "m", "rung": "+ split-K", "ctx": 8, "ms_per_token": None, "floor_ms": 1.0,
         "agree": "2/4", "refused": "teacher-forced choices differ at step 2"},
        {"model": "m", "rung": "+ PDL", "ctx": 8, "ms_per_token": 1.5, "floor_ms": 1.0,
         "agree": "3/4", "flips": [{"step": 1, "margin": 0.9, "near_tie_below": 0.125}]},
        {"model": "m", "rung": "graph", "ctx": 8, "ms_per_token": 2.0, "floor_ms": 1.0,
         "agree": "3/4", "flips": [{"step": 1, "margin": 0.0, "near_tie_below": 0.125}]},
    ]
    buf = io.StringIO()
    cli.print_ladder(rows, out=buf)
    lines = buf.getvalue().splitlines()
    assert "3.000" in lines[1] and "pass" in lines[1]
    assert "REFUSED" in lines[2] and "differ at step 2" in lines[2]
    assert "REFUSED" in lines[3] and "1.500" not in lines[3]     # a real flip: no time
    assert "2.000" in lines[4] and "near ties only" in lines[4]


def test_cli_generate_checks_against_the_oracle():
    """generate --check on the CPU: the run's tokens judged by the oracle, and since a
    6-position run at the interpreter's tiles reaches one split and one K tile, the
    covering run (several live splits, a split of several tiles, a shorter last split,
    every GEMV in several row blocks and K tiles, the down projection's K splits),
    judged too; the table says what each run exercised, and nothing is left out."""
    p = subprocess.run([sys.executable, "-m", "onelaunch", "generate", "--model", "tiny-qwen2",
                        "--prompt-len", "3", "--tokens", "3", "--check", "--device", "cpu"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "oracle: 3/3 tokens agree" in p.stdout
    assert "split-K attention, PDL off, one GPU" in p.stdout.splitlines()[0]
    assert "covering run (a seeded 130-id prompt" in p.stdout
    assert "oracle: 2/2 tokens agree" in p.stdout, p.stdout
    rows = {l.split("  ")[1].strip(): l for l in p.stdout.splitlines() if l.startswith("  ")}
    assert "position 129: logits at most" in p.stdout and "OVER" not in p.stdout
    for m in ("several live splits", "a split of several tiles", "a shorter last live split",
              "down_residual: several K tiles", "rms_gate_up_swiglu: several K tiles",
              "lm_head_argmax: several K tiles"):
        assert re.search(r"  no  \(.*\)\s+yes \(", rows[m]), rows[m]   # this run, covering
    assert rows["down: a split over K"].rstrip().endswith("yes (2 splits)")
    assert p.stdout.rstrip().endswith("not exercised: none"), p.stdout


@pytest.mark.parametrize("argv,msg", [
    (["generate", "--model", "tiny-qwen2", "--prompt-len", "300"], "exceeds the context"),
    (["generate", "--model", "tiny-qwen2", "--prompt-ids", "1,99999"], "out of range"),
    (["bench", "--model", "qwen2.5-1.5b", "--device", "cpu"], "interpreter"),
    (["bench", "--model", "nope"], "known models"),
])
def test_cli_bad_input_exits_2(argv, msg, capsys):
    if "--device" not in argv:
        argv = argv + ["--device", "cpu"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and msg in err and "Traceback" not in err


# ---- on the GPU (python -m pytest -m gpu) ---------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_graph_engine_full_shape():
    """Qwen2.5-1.5B at full shape: graph replay gives bit-for-bit the eager step's tokens,
    and the oracle's, but for near ties (listed with their margins)."""
    from onelaunch.measure import ladder
    spec = get_spec("qwen2.5-1.5b")
    w = random_weights(spec, 0, device="cuda")
    rows = ladder.ladder_rows(spec, w, "cuda", ctx=128, tokens=12, iters=10)
    assert [r["rung"] for r in rows][:3] == ["fused eager", "fused + graph", "+ split-K"]
    for r in rows:
        print(r["rung"], r["agree"], r["flips"], r["ms_per_token"])
        assert r["ms_per_token"] is not None, r.get("refused")
    # each step up the ladder keeps the bits (same rounding points, fixed-order
    # reductions), except split-K attention, which sums the softmax in another order
    for r in rows[1:]:
        if r["rung"] != "+ split-K":
            assert r["same_tokens_as_previous_rung"], r["rung"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_long_context_agreement():
    from onelaunch.measure import sweeps
    spec = get_spec("qwen2.5-1.5b")
    w = random_weights(spec, 0, device="cuda")
    r = sweeps.long_context_agreement(spec, w, "cuda", ctx=8192, tokens=12)
    print(r)
    assert r["ok"], r["flips"]          # the agreement rule, at each step's own gap
