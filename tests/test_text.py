"""Text in and out: a tiny checkpoint with its own tokenizer (a byte-level BPE trained here
in a few milliseconds, vocabulary = the tiny model's, so every id the model can emit
decodes), chat templates, and streamed decoding that never splits a character.

``tiny_checkpoint`` is shared with test_cli.py."""
import json
import random

import pytest
import torch

from onelaunch.prompt import UsageError
from onelaunch.specs import get_spec
from onelaunch.text import TextStream, encode, load_tokenizer, progress, stop_ids
from onelaunch.checkpoint import CheckpointError
from onelaunch.weights import hf_model, random_weights

CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


def tiny_tokenizer(vocab: int, chat: bool = True):
    """A byte-level BPE of exactly ``vocab`` ids (two of them special) over words that mix
    ASCII, accented letters, CJK and an emoji, so that characters span several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    rng = random.Random(0)
    alphabet = list("abcdefghijklmnopqrstuvwxyz") + list("éüßø") + ["中", "文", "🙂"]
    words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(3000)]
    corpus = [" ".join(rng.choice(words) for _ in range(12)) for _ in range(400)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<|im_start|>", "<|im_end|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    assert tok.get_vocab_size() == vocab
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   chat_template=CHAT_TEMPLATE if chat else None,
                                   clean_up_tokenization_spaces=False)


def tiny_checkpoint(name: str, folder, seed: int = 2, chat: bool = True, tokenizer: bool = True):
    """Write a tiny model (``save_pretrained``, safetensors) and its tokenizer into
    ``folder``; return the fp32 weights."""
    spec = get_spec(name)
    w = random_weights(spec, seed=seed, dtype=torch.float32)
    hf_model(spec, w).save_pretrained(folder)
    if tokenizer:
        tiny_tokenizer(spec.vocab, chat).save_pretrained(folder)
    return w


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    tiny_tokenizer(997).save_pretrained(folder)
    return load_tokenizer(str(folder))


def test_loads_through_autotokenizer(tok):
    assert len(tok) == 997 and tok.eos_token == "<|im_end|>"
    ids = encode(tok, "hello wörld 中文 🙂")
    assert max(ids) < 997 and tok.decode(ids) == "hello wörld 中文 🙂"


def test_chat_template(tok):
    ids = encode(tok, "hi there", chat=True)
    assert tok.decode(ids) == "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>")   # a special token, not its text
    assert tok.decode(ids, skip_special_tokens=True) == "user\nhi there\nassistant\n"


def test_chat_without_template(tmp_path):
    tiny_tokenizer(611, chat=False).save_pretrained(tmp_path)
    with pytest.raises(UsageError, match="drop --chat"):
        encode(load_tokenizer(str(tmp_path)), "hi", chat=True)


def test_missing_tokenizer_files(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    with pytest.raises(CheckpointError, match="no tokenizer files.*--prompt-ids"):
        load_tokenizer(str(tmp_path))


def test_stop_ids_from_generation_config(tok, tmp_path):
    assert stop_ids(tok) == {tok.eos_token_id}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    assert stop_ids(tok, str(tmp_path)) == {tok.eos_token_id, 7, 9}
    # the common form: one integer
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert stop_ids(tok, str(tmp_path)) == {tok.eos_token_id, 7}
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": None}))
    assert stop_ids(tok, str(tmp_path)) == {tok.eos_token_id}


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_stream_equals_one_decode(tok, batch):
    """Random ids (bytes of one character land in different tokens, and some sequences
    are not valid UTF-8 at all), pushed a few at a time: the pieces add up to one decode
    of all the ids, and no piece ends inside a character (no U+FFFD until the flush)."""
    g = torch.Generator().manual_seed(batch)
    text = encode(tok, "中文 🙂 wörld ßø 中 ü 🙂🙂 文")
    for trial in range(20):
        ids = (text if trial == 0 else torch.randint(2, 997, (40,), generator=g).tolist())
        s = TextStream(tok)
        pieces = [s.push(ids[i:i + batch]) for i in range(0, len(ids), batch)] + [s.flush()]
        assert "".join(pieces) == tok.decode(ids)
        if trial == 0:     # valid text: every piece is whole characters, nothing held back
            assert all("\ufffd" not in p for p in pieces) and pieces[-1] == ""
            assert len([p for p in pieces if p]) >= 2
            assert any("\ufffd" in tok.decode([i]) for i in ids)   # a token = part of a character


def test_stream_stops_at_a_stop_id(tok):
    ids = encode(tok, "abc def") + [tok.eos_token_id] + encode(tok, " ghi")
    s = TextStream(tok, stop_ids(tok))
    out = s.push(ids[:2]) + s.push(ids[2:]) + s.flush()
    assert out == "abc def" and s.stopped and s.push([5, 6]) == ""


def test_progress_is_off_off_a_terminal(monkeypatch):
    assert progress(range(3)).disable                  # pytest captures stderr: no TTY
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    monkeypatch.setenv("ONELAUNCH_NO_PROGRESS", "1")
    assert progress(range(3)).disable
