"""The ladder file's rows (``results/<gpu>/ladder.json``): which GPU's file, which run,
which rows a chapter may draw (:func:`chapter_rows`: its own run's, of itself and the
chapters before it), the order of the rungs, their labels, and each model's floor and
best peer.

Rows come from ``results/<gpu>/ladder.json`` (see :mod:`onelaunch.report.results`). Rung order:
the peers first, in :data:`PEER_RUNGS` order, then ours, by the row's ``order`` field if
it has one, else in the order the rungs first appear in the file. A new rung written by a
later chapter therefore shows up as a new frame with no change here. Optional row fields:
``label`` (shown instead of the rung name), ``peer`` (true for a peer not in
:data:`PEER_RUNGS`), ``order``. A row whose oracle check failed (``agree`` short of full,
or no ``ms_per_token``) is drawn as "check failed", never as a number.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from . import results as _results
from .results import attach_reference_flips, run_key, this_run
from .results import row_passes as row_ok


# the peers, in the order the slider shows them (chapters 1, 2 and 8 measure them)
PEER_RUNGS = ("HF eager", "HF static", "oracle eager", "oracle compiled", "gpt-fast compiled")
RUNG_LABELS = {
    "HF eager": "HF generate, eager",
    "HF static": "HF generate, static cache",
    "oracle eager": "oracle, eager",
    "oracle compiled": "oracle, torch.compile",
}


PREFERRED_GPUS = ("h200",)


def _root(root) -> Path:
    """``root``, or the results folder (looked up at call time, so a test can move it)."""
    return Path(root) if root is not None else _results.RESULTS


def ladder_sources(root: Path | None = None) -> list[str]:
    """GPU slugs that have a ladder, best first: the preferred GPUs, any other GPU, then
    the CPU smoke run."""
    have = sorted(p.parent.name for p in _root(root).glob("*/ladder.json"))
    rank = lambda g: (0 if g in PREFERRED_GPUS else 2 if g == "cpu" else 1, g)
    return sorted(have, key=rank)


def load_ladder(gpu: str | None = None, root: Path | None = None) -> dict | None:
    """The ladder file of ``gpu`` (default: the best source there is), or ``None``."""
    if gpu is None:
        srcs = ladder_sources(root)
        if not srcs:
            return None
        gpu = srcs[0]
    p = _root(root) / gpu / "ladder.json"
    if not p.exists():
        return None
    data = json.loads(p.read_text())
    data.setdefault("meta", {}).setdefault("gpu", gpu)
    _attach_reference_flips(data, _root(root) / gpu / "oracle_check.json")
    return data


def chapter_rows(chapter: str, device="cuda", ctx: int | None = None,
                 models=None, root: Path | None = None) -> list[dict]:
    """The ladder rows chapter ``chapter`` (its notebook's stem) may draw: rows of this
    process's run (:func:`onelaunch.report.results.this_run`), written by this chapter
    or one before it (a row's ``chapter``; rows that name none pass), at context
    ``ctx`` and of ``models`` where given. A row of another run, or of a later chapter
    of this run, is never drawn: a figure shows what its chapter's run had made."""
    data = load_ladder(_results.gpu_slug(device), root)
    if data is None:
        return []
    run = this_run()
    return [r for r in data.get("rows", [])
            if run_key(r) == run and str(r.get("chapter") or "") <= chapter
            and (ctx is None or r.get("ctx") == ctx)
            and (models is None or r.get("model") in models)]


def _attach_reference_flips(data: dict, check_path: Path) -> None:
    """The "oracle eager" row's ``agree`` is the oracle against Hugging Face (chapter 2);
    its disagreements, with HF's logit gap at each, live in ``oracle_check.json``."""
    if check_path.exists():
        attach_reference_flips(data.get("rows", []),
                               json.loads(check_path.read_text()).get("rows", []))


def is_peer(row_or_rung) -> bool:
    if isinstance(row_or_rung, dict):
        return bool(row_or_rung.get("peer")) or row_or_rung["rung"] in PEER_RUNGS
    return row_or_rung in PEER_RUNGS


def rung_order(rows: list[dict]) -> list[str]:
    """Peers first (in :data:`PEER_RUNGS` order), then ours (by ``order``, then first
    appearance)."""
    first, order, peer = {}, {}, {}
    for i, r in enumerate(rows):
        g = r["rung"]
        first.setdefault(g, i)
        if "order" in r:
            order[g] = r["order"]
        peer[g] = peer.get(g, False) or is_peer(r)
    known = {g: i for i, g in enumerate(PEER_RUNGS)}
    def key(g):
        if peer[g]:
            return (0, known.get(g, len(known)), first[g])
        return (1, order.get(g, math.inf), first[g])
    return sorted(first, key=key)


def pick_ctx(rows: list[dict]) -> int | None:
    """The context length with the most rows (the one the chapters share)."""
    counts = {}
    for r in rows:
        counts[r["ctx"]] = counts.get(r["ctx"], 0) + 1
    return max(counts, key=lambda c: (counts[c], c)) if counts else None


def summary(rows: list[dict], model: str) -> dict:
    """Floor and best peer for one model, from the same run's rows: the floor is the
    median of the floors its rows recorded; the best peer the fastest peer that passed
    its check."""
    mine = [r for r in rows if r["model"] == model]
    floors = sorted(r["floor_ms"] for r in mine if isinstance(r.get("floor_ms"), (int, float)))
    floor = floors[len(floors) // 2] if floors else None
    peers = [r for r in mine if is_peer(r) and row_ok(r)]
    best = min(peers, key=lambda r: r["ms_per_token"]) if peers else None
    return {"floor_ms": floor, "best_peer": best}


def label(row_or_rung, rows=()) -> str:
    g = row_or_rung["rung"] if isinstance(row_or_rung, dict) else row_or_rung
    for r in rows:
        if r["rung"] == g and r.get("label"):
            return r["label"]
    return RUNG_LABELS.get(g, g)


def one_run(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(rows of one run, rows left out). The run kept is the one with the most rows (the
    latest by date among equals): a page never mixes measurements of two runs."""
    groups: dict = {}
    for r in rows:
        groups.setdefault(run_key(r), []).append(r)
    if len(groups) <= 1:
        return list(rows), []
    keep = max(groups, key=lambda g: (len(groups[g]), str(g)))
    return groups[keep], [r for g, rs in groups.items() if g != keep for r in rs]


def _reference_flips_for(rows: list[dict], root: Path | None = None) -> list[dict]:
    """``rows`` with each "oracle eager" row judged by its check against HF: the
    disagreements come from an ``oracle_check.json`` of the same commit."""
    rows = [dict(r) for r in rows]
    for p in sorted(_root(root).glob("*/oracle_check.json")):
        data = json.loads(p.read_text())
        commit = data.get("meta", {}).get("commit")
        same = [r for r in rows if r.get("commit") in (None, commit)]
        attach_reference_flips(same, data.get("rows", []))
    return rows
