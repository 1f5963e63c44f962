"""Sharding: the transformation of a model's spec and weights into one rank's, made
before the plan is built (``Engine(shard_spec(spec, world), shard_weights(...))``).

Column-parallel (a rank holds whole output rows): Q, K and V by head; gate and up, each
rank taking its part of both; OLMoE's experts on their intermediate dimension (the router
is replicated and picks the same experts on every rank). Row-parallel (a rank holds a
slice of the input columns, so its output is a partial sum): O, down and the experts'
down. The LM head is split by vocabulary. The embedding and the norms are replicated.
"""
from __future__ import annotations

import dataclasses

import torch

from ..specs import get_spec
from . import TPError


def shard_spec(spec, world: int):
    """The shapes one rank computes: heads, kv heads and the (per-expert) MLP width
    divided by ``world``. The vocabulary stays whole (prompts are validated against it);
    the LM head's rows are sliced in :func:`shard_weights`."""
    s = get_spec(spec)
    if world == 1:
        return s
    for what, n in (("query heads", s.heads), ("kv heads", s.kv_heads),
                    ("MLP width", s.intermediate)):
        if n % world:
            raise TPError(f"{s.name} has {n} {what}, not divisible by --tp {world}: "
                          f"use a tensor-parallel size that divides it")
    return dataclasses.replace(s, name=f"{s.name}/tp{world}", heads=s.heads // world,
                               kv_heads=s.kv_heads // world,
                               intermediate=s.intermediate // world)


def vocab_range(vocab: int, rank: int, world: int) -> tuple[int, int]:
    """Rank ``rank``'s LM-head rows [lo, hi): contiguous blocks, the last possibly shorter."""
    per = -(-vocab // world)
    return min(vocab, rank * per), min(vocab, (rank + 1) * per)


def _rows(t, r, world):
    n = t.shape[0] // world
    return t[r * n:(r + 1) * n]


def _shard_one(spec, name: str, t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """One HF-named tensor of the full model -> rank ``rank``'s part (a contiguous
    copy), or the tensor itself where it is replicated."""
    I = spec.intermediate
    if name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias",
                      "v_proj.weight", "v_proj.bias", "q_norm.weight", "k_norm.weight",
                      "gate_proj.weight", "up_proj.weight")):
        return _rows(t, rank, world).contiguous()            # whole heads / MLP rows
    if name.endswith(("o_proj.weight", "down_proj.weight")):
        n = t.shape[1] // world
        # input columns: a partial sum
        return t[:, rank * n:(rank + 1) * n].contiguous()
    if name.endswith("experts.gate_up_proj"):                # [E, 2I, H] = [gate; up]
        n = I // world
        return torch.cat([t[:, rank * n:(rank + 1) * n],
                          t[:, I + rank * n:I + (rank + 1) * n]], dim=1).contiguous()
    if name.endswith("experts.down_proj"):                   # [E, H, I]
        n = I // world
        return t[:, :, rank * n:(rank + 1) * n].contiguous()
    if name == "lm_head.weight":
        lo, hi = vocab_range(spec.vocab, rank, world)
        return t[lo:hi].contiguous()
    return t                                                 # embedding, norms, router


def shard_weights(spec, weights: dict[str, torch.Tensor], rank: int, world: int) -> dict:
    """Rank ``rank``'s HF-named weights (``pack_weights`` reads them as any model's)."""
    spec = get_spec(spec)
    if world == 1:
        return dict(weights)
    return {n: _shard_one(spec, n, t, rank, world) for n, t in weights.items()}


def rank_weights(spec, seed: int, rank: int, world: int, device) -> dict:
    """Seeded random weights for one rank, made one tensor at a time (the full model never
    sits in memory at once: OLMoE's 13.8 GB would not fit beside its half under 24 GB)."""
    from ..weights import hf_param_shapes, random_tensor
    spec = get_spec(spec)
    w = {}
    for name, shape in hf_param_shapes(spec).items():
        if spec.tie_embeddings and name == "lm_head.weight":
            continue
        w[name] = random_tensor(spec, name, shape, seed, device)
        if name != "model.embed_tokens.weight":
            w[name] = _shard_one(spec, name, w[name], rank, world)
    if spec.tie_embeddings:                  # the head's slice of the shared matrix
        lo, hi = vocab_range(spec.vocab, rank, world)
        w["lm_head.weight"] = w["model.embed_tokens.weight"][lo:hi].contiguous()
    return w
