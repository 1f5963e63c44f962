"""Text in and out of the engine: a checkpoint's tokenizer, chat prompts, streamed decoding,
and the progress bars of long runs.

The engine reads and writes token ids; this module turns a prompt's text into ids (through
the checkpoint's own tokenizer, and its chat template for instruct models) and the ids the
engine hands back, a batch at a time, into text as it arrives. Decoding a batch on its
own would break characters whose bytes span two tokens (byte-level BPE splits a CJK
character or an emoji into several tokens), so ``TextStream`` decodes a window of ids and
prints only what is new and complete (the scheme of text-generation-inference's
``decode_token``).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from . import env
from .prompt import UsageError
from .checkpoint import CheckpointError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def load_tokenizer(path_or_id: str):
    """The tokenizer saved with a checkpoint (a local folder, or a hub id), through
    ``transformers.AutoTokenizer``. A folder without tokenizer files is a
    :class:`CheckpointError` that says what to fetch."""
    from transformers import AutoTokenizer
    p = Path(path_or_id)
    if p.is_dir() and not any((p / f).exists() for f in TOKENIZER_FILES):
        raise CheckpointError(f"{p} has no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}); "
                              "download the whole checkpoint (huggingface-cli download ID "
                              "--local-dir DIR), or give the prompt as ids with --prompt-ids")
    try:
        return AutoTokenizer.from_pretrained(str(p) if p.exists() else path_or_id)
    except Exception as e:  # a broken or unreachable tokenizer: say which and why, in a line
        why = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        raise CheckpointError(f"could not load the tokenizer of {path_or_id!r} "
                              f"({type(e).__name__}{': ' + why if why else ''}); give the "
                              "prompt as ids with --prompt-ids") from None


def stop_ids(tok, path_or_id: str | None = None) -> set[int]:
    """Ids that end a reply: the tokenizer's end-of-text token and the checkpoint's
    ``generation_config.json`` ``eos_token_id`` (an int or a list), where there is one."""
    out = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    gen = Path(path_or_id) / "generation_config.json" if path_or_id is not None else None
    if gen is not None and gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        out |= set(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return out


def encode(tok, text: str, chat: bool = False) -> list[int]:
    """The prompt's ids. ``chat``: ``text`` is one user turn, wrapped in the tokenizer's chat
    template with the assistant's turn opened (what an instruct model was trained on)."""
    if chat:
        if not getattr(tok, "chat_template", None):
            raise UsageError("--chat needs a tokenizer with a chat template and this one has "
                             "none (a base model?); drop --chat to send the text as it is")
        try:
            wrapped = tok.apply_chat_template([{"role": "user", "content": text}],
                                              add_generation_prompt=True, tokenize=False)
        except Exception as e:  # jinja's TemplateSyntaxError, UndefinedError, ...
            why = " ".join(str(e).split())[:160]
            raise UsageError(f"the checkpoint's chat template does not render ({type(e).__name__}: "
                             f"{why}): fix chat_template in its tokenizer files, or drop --chat"
                             ) from None
        ids = list(tok(wrapped, add_special_tokens=False)["input_ids"])
    else:
        ids = list(tok(text)["input_ids"])
    if not ids:     # e.g. only characters its normaliser or pre-tokeniser drops
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise UsageError(f"the checkpoint's tokenizer encodes the prompt {shown!r} to no token "
                         f"ids at all (it drops this text{' and its chat template' if chat else ''}"
                         " and adds no special tokens): give text it keeps, or the ids "
                         "with --prompt-ids")
    return ids


class TextStream:
    """Incremental decoding: ``push(ids)`` returns the text those ids complete, ``flush()``
    whatever is left at the end. The concatenation of everything returned equals
    ``tok.decode(ids)`` of all the ids pushed (up to the first stop id, which ends the
    stream: ``stopped`` turns true and later ids are ignored).

    Two offsets into the ids: ``prefix`` (where the decoded window starts) and ``read``
    (what has been printed). Text is emitted only when the window decodes to more than its
    printed part and does not end in U+FFFD, the replacement character of an incomplete
    UTF-8 sequence; the window then moves up to ``read``."""

    def __init__(self, tok, stop: set[int] | tuple = ()):
        self.tok, self.stop = tok, set(stop)
        self.ids: list[int] = []
        self.prefix = self.read = 0
        self.stopped = False

    def decode(self, ids) -> str:
        return self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, ids) -> str:
        for i in ids:
            if self.stopped:
                break
            if i in self.stop:
                self.stopped = True
            else:
                self.ids.append(int(i))
        done = self.decode(self.ids[self.prefix:self.read])
        text = self.decode(self.ids[self.prefix:])
        if len(text) > len(done) and not text.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return text[len(done):]
        return ""

    def flush(self) -> str:
        done = self.decode(self.ids[self.prefix:self.read])
        text = self.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return text[len(done):]


def progress(iterable=None, **kw):
    """A tqdm bar on stderr that shows itself only after two seconds, and never when
    stderr is not a terminal (logs, notebooks, tests) or ``ONELAUNCH_NO_PROGRESS=1``."""
    from tqdm import tqdm
    off = env.flag("ONELAUNCH_NO_PROGRESS") or not sys.stderr.isatty()
    return tqdm(iterable, disable=off, delay=2.0, leave=False, file=sys.stderr, **kw)
