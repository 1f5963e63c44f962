"""The peers as rungs: each peer an object behind one interface (:class:`Peer`), in one
registry (:data:`PEERS`), checked against the oracle then timed by :func:`peer_rungs`.

Every peer of one call shares a :class:`PeerRun`: one prompt, one oracle run (its greedy
ids and logits, the reference of every check), one set of weights and one bandwidth, so
``floor_ms``, ``x_floor`` and ``read_tbps`` of every row come from the same number.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..measure import agree
from ..measure.timing import floor_ms, run_bandwidth
from ..oracle import Oracle
from ..prompt import prompt_digest, random_prompt
from ..weights import hf_model, random_weights
from .hf import hf_generate_ms, hf_static_compiles, hf_teacher_forced, set_hf_attn
from .hf import dynamo_graphs
from .llama_cpp import LlamaBench
from .oracle_step import (compiled_oracle_greedy, compiled_oracle_step,
                          compiled_oracle_step_ms, oracle_greedy, oracle_step_ms)

RULE = f"teacher-forced; gap < {agree.NEAR_TIE_ULPS} bf16 ulps of the top logit"


def check_tokens(ref_logits: torch.Tensor, forced_choices) -> dict:
    """The gate of a peer: its teacher-forced choices [n] judged against the oracle's
    logits [>= n, V] by the agreement rule (:func:`onelaunch.measure.agree.judge_tokens`)."""
    got = torch.as_tensor(forced_choices).flatten().cpu()
    return agree.judge_tokens(ref_logits[: got.numel()], got)


@dataclass
class PeerRun:
    """What every peer of one :func:`peer_rungs` call shares."""
    spec: object
    weights: dict
    device: object
    ctx: int
    iters: int
    seed: int
    prompt: torch.Tensor                  # [ctx] ids, on the device
    ref_ids: torch.Tensor                 # the oracle's greedy ids [n_ref]
    ref_logits: torch.Tensor              # and the logits that chose them [n_ref, V]
    oracle: Oracle
    read_tbps: float | None
    hf_attn: str | None
    hf: object = field(default=None)      # the HF model, built once for both HF peers

    @property
    def floor(self):
        return floor_ms(self.spec, self.read_tbps, self.ctx)

    def row(self, rung: str, n: int, check: dict | None, note: str = "") -> dict:
        """A peer's row before its time: the check, and refused on a real flip."""
        floor, bw = self.floor, self.read_tbps
        r = {"model": self.spec.name, "rung": rung, "ctx": self.ctx, "ms_per_token": None,
             "floor_ms": None if floor is None else round(floor, 4),
             "agree": None if check is None else check["agree"],
             "read_tbps": None if bw is None else round(bw, 3), "x_floor": None,
             "new_tokens": n, "device": str(self.device),
             "dtype": str(self.weights["model.embed_tokens.weight"].dtype).replace(
                 "torch.", ""), "prompt": prompt_digest(self.prompt)}
        if check is not None:
            r["flips"] = agree.disagreements(check)
            r["rule"] = RULE
            if not check["ok"]:
                r["refused"] = ("teacher-forced choices differ from the oracle beyond a near "
                                "tie: " + agree.describe(check))
        if note:
            r["note"] = note
        return r

    def timed(self, r: dict, ms: float, spread: dict | None = None) -> dict:
        """``r`` with its time and its spread (``ms_min``, ``ms_max``, ``timed``), unless
        refused (a refused peer's time is never shown)."""
        if not r.get("refused"):
            floor = self.floor
            r["ms_per_token"] = round(ms, 4)
            r["x_floor"] = None if floor is None else round(ms / floor, 3)
            r.update({k: (spread or {}).get(k) for k in ("ms_min", "ms_max", "timed")})
        return r

    def hf_model(self):
        if self.hf is None:
            self.hf = set_hf_attn(hf_model(self.spec, self.weights), self.hf_attn)
        return self.hf


class Peer:
    """One peer: what a user would run instead of our engine. ``tokens(run)`` is how many
    tokens it checks and times; ``measure(run, n)`` checks it, then times it: one row."""
    name: str
    kind = "peer"

    def tokens(self, new_tokens: int, eager_new_tokens: int) -> int:
        """The tokens this peer checks (and times, where it times a run of tokens)."""
        return new_tokens

    def measure(self, run: PeerRun, n: int) -> dict | None:
        """The row; None where the peer cannot run here (it prints one line why)."""
        raise NotImplementedError


@dataclass
class HFGenerate(Peer):
    """transformers ``generate``, greedy: ``mode`` "eager" (dynamic cache) or "static"."""
    name: str
    mode: str
    slow: bool = False          # eager: fewer tokens on a GPU, where it is slow

    def tokens(self, new_tokens: int, eager_new_tokens: int) -> int:
        return eager_new_tokens if self.slow else new_tokens

    def measure(self, run: PeerRun, n: int) -> dict:
        hf = run.hf_model()
        static = self.mode == "static"
        cache_len = run.prompt.numel() + n + 1 if static else None   # as the timing's
        tf = hf_teacher_forced(hf, run.prompt, run.ref_ids[:n], self.mode, cache_len)
        note = ""
        if static and not hf_static_compiles(run.device):
            note = "cpu smoke: static cache, not compiled (transformers compiles on GPUs only)"
        r = run.row(self.name, n, check_tokens(run.ref_logits, tf), note)
        if not r.get("refused"):
            info = {}
            ms, ids = hf_generate_ms(run.spec, run.weights, run.ctx, n, self.mode, run.device,
                                     model=hf, prompt=run.prompt, seed=run.seed, info=info,
                                     attn=run.hf_attn)
            run.timed(r, ms, info)
            r.update(agree_free=str(agree.agreement(ids, run.ref_ids)),
                     t_one_ms=round(info["t_one_ms"], 3),
                     t_long_ms=round(info["t_long_ms"], 3),
                     graphs_while_timing=info["graphs_while_timing"])
        r["attn"] = run.hf_attn
        return r


@dataclass
class OracleEager(Peer):
    """The oracle's decode step (T=1), op by op: the reference for ``agree``."""
    name: str = "oracle eager"

    def tokens(self, new_tokens: int, eager_new_tokens: int) -> int:
        return max(new_tokens, eager_new_tokens)         # the reference's own tokens

    def measure(self, run: PeerRun, n: int) -> dict:
        info = {}
        ms = oracle_step_ms(run.oracle, run.ctx, run.iters, run.device, info=info)
        return run.timed(run.row(self.name, n, None, "the reference for agree"), ms, info)


@dataclass
class OracleCompiled(Peer):
    """The oracle's step under ``torch.compile`` (the gpt-fast recipe)."""
    name: str = "oracle compiled"

    def measure(self, run: PeerRun, n: int) -> dict:
        g0 = dynamo_graphs()
        step = compiled_oracle_step(run.oracle)
        tf, _ = oracle_greedy(run.oracle, run.prompt, n, step=step, compiled=True,
                              forced=run.ref_ids)
        mode = step.mode or "default"
        note = step.note or f"torch.compile(mode={mode!r}, backend={step.backend!r})"
        r = run.row(self.name, n, check_tokens(run.ref_logits, tf), note)
        if not r.get("refused"):
            ids, _ = compiled_oracle_greedy(run.oracle, run.prompt, n, step)
            info = {}
            run.timed(r, compiled_oracle_step_ms(run.oracle, run.ctx, run.iters, run.device,
                                                 step=step, info=info), info)
            r["agree_free"] = str(agree.agreement(ids, run.ref_ids))
        r["graphs"] = dynamo_graphs() - g0  # new graphs: 1 (0 if reused), never more
        return r


PEERS: dict[str, Peer] = {p.name: p for p in (
    HFGenerate("HF eager", "eager", slow=True), HFGenerate("HF static", "static"),
    OracleEager(), OracleCompiled(), LlamaBench())}
RUNGS = tuple(PEERS)      # the peer rungs, in the ladder's order


def peer_rungs(spec, ctx: int = 512, device="cuda", iters: int = 50,
               new_tokens: int = 64, seed: int = 0, eager_new_tokens: int | None = None,
               rungs=RUNGS, weights=None, hf_attn: str = "sdpa", prompt=None, ref=None,
               read_tbps: float | None = None) -> list[dict]:
    """Check, then measure, the peer rungs of one model at context ``ctx``: ladder rows
    ``{model, rung, ctx, ms_per_token, floor_ms, agree, read_tbps, prompt, ...}``.

    Random weights are built once (bf16 on a GPU, fp32 on the CPU) and shared by every
    rung; pass ``weights`` to reuse a dict (``bench`` passes the run's own, bf16 on the
    CPU too, so that its peers and rungs share one oracle run). Each peer is first teacher-forced along the
    eager oracle's greedy tokens over the same prompt and judged by the agreement rule
    (:mod:`onelaunch.measure.agree`): ``agree`` is "k/N" over every step, ``flips`` lists
    each step that differs (both logits, the gap, the verdict), and a peer with a real
    flip is refused (``refused``, no time), as our rungs are. ``agree_free`` is the prefix
    its free-running timed run shares with the oracle. HF eager runs ``eager_new_tokens``
    (default: 32 on a GPU, where it is slow, else ``new_tokens``); the other rungs
    ``new_tokens``. ``hf_attn`` is the HF rungs' attention (sdpa, as a user runs it).

    One run: ``prompt`` (default: ``random_prompt(spec, ctx, seed)``), ``ref`` (the
    oracle's greedy ``(ids, logits)`` over it, at least as many tokens as any peer
    checks; default: computed here) and ``read_tbps`` (the run's bandwidth; default:
    measured here on a GPU, none on the CPU) are shared by every peer."""
    cuda = torch.device(device).type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    if eager_new_tokens is None:
        eager_new_tokens = min(32, new_tokens) if cuda else new_tokens
    bad = [r for r in rungs if r not in PEERS]
    if bad:
        raise ValueError(f"unknown rungs {bad}; known: {RUNGS}")
    max_ctx = ctx + max(new_tokens, eager_new_tokens) + 1
    if max_ctx > spec.max_ctx:
        raise ValueError(f"ctx {ctx} + {new_tokens} new tokens exceeds {spec.name}'s "
                         f"max_ctx {spec.max_ctx}")
    if weights is None:
        weights = random_weights(spec, seed=seed, device=device, dtype=dtype)
    if read_tbps is None:
        read_tbps = run_bandwidth(device)
    prompt = random_prompt(spec, ctx, seed, device) if prompt is None else prompt.to(device)
    oracle = Oracle(spec, weights, max_ctx=max_ctx).eval()
    n_ref = max(new_tokens, eager_new_tokens)
    if ref is None:
        ref_ids, _, ref_logits = oracle_greedy(oracle, prompt, n_ref, return_logits=True)
    else:
        ref_ids, ref_logits = ref
        if ref_ids.numel() < n_ref:
            raise ValueError(f"the oracle's reference has {ref_ids.numel()} tokens; the "
                             f"peers check {n_ref}")
    ref_ids = torch.as_tensor(ref_ids).to(oracle.device)
    run = PeerRun(spec, weights, device, ctx, iters, seed, prompt, ref_ids, ref_logits,
                  oracle, read_tbps, hf_attn)
    rows = []
    for name in rungs:
        peer = PEERS[name]
        row = peer.measure(run, peer.tokens(new_tokens, eager_new_tokens))
        if row is not None:                 # None: cannot run here (said in one line)
            rows.append(row)
    return rows
