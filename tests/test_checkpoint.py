"""Real checkpoints: a tiny one written with Hugging Face's ``save_pretrained``
(safetensors) loads back to the same tensors and the same oracle logits; a checkpoint
that does not fit fails with a :class:`CheckpointError` that says why."""
import dataclasses
import json
import shutil

import pytest
import torch

from onelaunch.cli import main
from onelaunch.oracle import Oracle
from onelaunch.specs import get_spec
from onelaunch.checkpoint import CheckpointError, inspect_checkpoint, load_checkpoint
from onelaunch.weights import hf_model, random_weights


def _save(spec, folder, seed=0):
    w = random_weights(spec, seed=seed, dtype=torch.float32)
    hf_model(spec, w).save_pretrained(folder)        # safetensors by default
    return w


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{name: (folder, weights)} for both tiny models."""
    out = {}
    for name in ["tiny-qwen2", "tiny-olmoe"]:
        folder = tmp_path_factory.mktemp(name)
        out[name] = folder, _save(get_spec(name), folder, seed=2)
    return out


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmoe"])
def test_roundtrip_same_tensors_same_logits(saved, name):
    folder, w = saved[name]
    assert list(folder.glob("*.safetensors"))
    spec, loaded = load_checkpoint(str(folder), name, dtype=torch.float32)
    assert spec.name == name and loaded.keys() == w.keys()
    for k in w:
        assert torch.equal(loaded[k], w[k]), k
        # torch's own memory, not a view into the mmap-ed file: there a tensor sits at
        # an offset aligned to 8 bytes only, and the CPU's matmul rounds differently on
        # an address not 64-byte aligned (which CPUs do depends on the BLAS's code path)
        assert loaded[k].data_ptr() % 64 == 0, k
    prompt = torch.tensor([3, 1, 4, 1, 5])
    a_ids, a = Oracle(spec, w).generate(prompt, 6, return_logits=True)
    b_ids, b = Oracle(spec, loaded).generate(prompt, 6, return_logits=True)
    assert torch.equal(a_ids, b_ids) and torch.equal(a, b)


@pytest.mark.parametrize("name", ["tiny-qwen2", "tiny-olmoe"])
def test_spec_inferred_from_shapes(saved, name):
    spec, _ = load_checkpoint(str(saved[name][0]))
    assert spec.name == name


def test_bf16_load_is_exact(saved):
    folder, w = saved["tiny-olmoe"]
    _, loaded = load_checkpoint(str(folder), "tiny-olmoe")
    assert all(t.dtype == torch.bfloat16 for t in loaded.values())
    assert all(torch.equal(loaded[k].float(), w[k]) for k in w)  # values are bf16 already


def test_wrong_architecture(saved):
    with pytest.raises(CheckpointError, match="is a olmoe checkpoint, but tiny-qwen2 is qwen2"):
        load_checkpoint(str(saved["tiny-olmoe"][0]), "tiny-qwen2")


def test_wrong_shapes(tmp_path):
    other = dataclasses.replace(get_spec("tiny-qwen2"), name="tiny-qwen2-wide", intermediate=104)
    _save(other, tmp_path)
    for spec in ("tiny-qwen2", None):   # given, or the one of the same width, depth and vocab
        with pytest.raises(CheckpointError,
                           match="intermediate_size is 104 there, 200 in tiny-qwen2"):
            load_checkpoint(str(tmp_path), spec)


def _no_weights(monkeypatch):
    import transformers

    def boom(*a, **k):
        raise AssertionError("weights were read before the checkpoint was refused")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)


def _rewritten(saved, tmp_path, name, edit_tensors=None, edit_config=None):
    """A copy of the saved ``name`` checkpoint, its tensors and config.json edited."""
    from safetensors.torch import load_file, save_file
    d = tmp_path / "broken"
    shutil.copytree(saved[name][0], d)
    if edit_tensors:
        st = d / "model.safetensors"
        t = load_file(st)
        edit_tensors(t)
        save_file(t, st, metadata={"format": "pt"})
    if edit_config:
        cfg = json.loads((d / "config.json").read_text())
        edit_config(cfg)
        (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def _extra_layer(t):
    for k in [k for k in t if k.startswith("model.layers.0.")]:
        t[k.replace("layers.0.", "layers.2.")] = t[k].clone()


def _put(name, fn):
    return lambda t: t.__setitem__(name, fn(t[name]))


HEADER_CASES = [   # (id, model, tensors edit, config edit, words of the refusal)
    ("tied-flag-distinct-head", "tiny-qwen2",
     lambda t: t.__setitem__("lm_head.weight", t["model.embed_tokens.weight"].flip(0).clone()),
     None, "tie_word_embeddings true, but the safetensors also hold a distinct lm_head.weight"),
    ("more-layers-than-config", "tiny-qwen2", _extra_layer, None,
     "hold layers 0-2 (3), but config.json's num_hidden_layers is 2"),
    ("unknown-tensor", "tiny-olmoe",
     lambda t: t.__setitem__("model.layers.0.mlp.shared_expert.weight", torch.zeros(4, 4)),
     None, "1 tensor(s) that tiny-olmoe does not read, e.g. model.layers.0.mlp.shared_expert"),
    ("missing-tensor", "tiny-qwen2", lambda t: t.pop("model.layers.1.mlp.up_proj.weight"),
     None, "lacks 1 tensor(s) that tiny-qwen2 reads, e.g. model.layers.1.mlp.up_proj.weight"),
    ("int8-weight", "tiny-qwen2",
     _put("model.layers.0.mlp.down_proj.weight", lambda w: w.to(torch.int8)), None,
     "model.layers.0.mlp.down_proj.weight is I8, not a float type"),
    ("transposed", "tiny-qwen2", _put("model.layers.1.mlp.down_proj.weight",
                                      lambda w: w.t().contiguous()), None,
     "down_proj.weight is [200, 96] in model.safetensors (transposed), but config.json "
     "implies [96, 200] (hidden_size x intermediate_size)"),
    ("wrong-shape-expert", "tiny-olmoe", _put("model.layers.1.mlp.experts.3.gate_proj.weight",
                                              lambda w: w[:40].clone()), None,
     "experts.3.gate_proj.weight is [40, 96]"),
    ("hidden-size-config", "tiny-qwen2", None, lambda c: c.update(hidden_size=128),
     "hidden_size is 128 there, 96 in tiny-qwen2"),
    ("vocab-size-config", "tiny-olmoe", None, lambda c: c.update(vocab_size=640),
     "vocab_size is 640 there, 611 in tiny-olmoe"),
    ("layers-config", "tiny-olmoe", None, lambda c: c.update(num_hidden_layers=3),
     "num_hidden_layers is 3 there, 2 in tiny-olmoe"),
    ("eps-close-not-equal", "tiny-qwen2", None, lambda c: c.update(rms_norm_eps=1e-5),
     "rms_norm_eps is 1e-05 there, 1e-06 in tiny-qwen2"),
]


@pytest.mark.parametrize("name, tensors, config, words", [r[1:] for r in HEADER_CASES],
                         ids=[r[0] for r in HEADER_CASES])
def test_header_contradictions_refused_before_weights_load(saved, tmp_path, monkeypatch, name,
                                                            tensors, config, words):
    """Every contradiction between the safetensors headers, config.json and the spec is one
    line naming the field, the checkpoint's value and the expected one, before any weight
    is read (``from_pretrained`` raises if called)."""
    folder = _rewritten(saved, tmp_path, name, tensors, config)
    _no_weights(monkeypatch)
    for call in (lambda: inspect_checkpoint(folder, name), lambda: load_checkpoint(folder, name)):
        with pytest.raises(CheckpointError) as e:
            call()
        assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_tied_head_with_the_same_numbers_is_accepted(saved, tmp_path):
    """A tied checkpoint that also stores its head as a copy of the embedding is the same
    model: accepted, and loads to the oracle's logits."""
    folder = _rewritten(saved, tmp_path, "tiny-qwen2", lambda t: t.__setitem__(
        "lm_head.weight", t["model.embed_tokens.weight"].clone()))
    spec, w = load_checkpoint(folder, "tiny-qwen2")
    assert torch.equal(w["lm_head.weight"], w["model.embed_tokens.weight"])


def test_positions_past_the_checkpoints_limit(saved, tmp_path, capsys):
    from onelaunch.checkpoint import positions_fit
    folder = _rewritten(saved, tmp_path, "tiny-qwen2", None,
                        lambda c: c.update(max_position_embeddings=12))
    positions_fit(folder, 12)
    with pytest.raises(CheckpointError, match="needs 13 positions .* max_position_embeddings 12"):
        positions_fit(folder, 13)
    assert main(["generate", "--checkpoint", folder, "--prompt-len", "8", "--tokens", "6",
                 "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_position_embeddings 12" in err[0], err


def test_no_spec_of_these_shapes(tmp_path):
    other = dataclasses.replace(get_spec("tiny-qwen2"), name="tiny-qwen2-narrow", hidden=64,
                                heads=4)
    _save(other, tmp_path)
    with pytest.raises(CheckpointError, match="no known spec has its shapes"):
        load_checkpoint(str(tmp_path))


def test_missing_folder(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(str(tmp_path / "nothing-here"), "tiny-qwen2")


def test_folder_without_config(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        load_checkpoint(str(tmp_path), "tiny-qwen2")


def test_unsupported_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(CheckpointError, match="model_type 'llama' is not supported"):
        load_checkpoint(str(tmp_path), "tiny-qwen2")


def test_cli_good_checkpoint(saved, capsys):
    assert main(["check", "--checkpoint", str(saved["tiny-qwen2"][0]), "--tokens", "4"]) == 0
    assert "4/4" in capsys.readouterr().out


def test_cli_bad_checkpoint_exits_2(tmp_path, capsys):
    assert main(["check", "--model", "tiny-qwen2", "--checkpoint", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "config.json" in err and err.count("\n") == 1


# ---- a checkpoint that disagrees with its spec is refused ----------------------------
# Every setting a spec encodes that changes the math without changing a tensor's shape is
# compared with the checkpoint's config.json before any weight is read; a difference is one
# CheckpointError naming the field, the checkpoint's value and the spec's.
def _edited(saved, tmp_path, name, edit):
    """A copy of the saved ``name`` checkpoint with ``edit`` applied to its config.json."""
    d = tmp_path / "edited"
    shutil.copytree(saved[name][0], d)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def _old_style_theta(theta):
    """rope_theta written as transformers 4 writes it (the published checkpoints' form): a
    top-level key, no rope_parameters."""
    def edit(c):
        c.pop("rope_parameters", None)
        c["rope_theta"] = theta
    return edit


def _set(**kw):
    return lambda c: c.update(kw)


def _sliding(c):
    c.pop("layer_types", None)
    c.update(use_sliding_window=True, sliding_window=8, max_window_layers=1)


DISAGREE = [   # (id, model, edit of config.json, words of the refusal)
    ("rope_theta", "tiny-qwen2", _old_style_theta(1e4),
     "rope_theta is 10000.0 there, 1000000.0 in tiny-qwen2"),
    ("rope_parameters.rope_theta", "tiny-qwen2",
     _set(rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
     "rope_theta is 10000.0 there, 1000000.0 in tiny-qwen2"),
    ("olmoe-rope_theta", "tiny-olmoe", _old_style_theta(1e6),
     "rope_theta is 1000000.0 there, 10000.0 in tiny-olmoe"),
    ("rope_scaling", "tiny-qwen2",
     _set(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6}),
     "rope_scaling is {'rope_type': 'linear', 'factor': 2.0} there, None in tiny-qwen2"),
    ("rms_norm_eps", "tiny-qwen2", _set(rms_norm_eps=1e-2),
     "rms_norm_eps is 0.01 there, 1e-06 in tiny-qwen2"),
    ("olmoe-rms_norm_eps", "tiny-olmoe", _set(rms_norm_eps=1e-2),
     "rms_norm_eps is 0.01 there, 1e-05 in tiny-olmoe"),
    ("tie_word_embeddings", "tiny-qwen2", _set(tie_word_embeddings=False),
     "tie_word_embeddings is False there, True in tiny-qwen2"),
    ("olmoe-tie_word_embeddings", "tiny-olmoe", _set(tie_word_embeddings=True),
     "tie_word_embeddings is True there, False in tiny-olmoe"),
    ("top-k", "tiny-olmoe", _set(num_experts_per_tok=2),
     "num_experts_per_tok is 2 there, 4 in tiny-olmoe"),
    ("norm_topk_prob", "tiny-olmoe", _set(norm_topk_prob=True),
     "norm_topk_prob is True there, False in tiny-olmoe"),
    ("attention_bias", "tiny-olmoe", _set(attention_bias=True),
     "attention_bias is True there, False in tiny-olmoe"),
    ("clip_qkv", "tiny-olmoe", _set(clip_qkv=8.0), "clip_qkv is 8.0 there, None in tiny-olmoe"),
    ("heads-same-shapes", "tiny-qwen2", _set(num_attention_heads=12, num_key_value_heads=4,
                                             head_dim=8),
     "num_attention_heads is 12 there, 6 in tiny-qwen2; num_key_value_heads is 4 there, 2 in "
     "tiny-qwen2; head_dim is 8 there, 16 in tiny-qwen2"),
    ("sliding-window", "tiny-qwen2", _sliding,
     "use_sliding_window is 'True (layers [1], window 8)' there, False in tiny-qwen2"),
    ("hidden_act", "tiny-qwen2", _set(hidden_act="gelu"),
     "hidden_act is 'gelu' there, 'silu' in tiny-qwen2"),
]


@pytest.mark.parametrize("name, edit, words", [r[1:] for r in DISAGREE],
                         ids=[r[0] for r in DISAGREE])
def test_config_that_disagrees_is_refused(saved, tmp_path, monkeypatch, name, edit, words):
    import transformers

    def boom(*a, **k):
        raise AssertionError("weights were read before the config was compared")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    folder = _edited(saved, tmp_path, name, edit)
    for spec in (name, None):                  # given, or inferred from the shapes
        with pytest.raises(CheckpointError) as e:
            load_checkpoint(folder, spec)
        msg = str(e.value)
        assert f"config.json disagrees with {name}: " in msg and words in msg, msg
        assert "\n" not in msg


@pytest.mark.parametrize("name, drop, words", [
    ("tiny-qwen2", "self_attn.q_proj.bias", "q_proj.bias; tiny-qwen2 has qkv_bias True"),
    ("tiny-olmoe", "self_attn.k_norm.weight", "k_norm.weight; tiny-olmoe has qk_norm True"),
])
def test_checkpoint_without_the_specs_tensors_is_refused(saved, tmp_path, name, drop, words):
    """Biases and q/k norms are not config fields (the HF classes always build them): a
    checkpoint without them would load with transformers' random fill."""
    from safetensors.torch import load_file, save_file
    d = tmp_path / "cut"
    shutil.copytree(saved[name][0], d)
    st = d / "model.safetensors"
    save_file({k: v for k, v in load_file(st).items() if not k.endswith(drop)}, st,
              metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=f"lacks {get_spec(name).layers} tensor"
                       r"\(s\) that " + name) as e:
        load_checkpoint(str(d), name)
    assert words in str(e.value) and "random" in str(e.value)


@pytest.mark.parametrize("cmd", [["check"], ["generate", "--check", "--device", "cpu"]])
def test_cli_refuses_the_measured_case(saved, tmp_path, capsys, cmd):
    """The issue's case: rope_theta 1e4 in a tiny-qwen2 folder (spec 1e6) passed 8/8 in
    both commands while HF on the folder decoded other tokens."""
    folder = _edited(saved, tmp_path, "tiny-qwen2", _old_style_theta(1e4))
    assert main([*cmd, "--checkpoint", folder, "--tokens", "8"]) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in out.err
    assert "rope_theta is 10000.0 there, 1000000.0 in tiny-qwen2" in lines[0]


# config.json of the published checkpoints, the fields as their model cards' files hold them
QWEN25_15B_INSTRUCT = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 1536,
    "initializer_range": 0.02, "intermediate_size": 8960, "max_position_embeddings": 32768,
    "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 12,
    "num_hidden_layers": 28, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936}
OLMOE_1B_7B_INSTRUCT = {
    "architectures": ["OlmoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "clip_qkv": None, "eos_token_id": 50279, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 1024, "max_position_embeddings": 4096,
    "model_type": "olmoe", "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16,
    "num_key_value_heads": 16, "output_router_logits": False, "pad_token_id": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
    "router_aux_loss_coef": 0.01, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "use_cache": True, "vocab_size": 50304}


@pytest.mark.parametrize("config, name", [(QWEN25_15B_INSTRUCT, "qwen2.5-1.5b"),
                                          (OLMOE_1B_7B_INSTRUCT, "olmoe-1b-7b")])
def test_published_configs_agree_with_their_specs(tmp_path, config, name):
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec, folder = inspect_checkpoint(str(tmp_path))
    assert spec.name == name and str(folder) == str(tmp_path)
