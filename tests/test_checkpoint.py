"""Real checkpoints: a tiny one written with Hugging Face's ``save_pretrained``
(safetensors) loads back to the same tensors and the same oracle logits; a checkpoint
that does not fit fails with a :class:`CheckpointError` that says why."""
import dataclasses
import json

import pytest
import torch

from onelaunch.cli import main
from onelaunch.oracle import Oracle
from onelaunch.specs import get_spec
from onelaunch.weights import CheckpointError, hf_model, load_checkpoint, random_weights


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
    with pytest.raises(CheckpointError, match=r"does not match tiny-qwen2: .*mlp.*\(104, 96\)"):
        load_checkpoint(str(tmp_path), "tiny-qwen2")
    # with no spec given, the one of the same family, width, depth and vocab is picked
    with pytest.raises(CheckpointError, match="does not match tiny-qwen2"):
        load_checkpoint(str(tmp_path))


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
