"""The ladder slider: ms/token of every rung so far, one pre-rendered frame per rung.

An ``IntSlider`` over the rungs is linked with ``jslink`` to a ``Stack`` of ``Image``
widgets, so moving it needs no kernel: the static book page switches frames in the
browser (the widget JavaScript is served from the book's ``_static/``). Frame *k* draws
the rungs 0..k for each model, with two reference lines measured in the same run: the
bandwidth floor and the best peer (the fastest thing a user could pick instead).

Rows come from ``results/<gpu>/ladder.json`` (see :mod:`onelaunch.results`). Rung order:
the peers first, in :data:`PEER_RUNGS` order, then ours, by the row's ``order`` field if
it has one, else in the order the rungs first appear in the file. A new rung written by a
later chapter therefore shows up as a new frame with no change here. Optional row fields:
``label`` (shown instead of the rung name), ``peer`` (true for a peer not in
:data:`PEER_RUNGS`), ``order``. A row whose oracle check failed (``agree`` short of full,
or no ``ms_per_token``) is drawn as "check failed", never as a number.
"""
from __future__ import annotations

import io
import json
import math
from pathlib import Path

from .results import RESULTS
from .results import NEAR_TIE, agree_ok, flips_are_near_ties  # noqa: F401  (re-exported)
from .results import row_passes as row_ok

# the peers, in the order the slider shows them (chapters 1 and 2 measure them)
PEER_RUNGS = ("HF eager", "HF static", "oracle eager", "oracle compiled")
RUNG_LABELS = {
    "HF eager": "HF generate, eager",
    "HF static": "HF generate, static cache",
    "oracle eager": "oracle, eager",
    "oracle compiled": "oracle, torch.compile",
}
PREFERRED_GPUS = ("h200",)


# ---- reading the ladder ---------------------------------------------------------------
def ladder_sources(root: Path = RESULTS) -> list[str]:
    """GPU slugs that have a ladder, best first: the preferred GPUs, any other GPU, then
    the CPU smoke run."""
    have = sorted(p.parent.name for p in Path(root).glob("*/ladder.json"))
    rank = lambda g: (0 if g in PREFERRED_GPUS else 2 if g == "cpu" else 1, g)
    return sorted(have, key=rank)


def load_ladder(gpu: str | None = None, root: Path = RESULTS) -> dict | None:
    """The ladder file of ``gpu`` (default: the best source there is), or ``None``."""
    if gpu is None:
        srcs = ladder_sources(root)
        if not srcs:
            return None
        gpu = srcs[0]
    p = Path(root) / gpu / "ladder.json"
    if not p.exists():
        return None
    data = json.loads(p.read_text())
    data.setdefault("meta", {}).setdefault("gpu", gpu)
    _attach_reference_flips(data, Path(root) / gpu / "oracle_check.json")
    return data


def _attach_reference_flips(data: dict, check_path: Path) -> None:
    """The "oracle eager" row's ``agree`` is the oracle against Hugging Face (chapter 2);
    its disagreements, with HF's logit gap at each, live in ``oracle_check.json``."""
    if not check_path.exists():
        return
    checks = {r["model"]: r for r in json.loads(check_path.read_text()).get("rows", [])}
    for r in data.get("rows", []):
        c = checks.get(r.get("model"))
        if r.get("rung") == "oracle eager" and r.get("flips") is None and c is not None \
                and c.get("agree") == r.get("agree"):
            r["flips"] = [{"step": d["step"], "margin": d["hf_gap"], "near_tie_below": NEAR_TIE}
                          for d in c.get("disagreements", [])]


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


# ---- drawing --------------------------------------------------------------------------
def render_frame(rows: list[dict], rungs: list[str], k: int, models: list[str],
                 title: str = "", smoke: bool = False, dpi: int = 80,
                 head: str | None = None) -> bytes:
    """PNG of frame ``k``: rungs[0..k] for each model, with floor and best-peer lines.
    Every frame has the same axes, so moving the slider only adds bars."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rungs)
    fig, axes = plt.subplots(len(models), 1, figsize=(8.6, 0.9 + (0.42 * n + 0.9) * len(models)),
                             dpi=dpi, squeeze=False)
    for ax, model in zip(axes[:, 0], models):
        mine = {r["rung"]: r for r in rows if r["model"] == model}
        s = summary(rows, model)
        vals = [r["ms_per_token"] for r in mine.values() if row_ok(r)]
        refs = [v for v in (s["floor_ms"], s["best_peer"] and s["best_peer"]["ms_per_token"])
                if v and v > 0]
        allv = vals + refs or [1.0]
        lo, hi = min(allv) / 2.2, max(allv) * 12
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        ax.set_ylim(n - 0.5, -0.5)
        ax.set_yticks(range(n))
        ax.set_yticklabels([label(g, rows) for g in rungs], fontsize=9)
        for i, g in enumerate(rungs):
            if i > k:
                ax.get_yticklabels()[i].set_alpha(0.25)
                continue
            r = mine.get(g)
            color = "#8c8c8c" if is_peer(g) or (r and is_peer(r)) else "#1f6fb4"
            if i == k:
                color = "#d9480f" if color == "#1f6fb4" else "#555555"
            if r is None:
                ax.text(lo * 1.1, i, "not measured for this model", va="center", fontsize=8,
                        color="#777777")
            elif not row_ok(r):
                why = (f"failed the oracle check ({r.get('agree')}): no time shown"
                       if r.get("agree") is not None and not agree_ok(r.get("agree"))
                       else "no valid time measured")
                ax.barh(i, hi, left=lo, color="none", hatch="//", edgecolor="#c92a2a", lw=0)
                ax.text(lo * 1.1, i, why, va="center", fontsize=8, color="#c92a2a")
            else:
                v = r["ms_per_token"]
                ax.barh(i, v - lo, left=lo, color=color, height=0.62)
                txt = f"{v:.3g} ms"
                if not agree_ok(r.get("agree")) and r.get("agree") is not None:
                    txt += f", {r['agree']} + near ties"
                if s["floor_ms"]:
                    txt += f"  ({v / s['floor_ms']:.2f}x floor)"
                ax.text(v * 1.06, i, txt, va="center", fontsize=8)
        if s["floor_ms"]:
            ax.axvline(s["floor_ms"], color="black", ls="--", lw=1.2,
                       label=f"bandwidth floor {s['floor_ms']:.3g} ms")
        if s["best_peer"]:
            bp = s["best_peer"]
            ax.axvline(bp["ms_per_token"], color="#e67700", ls=":", lw=1.6,
                       label=f"best peer: {label(bp, rows)} {bp['ms_per_token']:.3g} ms")
        ctx = next(iter(mine.values()), {}).get("ctx", "")
        ax.set_title(f"{model}, context {ctx}", fontsize=10, loc="left", pad=18)
        ax.set_xlabel("ms per token (log scale; shorter is faster)", fontsize=9)
        ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, fontsize=8,
                  frameon=False, borderaxespad=0.2)
        ax.grid(axis="x", which="both", alpha=0.2)
    if head is None:
        head = f"rung {k + 1} of {n}: {label(rungs[k], rows)}"
    if smoke:
        head += "\nCPU SMOKE RUN, NOT A MEASUREMENT (tiny models on a CPU)"
    fig.suptitle(head + (f"\n{title}" if title else ""), fontsize=10,
                 color="#c92a2a" if smoke else "black", x=0.01, ha="left")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def ladder_figure(rows: list[dict], smoke: bool = False, title: str = "",
                  head: str = "", dpi: int = 90):
    """One static picture of every rung in ``rows`` (a chapter's own rows), as an
    IPython image: the last frame of the slider, drawn from the same rows."""
    from IPython.display import Image
    models = list(dict.fromkeys(r["model"] for r in rows))
    rungs = rung_order(rows)
    png = render_frame(rows, rungs, len(rungs) - 1, models, title, smoke, dpi, head=head)
    return Image(png)


def ladder_frames(data: dict, ctx: int | None = None, models: list[str] | None = None):
    """(rungs, frames, info) for a ladder file's rows at one context length."""
    rows = [r for r in data.get("rows", []) if "rung" in r and "model" in r]
    ctx = pick_ctx(rows) if ctx is None else ctx
    rows = [r for r in rows if r["ctx"] == ctx]
    if models is None:
        models = list(dict.fromkeys(r["model"] for r in rows))
    rows = [r for r in rows if r["model"] in models]
    rungs = rung_order(rows)
    meta = data.get("meta", {})
    smoke = meta.get("gpu") == "cpu"
    title = (f"{meta.get('gpu_name', meta.get('gpu', '?'))}, torch {meta.get('torch', '?')}, "
             f"triton {meta.get('triton', '?')}, {str(meta.get('date', ''))[:10]}")
    frames = [render_frame(rows, rungs, k, models, title, smoke) for k in range(len(rungs))]
    return rungs, frames, {"ctx": ctx, "models": models, "smoke": smoke, "meta": meta,
                           "rows": rows}


def ladder_slider(gpu: str | None = None, ctx: int | None = None,
                  models: list[str] | None = None, root: Path = RESULTS):
    """The widget: a slider over the rungs, jslinked to a Stack of pre-rendered frames.
    Starts on the last rung. Returns ``None`` when there is no ladder yet."""
    import ipywidgets as w
    data = load_ladder(gpu, root)
    if data is None or not data.get("rows"):
        return None
    rungs, frames, info = ladder_frames(data, ctx, models)
    images = [w.Image(value=png, format="png", layout=w.Layout(width="100%", max_width="760px"))
              for png in frames]
    stack = w.Stack(images, selected_index=len(images) - 1)
    slider = w.IntSlider(value=len(images) - 1, min=0, max=len(images) - 1, step=1,
                         description="rung", continuous_update=True, readout=False,
                         layout=w.Layout(width="min(100%, 560px)"))
    w.jslink((slider, "value"), (stack, "selected_index"))
    box = w.VBox([slider, stack])
    box.add_class("onelaunch-ladder")
    box._onelaunch_info = {**info, "rungs": rungs}
    return box
