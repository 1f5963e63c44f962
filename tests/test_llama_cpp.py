"""The llama.cpp peer on the CPU: the GGUF writer at the tiny specs' shapes, read back
with gguf-py's own reader (names, shapes, types, values, metadata, bytes), llama-bench's
JSON parsed (a hand-written parser fixture, tests/fixtures/README.md), and the peer's
one line where the binary is missing. The build and the timing run on the GPU host
(``bash ci/gpu_run.sh llama``)."""
import json
from pathlib import Path

import pytest
import torch

from onelaunch.specs import get_spec
from onelaunch.weights import random_weights

gguf = pytest.importorskip("gguf")
from onelaunch.peers import llama_cpp, llama_cpp_gguf  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "llama_bench_parser_fixture.json"


@pytest.fixture(scope="module", params=["tiny-qwen2", "tiny-olmoe"])
def written(request, tmp_path_factory):
    spec = get_spec(request.param)
    w = random_weights(spec, seed=5)                               # bf16, as on the GPU
    path = tmp_path_factory.mktemp("gguf") / f"{spec.name}.gguf"
    info = llama_cpp_gguf.write_gguf(spec, w, path, seed=5)
    return spec, w, info, gguf.GGUFReader(path)


def _expected_names(spec):
    names = ["token_embd.weight", "output_norm.weight"]
    names += [] if spec.tie_embeddings else ["output.weight"]
    per = ["attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm"]
    per += ["attn_q.bias", "attn_k.bias", "attn_v.bias"] if spec.qkv_bias else []
    per += ["attn_q_norm", "attn_k_norm"] if spec.qk_norm else []
    per += (["ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
            if spec.is_moe else ["ffn_gate", "ffn_up", "ffn_down"])
    for i in range(spec.layers):
        names += [f"blk.{i}.{p}" + ("" if p.endswith(".bias") else ".weight")
                  for p in per]
    return sorted(names)


def test_names_are_llama_cpps(written):
    spec, _, _, r = written
    assert sorted(t.name for t in r.tensors) == _expected_names(spec)


def test_shapes_types_and_values(written):
    spec, w, _, r = written
    t = {x.name: x for x in r.tensors}
    H, I, V = spec.hidden, spec.intermediate, spec.vocab
    # ggml's shape is the numpy shape reversed: {in, out}
    assert list(t["token_embd.weight"].shape) == [H, V]
    assert list(t["blk.1.attn_k.weight"].shape) == [H, spec.kv_size]
    assert t["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.BF16
    assert t["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    emb = torch.from_numpy(t["token_embd.weight"].data.copy())
    emb = emb.view(torch.bfloat16).view(V, H)
    assert torch.equal(emb, w["model.embed_tokens.weight"])              # the same bits
    norm = torch.from_numpy(t["blk.1.ffn_norm.weight"].data.copy())
    ref = w["model.layers.1.post_attention_layernorm.weight"].float()
    assert torch.equal(norm, ref)
    if spec.is_moe:
        E = spec.experts
        assert list(t["blk.0.ffn_gate_exps.weight"].shape) == [H, I, E]
        assert list(t["blk.0.ffn_down_exps.weight"].shape) == [I, H, E]
        assert list(t["blk.0.ffn_gate_inp.weight"].shape) == [H, E]
        router = t["blk.0.ffn_gate_inp.weight"]
        assert router.tensor_type == gguf.GGMLQuantizationType.F32
        gu = w["model.layers.1.mlp.experts.gate_up_proj"]           # [E, 2I, H]
        for name, half in (("ffn_gate_exps", gu[:, :I]), ("ffn_up_exps", gu[:, I:])):
            got = torch.from_numpy(t[f"blk.1.{name}.weight"].data.copy())
            assert torch.equal(got.view(torch.bfloat16).view(E, I, H), half), name
        assert not torch.equal(gu[:, :I], gu[:, I:])     # the halves differ
        got = torch.from_numpy(t["blk.1.ffn_down_exps.weight"].data.copy())
        want = w["model.layers.1.mlp.experts.down_proj"]            # [E, H, I]
        assert torch.equal(got.view(torch.bfloat16).view(E, H, I), want)
        # OLMoE's q/k norm is over all heads: one f32 weight of q_size and of kv_size
        for name, key, n in (("attn_q_norm", "q_norm", spec.q_size),
                             ("attn_k_norm", "k_norm", spec.kv_size)):
            x = t[f"blk.1.{name}.weight"]
            assert list(x.shape) == [n] and x.tensor_type == gguf.GGMLQuantizationType.F32
            ref = w[f"model.layers.1.self_attn.{key}.weight"].float()
            assert torch.equal(torch.from_numpy(x.data.copy()), ref), name
    else:
        assert list(t["blk.0.ffn_down.weight"].shape) == [I, H]
        assert list(t["blk.0.attn_q.bias"].shape) == [spec.q_size]


def test_metadata(written):
    spec, _, _, r = written
    a = llama_cpp_gguf.arch(spec)
    f = {k: v.contents() for k, v in r.fields.items()}
    assert f["general.architecture"] == a and f["general.file_type"] == 32      # bf16
    assert (f[f"{a}.block_count"], f[f"{a}.embedding_length"],
            f[f"{a}.feed_forward_length"]) == (spec.layers, spec.hidden,
                                               spec.intermediate)
    assert (f[f"{a}.attention.head_count"], f[f"{a}.attention.head_count_kv"],
            f[f"{a}.attention.key_length"]) == (spec.heads, spec.kv_heads,
                                                spec.head_dim)
    assert f[f"{a}.rope.freq_base"] == pytest.approx(spec.rope_theta)
    assert f[f"{a}.attention.layer_norm_rms_epsilon"] == pytest.approx(spec.rms_eps)
    if spec.is_moe:
        assert (f[f"{a}.expert_count"], f[f"{a}.expert_used_count"]) == (spec.experts,
                                                                         spec.top_k)
    tokens = f["tokenizer.ggml.tokens"]
    assert len(tokens) == spec.vocab == len(set(tokens))       # the embedding's rows
    assert f["tokenizer.ggml.model"] == "llama"
    assert f["tokenizer.ggml.bos_token_id"] == 1


def test_bytes_are_the_floors_plus_the_f32_tensors(written):
    """One step reads the spec's bf16 bytes, except the tensors kept in f32 (norms,
    biases, router), which weigh twice: counted from the file, not from the spec."""
    spec, w, info, _ = written
    f32_extra = sum(t.numel() * 2 for n, t in llama_cpp_gguf.gguf_tensors(spec, w)
                    if llama_cpp_gguf.is_f32(n, t))
    assert info["bytes_per_token"] == spec.weight_bytes_per_token + f32_extra
    if spec.is_moe:
        assert info["file_tensor_bytes"] > info["bytes_per_token"]      # idle experts


def _known_names(arch: str) -> set[str]:
    """The tensor names gguf-py lists for llama.cpp's architecture ``arch``."""
    a = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    return {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[a]}


@pytest.mark.parametrize("name", ["qwen2.5-1.5b", "olmoe-1b-7b"])
def test_the_book_models_layout(name):
    """The GGUF of the book's own models, laid out as the writer would (meta tensors: no
    bytes, no 14 GB file): every tensor a name llama.cpp's architecture knows, at the
    shape its loader asks for, and a vocabulary of the embedding's rows."""
    from onelaunch.weights import hf_param_shapes
    spec = get_spec(name)
    w = {n: torch.empty(s, dtype=torch.bfloat16, device="meta")
         for n, s in hf_param_shapes(spec).items()}
    got = dict(llama_cpp_gguf.gguf_tensors(spec, w))
    known = _known_names(llama_cpp_gguf.arch(spec))
    base = lambda n: n.rsplit(".", 1)[0].replace("blk.0.", "blk.{bid}.")
    assert {base(n) for n in got if not n.startswith("blk.") or n.startswith("blk.0.")} \
        <= known
    assert sorted(got) == _expected_names(spec)
    H, I = spec.hidden, spec.intermediate
    assert tuple(got["token_embd.weight"].shape) == (spec.vocab, H)
    if spec.is_moe:
        E, last = spec.experts, f"blk.{spec.layers - 1}."
        assert tuple(got[last + "ffn_gate_exps.weight"].shape) == (E, I, H)
        assert tuple(got[last + "ffn_up_exps.weight"].shape) == (E, I, H)
        assert tuple(got[last + "ffn_down_exps.weight"].shape) == (E, H, I)
        assert tuple(got[last + "ffn_gate_inp.weight"].shape) == (E, H)
        assert tuple(got[last + "attn_q_norm.weight"].shape) == (spec.q_size,)
        assert tuple(got[last + "attn_k_norm.weight"].shape) == (spec.kv_size,)
        assert tuple(got["output.weight"].shape) == (spec.vocab, H)
    pieces, _, types = llama_cpp_gguf.vocabulary(spec.vocab)
    assert len(pieces) == len(set(pieces)) == len(types) == spec.vocab


def test_weights_digest_tells_weights_apart():
    spec = get_spec("tiny-qwen2")
    a, b = random_weights(spec, seed=1), random_weights(spec, seed=2)
    assert llama_cpp.weights_digest(a) == llama_cpp.weights_digest(dict(a))
    assert llama_cpp.weights_digest(a) != llama_cpp.weights_digest(b)


def test_command_is_what_users_run():
    cmd = llama_cpp.bench_command("llama-bench", "m.gguf", depth=512)
    assert " ".join(cmd[1:]) == "-m m.gguf -ngl 99 -p 0 -n 128 -d 512 -fa 1 -o json"


def test_parse_the_parser_fixture():
    b = llama_cpp.parse_bench(FIXTURE.read_text())
    # samples 320, 280, 300, 310, 290 ms for 128 tokens
    assert b["ms_per_token"] == pytest.approx(300 / 128)
    assert b["ms_min"] == pytest.approx(280 / 128)
    assert b["ms_max"] == pytest.approx(320 / 128)
    assert b["timed"] == 5 and (b["n_gen"], b["n_depth"]) == (128, 512)
    assert b["llama_avg_ms"] == pytest.approx(300 / 128)
    assert b["llama_std_ms"] == pytest.approx(15.811388 / 128)


def test_parse_refuses_other_tests():
    t = json.loads(FIXTURE.read_text())
    with pytest.raises(ValueError):
        llama_cpp.parse_bench(json.dumps(t + t))                  # two tests
    with pytest.raises(ValueError):
        llama_cpp.parse_bench(json.dumps([{**t[0], "n_prompt": 512}]))   # a prompt test


def test_missing_binary_is_one_line_and_no_row(tmp_path, capsys):
    from onelaunch.peers import rungs
    assert "llama.cpp" in rungs.PEERS                                  # bench's default
    peer = llama_cpp.LlamaBench(binary=tmp_path / "llama-bench")
    assert peer.measure(_run("cuda"), peer.tokens(2, 2)) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ci/llama_build.sh" in err[0]


def _run(device, spec="tiny-qwen2"):
    """A PeerRun as peer_rungs builds it, without the oracle (llama.cpp needs none)."""
    from onelaunch.peers import rungs
    spec = get_spec(spec)
    w = random_weights(spec, seed=2)
    ids = torch.zeros(1, dtype=torch.long)
    return rungs.PeerRun(spec, w, device, 8, 1, 2, torch.arange(8), ids,
                         torch.zeros(1, spec.vocab), None, 4.0, None)


def test_a_run_through_a_stand_in_binary(tmp_path, capsys):
    """The whole peer with a stand-in for llama-bench that prints the parser fixture:
    the GGUF of the run's weights is written once, the command is the users' one, and
    the row carries the fixture's times, the GGUF's bytes and the label."""
    log = tmp_path / "args"
    fake = tmp_path / "llama-bench"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {log}\ncat {FIXTURE}\n")
    fake.chmod(0o755)
    peer = llama_cpp.LlamaBench(binary=fake, gguf_dir=tmp_path / "gguf")
    run = _run("cuda")                       # a device name only: nothing runs on it
    r = peer.measure(run, peer.tokens(32, 32))
    args = log.read_text().split()
    assert args[args.index("-n") + 1] == "128" and args[args.index("-d") + 1] == "8"
    gguf_file = Path(args[args.index("-m") + 1])
    assert gguf_file.parent == tmp_path / "gguf" and gguf_file.exists()
    assert r["ms_per_token"] == pytest.approx(300 / 128, abs=1e-4)
    assert r["x_floor"] == pytest.approx(r["ms_per_token"] / run.floor, rel=1e-3)
    assert (r["ms_min"], r["ms_max"], r["timed"]) == (round(280 / 128, 4),
                                                     round(320 / 128, 4), 5)
    assert r["agree"] is None and r["unchecked"] and r["peer"]
    assert "no oracle check possible" in r["note"]
    assert r["gguf_bytes_per_token"] > run.spec.weight_bytes_per_token
    mtime = gguf_file.stat().st_mtime_ns
    peer.measure(run, 128)                        # same weights: the same file, reused
    assert gguf_file.stat().st_mtime_ns == mtime


def test_the_chapters_sentence(tmp_path):
    """Chapters 6 and 8 say the same of their llama.cpp row: its time, that the time is
    llama-bench's own and that no oracle check is possible; else why it has none."""
    row = {"rung": llama_cpp.NAME, "ms_per_token": 1.234, "ms_min": 1.2, "ms_max": 1.3,
           "timed": 5, "x_floor": 1.5, "agree": None}
    s = llama_cpp.sentence(row, "cuda")
    assert s.startswith("llama.cpp's llama-bench takes 1.234 ms a token (1.2–1.3 over "
                        "its 5 repeats; 1.50 times the floor) on a GGUF of the same "
                        "weights, by its own timing")
    assert "no oracle check of its text is possible" in s and ". " not in s
    assert not s.endswith(".")                       # the prose puts the period
    assert "GPU only" in llama_cpp.sentence(None, "cpu")
    assert "not built" in llama_cpp.sentence(None, "cuda", binary=tmp_path / "none")
    failed = dict(row, ms_per_token=None, error="llama-bench exited 1: oom\nmore")
    assert llama_cpp.sentence(failed, "cuda") == \
        "llama.cpp gave no time in this run: llama-bench exited 1: oom"
