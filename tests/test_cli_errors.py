"""Every bad input is one ``error:`` line on stderr that says what to do, exit status 2,
no traceback, and (where weights would load) refused before any weight is read: each
kind of bad input is a case here. ``no_weights`` makes reading weights fail the test
(seeded random weights, transformers' ``from_pretrained``, a tensor-parallel launch), so
a row that passes was refused by validation at the edge, not by the loader."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onelaunch.cli import main
from test_cli import one_error_line

ROOT = Path(__file__).resolve().parent.parent
BIG = "1" + "0" * 30                                   # 10**30
GEN, CHECK = ["generate", "--model", "tiny-qwen2"], ["check", "--model", "tiny-qwen2"]
INFO, BENCH = ["info", "--model", "tiny-qwen2"], ["bench", "--model", "tiny-qwen2"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny-qwen2 checkpoint with its tokenizer (test_text's byte-level BPE)."""
    from test_text import tiny_checkpoint
    folder = tmp_path_factory.mktemp("ckpt")
    tiny_checkpoint("tiny-qwen2", folder)
    return folder


@pytest.fixture
def no_weights(monkeypatch):
    import transformers

    import onelaunch.tp
    import onelaunch.weights

    def boom(*a, **k):
        raise AssertionError("weights were read before the input was validated")
    monkeypatch.setattr(onelaunch.weights, "random_weights", boom)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", boom)
    monkeypatch.setattr(onelaunch.tp, "launch", boom)


def _broken(ckpt, tmp_path, how):
    """A copy of ``ckpt`` with one file spoiled."""
    d = tmp_path / how
    shutil.copytree(ckpt, d)
    st, cfg = d / "model.safetensors", d / "config.json"
    if how == "truncated":
        st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    elif how == "garbage":
        st.write_bytes(b"this is not a safetensors file\n" * 40)
    elif how == "config-not-json":
        cfg.write_text(cfg.read_text()[:-20])
    elif how == "config-bad-field":
        c = json.loads(cfg.read_text())
        c["hidden_size"] = "ninety-six"
        cfg.write_text(json.dumps(c))
    elif how == "no-ids-tokenizer":          # a tokenizer that drops whitespace-only text
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
        for f in d.glob("tokenizer*"):
            f.unlink()
        tok = Tokenizer(models.WordLevel({"hi": 0, "<unk>": 1}, unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(d)
    elif how == "wide-tokenizer":            # another model's tokenizer: ids past the vocab
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(d)
        tok.add_tokens([f"<pad{i}>" for i in range(1099 - len(tok))] + ["zzwide"])
        tok.save_pretrained(d)                # "zzwide" is id 1099; tiny-qwen2 has 997
    elif how == "bad-chat-template":
        t = d / "tokenizer_config.json"
        c = json.loads(t.read_text())
        c["chat_template"] = "{% for m in messages %}{{ m['content'] }"      # unclosed
        t.write_text(json.dumps(c))
        for f in d.glob("chat_template.*"):
            f.unlink()
    return str(d)


def _run(capsys, args):
    rc = main(list(args))
    out = capsys.readouterr()
    assert rc == 2, out.out + out.err
    return one_error_line(out.err)      # exactly one line, "error: ...", no traceback


# (argv, words the line must hold, words it must not); CKPT / a _broken() kind in argv is
# replaced by that folder
ROWS = [
    # tracebacks before
    ([*CHECK, "--seed", BIG], ["--seed", "2**63 - 1"], []),
    ([*GEN, "--seed", BIG], ["--seed", "2**63 - 1"], []),
    ([*CHECK, "--seed", "10**30"], ["--seed", "invalid int"], []),
    ([*BENCH, "--iters", "0"], ["--iters", "at least 1"], []),
    ([*BENCH, "--tokens", "0"], ["--tokens", "at least 1"], []),
    (["generate", "--checkpoint", "truncated", "--prompt-ids", "1,2"],
     ["model.safetensors", "not a readable safetensors file", "download it again"], []),
    (["check", "--checkpoint", "garbage"],
     ["model.safetensors", "not a readable safetensors file", "download it again"], []),
    (["generate", "--checkpoint", "config-not-json", "--prompt-ids", "1,2"],
     ["config.json is not valid JSON", "line", "column"], []),
    (["check", "--checkpoint", "config-bad-field"],
     ["config.json is not a valid qwen2 config", "hidden_size"], []),
    (["generate", "--checkpoint", "CKPT", "--prompt", "caf\udce9 ok"],    # b"caf\xe9 ok"
     ["--prompt", "not UTF-8", "b'\\xe9'", "--prompt-ids"], []),
    # silently accepted before
    ([*GEN, "--prompt-ids", "1,,2"], ["--prompt-ids", "empty item"], []),
    ([*GEN, "--prompt-ids", "1,2,"], ["--prompt-ids", "empty item"], []),
    ([*GEN, "--max-ctx", "0"], ["--max-ctx", "at least 1"], []),
    ([*GEN, "--tp", "0"], ["--tp", "at least 1"], []),
    ([*BENCH, "--tp", "0"], ["--tp", "at least 1"], []),
    ([*INFO, "--bandwidth", "nan"], ["--bandwidth", "positive, finite"], []),
    ([*INFO, "--bandwidth", "inf"], ["--bandwidth", "positive, finite"], []),
    ([*GEN, "--timeout", "nan"], ["--timeout", "positive, finite"], []),
    # wrong or late advice before
    ([*GEN, "--max-ctx", "-5"], ["--max-ctx", "at least 1"], ["prompt"]),
    ([*GEN, "--max-ctx", "10"], ["--max-ctx 28 or more"], ["shorter prompt"]),
    ([*GEN, "--max-ctx", "1000"], ["--max-ctx 256 or less"], []),
    (["generate", "--checkpoint", "CKPT", "--prompt", ""], ["--prompt is empty"], ["--prompt-len"]),
    (["check", "--checkpoint", ""], ["checkpoint is an empty string"], []),
    ([*GEN, "--prompt-ids=-1,2"], ["--prompt-ids", "has id -1"], ["expected one argument"]),
    ([*CHECK, "--prompt-ids=-1,2"], ["--prompt-ids", "has id -1"], []),
    ([*GEN, "--prompt-ids", "1,2000"], ["token id 2000 is out of range"], []),
    ([*GEN, "--prompt-ids", BIG], ["--prompt-ids", f"has id {BIG}"], []),
    ([*CHECK, f"--prompt-ids=-{BIG}"], ["--prompt-ids", f"has id -{BIG}"], []),
    (["check", "--model", ""], ["--model", "is empty", "tiny-qwen2"], []),
    (["generate", "--model", ""], ["--model", "is empty", "tiny-qwen2"], []),
    ([*GEN, "--prompt-ids", "1,2", "--prompt-len", "4"], ["--prompt-ids or --prompt-len"], []),
    ([*BENCH, "--json", "/no/such/folder/bench.json"], ["--json", "does not exist"], []),
    ([*BENCH, "--json", "TMP"], ["--json", "is a folder"], []),
    ([*BENCH, "--tp", "2", "--ctx", "8", "--tp-rungs", "fusd"], ["unknown --tp-rungs fusd"], []),
    ([*CHECK, "--prompt-ids", "1,2", "--prompt-len", "4"], ["--prompt-ids or --prompt-len"], []),
    (["generate", "--checkpoint", "bad-chat-template", "--prompt", "hi", "--chat"],
     ["chat template does not render", "drop --chat"], []),
    (["generate", "--checkpoint", "wide-tokenizer", "--prompt", "zzwide"],
     ["tokenizer gives id 1099", "vocabulary has 997", "tokenizer files are another"],
     ["out of range"]),
    ([*BENCH, "--tp", "3", "--ctx", "8", "--iters", "2", "--tokens", "2"],
     ["2 kv heads, not divisible by --tp 3"], []),
    ([*GEN, "--tp", "3"], ["2 kv heads, not divisible by --tp 3"], []),
    (["generate", "--checkpoint", "no-ids-tokenizer", "--prompt", "   "],
     ["tokenizer encodes the prompt", "to no token ids", "--prompt-ids"], ["the prompt is empty"]),
]


@pytest.mark.parametrize("args, words, not_words", ROWS,
                         ids=[" ".join(r[0]).encode("unicode_escape").decode() for r in ROWS])
def test_bad_input_is_one_line_before_weights(capsys, no_weights, ckpt, tmp_path, args, words,
                                              not_words):
    cmd = []
    for a in args:
        if a == "CKPT":
            a = str(ckpt)
        elif a == "TMP":
            a = str(tmp_path)
        elif a in ("truncated", "garbage", "config-not-json", "config-bad-field",
                   "no-ids-tokenizer", "wide-tokenizer", "bad-chat-template"):
            a = _broken(ckpt, tmp_path, a)
        cmd.append(a)
    if cmd[0] in ("generate", "bench"):
        cmd += ["--device", "cpu"]
    line = _run(capsys, cmd)
    for w in words:
        assert w in line, line
    for w in not_words:
        assert w not in line, line


# ---- a hub id: not a missing folder, but the hub loader's to fetch --------------------
def test_hub_id_reaches_the_hub_offline(capsys, no_weights, monkeypatch):
    """With no network (here: the hub client's offline mode), the real loader fails, and
    that is one line that says so."""
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    line = _run(capsys, ["generate", "--checkpoint", "org/name", "--prompt", "hi",
                         "--device", "cpu"])
    assert "'org/name' is not a local folder" in line and "cannot be reached" in line
    assert "huggingface-cli download org/name" in line and "does not exist" not in line


@pytest.mark.parametrize("error, words", [("offline", "cannot be reached"),
                                          ("not found", "nor a model on the Hugging Face hub")])
def test_hub_id_is_passed_to_the_hub_loader(capsys, no_weights, monkeypatch, error, words):
    import httpx
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError
    asked = []

    def fake(repo_id, **kw):
        asked.append(repo_id)
        if error == "offline":
            raise LocalEntryNotFoundError("no connection")
        url = f"https://huggingface.co/api/models/{repo_id}"
        raise RepositoryNotFoundError("404", response=httpx.Response(
            404, request=httpx.Request("GET", url)))
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    line = _run(capsys, ["check", "--checkpoint", "org/name"])
    assert asked == ["org/name"] and words in line


def test_missing_path_is_not_a_hub_id(capsys, no_weights, tmp_path):
    line = _run(capsys, ["check", "--checkpoint", str(tmp_path / "no" / "such")])
    assert "does not exist" in line


# ---- the real entry point: bytes that are not UTF-8, straight from argv ----------------
def test_non_utf8_prompt_bytes_through_argv(ckpt):
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "onelaunch", "generate", "--checkpoint",
                        str(ckpt), "--device", "cpu", "--prompt", b"caf\xe9 ok"],
                       cwd=ROOT, capture_output=True, timeout=300,
                       env={**os.environ, "LC_ALL": "C.UTF-8", "TRITON_INTERPRET": "1"})
    err = p.stderr.decode("utf-8", "replace")
    assert p.returncode == 2 and p.stdout == b"", err
    line = one_error_line(err)
    assert "not UTF-8" in line and "b'\\xe9'" in line, line
    assert time.perf_counter() - t0 < 120
