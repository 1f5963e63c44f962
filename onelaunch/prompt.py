"""Prompts: the one rule for a run's random prompt, and checking a prompt a user gives.

``random_prompt(spec, n, seed)`` is the only place token ids are drawn at random: the
ladder, the peers, the sweeps, the profile, tensor parallelism and ``generate`` all take
their prompt from it, so one (spec, length, seed) names one prompt everywhere.
"""
from __future__ import annotations

import torch

from .specs import ModelSpec


class UsageError(ValueError):
    """Bad input from a user (prompt too long, ids out of range, ...). The message says
    how to fix it; the CLI prints it as one line and exits 2."""


def random_prompt(spec: ModelSpec, n: int, seed: int = 0, device="cpu",
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """``n`` random token ids [n] int64 from a generator seeded with ``seed`` (the same ids
    on any device). ``generator``: draw from this one instead (a caller that draws several
    prompts in turn from one stream)."""
    g = generator if generator is not None else torch.Generator().manual_seed(seed)
    return torch.randint(0, spec.vocab, (n,), generator=g).to(device)


def prompt_digest(prompt: torch.Tensor) -> str:
    """A short name for a prompt's ids (the first 12 hex digits of their SHA-256): rows
    measured on one prompt carry the same digest."""
    import hashlib
    ids = torch.as_tensor(prompt).flatten().to("cpu", torch.int64).numpy().tobytes()
    return hashlib.sha256(ids).hexdigest()[:12]


def validate_prompt(spec: ModelSpec, prompt: torch.Tensor, new_tokens: int, max_ctx: int) -> None:
    """Raise :class:`UsageError` unless ``prompt`` (ids [L]) plus ``new_tokens`` fit."""
    L = prompt.numel()
    if L < 1:
        raise UsageError("the prompt is empty; give at least one token (--prompt-len 1 or more)")
    if new_tokens < 1:
        raise UsageError(f"--tokens must be at least 1 (got {new_tokens})")
    if L + new_tokens > max_ctx:
        raise UsageError(f"prompt ({L}) + new tokens ({new_tokens}) = {L + new_tokens} exceeds "
                         f"the context of {spec.name} ({max_ctx}); use a shorter prompt or "
                         "fewer --tokens")
    lo, hi = int(prompt.min()), int(prompt.max())
    if lo < 0 or hi >= spec.vocab:
        bad = lo if lo < 0 else hi
        raise UsageError(f"token id {bad} is out of range for {spec.name}; ids must be in "
                         f"[0, {spec.vocab - 1}]")


def make_prompt(spec: ModelSpec, prompt_len: int, seed: int, prompt_ids=None) -> torch.Tensor:
    """The given ids, or ``prompt_len`` random ids (:func:`random_prompt`). Returns [L] int64."""
    if prompt_ids is not None:
        return torch.as_tensor(list(prompt_ids), dtype=torch.int64)
    if prompt_len < 1:
        raise UsageError(f"--prompt-len must be at least 1 (got {prompt_len})")
    return random_prompt(spec, prompt_len, seed)
