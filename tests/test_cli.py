"""The command line. A few runs go through ``python -m onelaunch`` in a subprocess (the
real entry point, exit status and streams); the rest call ``cli.main`` in-process, which
is the same code without a 5-second interpreter start each."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from onelaunch.cli import main
from onelaunch.specs import SPECS

ROOT = Path(__file__).resolve().parent.parent


def run(*args):
    return subprocess.run([sys.executable, "-m", "onelaunch", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def one_error_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmoe"])
def test_check_passes(name):
    p = run("check", "--model", name, "--prompt-len", "5")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "12/12" in p.stdout and "PASS" in p.stdout


def test_unknown_model():
    p = run("check", "--model", "llama-3-8b")
    assert p.returncode == 2 and p.stdout == ""
    line = one_error_line(p.stderr)
    assert all(name in line for name in SPECS)


def _main(capsys, *args):
    rc = main(list(args))
    return rc, capsys.readouterr()


@pytest.mark.parametrize("args, words", [
    (["--prompt-len", "300"], "exceeds the context"),
    (["--prompt-len", "250", "--tokens", "7"], "exceeds the context"),
    (["--prompt-ids", "1,2,997"], "out of range"),
    (["--prompt-ids", "1,-3"], "has id -3"),
    (["--prompt-ids", "1,two"], "comma-separated"),
    (["--prompt-len", "0"], "at least 1"),
    (["--tokens", "many"], "invalid int"),
    (["--device", "tpu"], "invalid choice"),
])
def test_check_bad_input(capsys, args, words):
    rc, out = _main(capsys, "check", "--model", "tiny-qwen2", *args)
    assert rc == 2 and words in one_error_line(out.err)


def test_check_needs_a_model(capsys):
    rc, out = _main(capsys, "check")
    assert rc == 2 and "--model" in one_error_line(out.err)


def test_cuda_without_gpu(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, out = _main(capsys, "check", "--model", "tiny-qwen2", "--device", "cuda")
    assert rc == 2 and "--device cpu" in one_error_line(out.err)


def test_disagreement_exits_1(capsys, monkeypatch):
    import onelaunch.oracle as oracle_mod
    monkeypatch.setattr(oracle_mod, "apply_rope", lambda x, cos, sin: x)
    rc, out = _main(capsys, "check", "--model", "tiny-qwen2")
    assert rc == 1 and "FAIL" in out.out and "HF margin" in out.out


def test_info_with_bandwidth(capsys):
    rc, out = _main(capsys, "info", "--model", "qwen2.5-1.5b", "--bandwidth", "4.0")
    assert rc == 0
    assert "1,543,714,304" in out.out and "3.087 GB" in out.out and "28 KiB" in out.out
    assert "0.772 ms/token at 4.00 TB/s" in out.out          # 3.087 GB / 4 TB/s


def test_info_ctx_adds_kv(capsys):
    rc, out = _main(capsys, "info", "--model", "olmoe-1b-7b", "--bandwidth", "4", "--ctx", "1024")
    assert rc == 0 and "1,178,994,688" in out.out
    floor = 2 * 1_178_994_688 / 4e12 * 1e3 + 1024 * 128 * 1024 / 4e12 * 1e3
    assert f"{floor:.3f} ms/token" in out.out


def test_info_without_gpu_asks_for_bandwidth(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc, out = _main(capsys, "info", "--model", "tiny-olmoe")
    assert rc == 2 and "--bandwidth" in one_error_line(out.err)


@pytest.mark.parametrize("args", [["--bandwidth", "0"], ["--ctx", "-1"], ["--ctx", "999999"]])
def test_info_bad_input(capsys, args):
    rc, out = _main(capsys, "info", "--model", "tiny-qwen2", *args)
    assert rc == 2 and one_error_line(out.err)


def test_no_command(capsys):
    rc, out = _main(capsys)
    assert rc == 2 and "check" in out.err


# ---- generate: real checkpoints, text in and out ------------------------------------------
@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Tiny checkpoints with a tokenizer: tiny-qwen2 with a chat template, tiny-olmoe
    without one, and a tiny-qwen2 with no tokenizer files at all."""
    from test_text import tiny_checkpoint
    out = {}
    for key, name, kw in [("qwen", "tiny-qwen2", {}), ("olmoe", "tiny-olmoe", {"chat": False}),
                          ("bare", "tiny-qwen2", {"tokenizer": False})]:
        out[key] = tmp_path_factory.mktemp(key)
        tiny_checkpoint(name, out[key], **kw)
    return out


def _between_rules(out: str) -> str:
    return out.split("-" * 8 + "\n", 1)[1].rsplit("\n" + "-" * 8 + "\n", 1)[0]


# The prompts are ones whose first 4 steps hold no near tie on these random tiny weights:
# the text is compared with the oracle's free-running greedy decode, which a near tie
# (the rule itself is tested in test_gates.py) would legitimately change. Tiny random MoE
# weights have many (the OLMoE case found a 1-ulp tie at step 0 with the qwen prompt).
@pytest.mark.parametrize("key, chat, text", [("qwen", True, "中文 wörld ab"),
                                             ("olmoe", False, "中文 ab wörld xy")])
def test_generate_text_round_trip(capsys, ckpts, key, chat, text):
    """Prompt text -> the checkpoint's tokenizer -> ids -> the engine (batched prefill) ->
    streamed text: equal to decoding the oracle's greedy ids (up to a stop token)."""
    from onelaunch.oracle import Oracle
    from onelaunch.text import TextStream, encode, load_tokenizer, stop_ids
    from onelaunch.checkpoint import load_checkpoint
    folder = str(ckpts[key])
    rc, out = _main(capsys, "generate", "--checkpoint", folder, "--prompt", text,
                    *(["--chat"] if chat else []), "--tokens", "4", "--device", "cpu", "--check")
    if rc == 2 and "mixture of experts" in out.err:
        pytest.skip("the engine runs the dense family only, so far")
    assert rc == 0, out.err
    tok = load_tokenizer(folder)
    spec, w = load_checkpoint(folder)
    prompt = torch.tensor(encode(tok, text, chat=chat))
    ref = Oracle(spec, w, max_ctx=64).generate(prompt, 4).tolist()
    s = TextStream(tok, stop_ids(tok, folder))
    assert _between_rules(out.out) == s.push(ref) + s.flush()
    assert f"prompt {prompt.numel()} ids" in out.out and "time to first token" in out.out
    assert "ms/token over" in out.out or "a stop token" in out.out
    assert "tokens agree" in out.out and "first difference" not in out.out


def test_generate_batched_and_step_prefill_agree(capsys):
    got = {}
    for mode in ("batched", "steps"):
        rc, out = _main(capsys, "generate", "--model", "tiny-qwen2", "--prompt-ids", "5,400,17",
                        "--tokens", "1", "--device", "cpu", "--prefill", mode, "--no-pdl")
        assert rc == 0, out.err
        # the header says what the plan will run; the last line what ran (Engine.last_run)
        assert f"{mode} prefill" in out.out.splitlines()[0], out.out
        assert f"(3-token prompt, {mode} prefill" in out.out.splitlines()[-1], out.out
        got[mode] = [l for l in out.out.splitlines() if l.startswith("ids:")]
    assert got["batched"] == got["steps"] and len(got["steps"][0].split()) == 2


def test_pdl_is_on_by_default():
    from onelaunch.cli import build_parser
    parse = lambda *a: build_parser().parse_args(["generate", "--model", "tiny-qwen2", *a])
    assert parse().pdl and parse("--pdl").pdl and not parse("--no-pdl").pdl
    assert parse().prefill == "batched" and parse().tokens is None


@pytest.mark.parametrize("args, words", [
    (["--prompt", "hi", "--prompt-ids", "1,2"], "not both"),
    (["--chat", "--prompt-ids", "1,2"], "add --prompt"),
    (["--model", "tiny-qwen2", "--prompt", "hi"], "add --checkpoint PATH"),
    (["--prompt", "hi", "--tokens", "0"], "at least 1"),
    ([], "--model NAME or --checkpoint PATH"),
])
def test_generate_bad_input(capsys, ckpts, args, words):
    if "--prompt" in args and "--model" not in args:
        args = ["--checkpoint", str(ckpts["qwen"])] + args
    rc, out = _main(capsys, "generate", "--device", "cpu", *args)
    assert rc == 2 and words in one_error_line(out.err)


@pytest.mark.parametrize("key, args, words", [
    ("bare", ["--prompt", "hi"], "no tokenizer files"),
    ("olmoe", ["--prompt", "hi", "--chat"], "drop --chat"),
])
def test_generate_bad_checkpoint_for_text(capsys, ckpts, key, args, words):
    rc, out = _main(capsys, "generate", "--checkpoint", str(ckpts[key]), "--device", "cpu", *args)
    assert rc == 2 and words in one_error_line(out.err)


# ---- bench: one parser, --what folded in ---------------------------------------------------
@pytest.mark.parametrize("args, words", [
    (["--what", "nope"], "unknown 'nope'"),
    (["--what", "ops,,sweep"], "empty item"),
    (["--what", "sweep", "--write-table"], "add --what sweepcfg"),
    (["--what", "sweepcfg", "--write-table"], "run it on a GPU"),
    (["--no-peers", "--peers", "llama.cpp"], "not both"),
    (["--peers", "llama.cp"], "unknown --peers 'llama.cp'"),
    (["--what", "ladder", "--peers", "llama.cpp"], "add peers to --what"),
    (["--what", "peers", "--no-peers"], "nothing to measure"),
    (["--tp", "2", "--what", "ops"], "leave out --what"),
])
def test_bench_bad_input_before_weights(capsys, monkeypatch, args, words):
    import onelaunch.weights

    def boom(*a, **k):
        raise AssertionError("weights were read before the input was validated")
    monkeypatch.setattr(onelaunch.weights, "random_weights", boom)
    rc, out = _main(capsys, "bench", "--model", "tiny-qwen2", "--device", "cpu", *args)
    assert rc == 2 and words in one_error_line(out.err)


def test_bench_runs_what_it_names_in_order(capsys, monkeypatch, tmp_path):
    """--what ops,long,sweep: each measurement once, in the run's order, every row printed
    and written under its key; a failed verdict fails the run."""
    from onelaunch.cli import bench
    asked = []

    def fake(key, *a):
        asked.append(key)
        return {"ok": False, "agree": "1/2"} if key == "long" else [{"op": key, "us": 1.0}]
    monkeypatch.setattr(bench, "_measure", fake)
    out_json = tmp_path / "b.json"
    rc, out = _main(capsys, "bench", "--model", "tiny-qwen2", "--device", "cpu", "--ctx", "8",
                    "--what", "long,ops,sweep", "--json", str(out_json))
    assert asked == ["ops", "sweep", "long"] and rc == 1 and "FAILED: 1 row" in out.err
    import json
    got = json.loads(out_json.read_text())
    assert got["ops"] == [{"op": "ops", "us": 1.0}] and got["long"]["ok"] is False
    assert '{"op": "sweep", "us": 1.0}' in out.out and "peers" not in got


def test_python_m_onelaunch_bench_is_the_same_parser():
    p = subprocess.run([sys.executable, "-m", "onelaunch.bench", "--model", "tiny-qwen2",
                        "--device", "cpu", "--what", "nope"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 2 and "unknown 'nope'" in one_error_line(p.stderr)
    assert "python -m onelaunch bench --help" in p.stderr


# ---- generate --megakernel: the one launch on Hopper, the chain elsewhere ----------------
GEN_TINY = ["generate", "--model", "tiny-qwen2", "--prompt-ids", "5,400", "--tokens", "1",
            "--device", "cpu", "--prefill", "steps", "--no-pdl"]


def test_generate_megakernel_off_hopper_runs_the_chain(capsys):
    """On the CPU: one line says the chain runs instead, the header says which path ran,
    and the tokens are the chain's."""
    rc, out = _main(capsys, *GEN_TINY, "--megakernel")
    assert rc == 0, out.err
    from onelaunch.cli.generate import MEGAKERNEL_NOTE
    assert [l for l in out.err.splitlines() if l.startswith("note:")] == [MEGAKERNEL_NOTE]
    head = out.out.splitlines()[0]
    assert "a chain of 16 launches a step" in head and "megakernel" not in head
    rc, plain = _main(capsys, *GEN_TINY)
    ids = lambda o: [l for l in o.out.splitlines() if l.startswith("ids:")]
    assert rc == 0 and ids(plain) == ids(out) and "note:" not in plain.err


class _Reached(Exception):
    """The engine was asked for: its keyword arguments."""


@pytest.mark.parametrize("flag, want", [(["--megakernel"], True), ([], False)])
def test_generate_megakernel_reaches_the_engine_on_hopper(capsys, monkeypatch, flag, want):
    """With the capability check saying Hopper (mocked: nothing runs), --megakernel asks
    the engine for the one launch; without it, for the chain."""
    import onelaunch.engine
    import onelaunch.megakernel.step as mk

    def engine(*a, **kw):
        raise _Reached(kw)
    monkeypatch.setattr(mk, "device_refusal", lambda device: None)
    monkeypatch.setattr(mk, "refusal", lambda spec, max_ctx=None: None)
    monkeypatch.setattr(onelaunch.engine, "Engine", engine)
    with pytest.raises(_Reached) as got:
        main([*GEN_TINY, *flag])
    assert got.value.args[0]["megakernel"] is want
    assert "note:" not in capsys.readouterr().err


@pytest.mark.parametrize("args, words, hopper", [
    (["--megakernel", "--attention", "plain"], "leave out --tp and --attention plain", False),
    (["--megakernel", "--tp", "2"], "leave out --tp", False),
    (["--megakernel"], "--megakernel: the one-launch step needs hidden", True),
])
def test_generate_megakernel_refusals_before_weights(capsys, monkeypatch, args, words, hopper):
    import onelaunch.megakernel.step as mk
    import onelaunch.weights

    def boom(*a, **k):
        raise AssertionError("weights were read before the input was validated")
    monkeypatch.setattr(onelaunch.weights, "random_weights", boom)
    if hopper:                    # the tiny model's shapes, refused on a (mocked) Hopper
        monkeypatch.setattr(mk, "device_refusal", lambda device: None)
    rc, out = _main(capsys, *GEN_TINY, *args)
    assert rc == 2 and words in one_error_line(out.err)
