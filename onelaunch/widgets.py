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
from .results import attach_reference_flips, check_status
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


# ---- drawing --------------------------------------------------------------------------
DPI = 150                # every figure: 150 dpi or more
FONT = 10                # points, the smallest text in a figure
FIG_W = 7.9              # inches: shown about 760 px wide, so 10 pt reads as 10 pt
LABEL_W, VALUE_W = 2.1, 1.65    # inches: rung names left of the bars, values right of them


def _short_x(x: float) -> str:
    return f"{x:.3g}x"


def value_text(r: dict, floor_ms: float | None) -> tuple[str, str | None, str]:
    """What a figure writes beside a rung: (first line, second line or None, colour),
    from the same fields and the same rule (:func:`~onelaunch.results.check_status`) as
    the ladder page's table."""
    status = check_status(r)
    if status == "refused":
        why = (f"check failed ({r.get('agree')})" if r.get("agree") is not None
               and not agree_ok(r.get("agree")) else "no valid time")
        return "no time shown", why, "#c92a2a"
    v = r["ms_per_token"]
    first = f"{v:.3g} ms" + (f", {_short_x(v / floor_ms)} floor" if floor_ms else "")
    second = f"{r['agree']}, near ties" if status == "near ties only" else None
    return first, second, "black"


def render_frame(rows: list[dict], rungs: list[str], k: int, models: list[str],
                 title: str = "", smoke: bool = False, dpi: int = DPI,
                 head: str | None = None) -> bytes:
    """PNG of frame ``k``: rungs[0..k] for each model, with floor and best-peer lines.
    Every frame has the same size and axes, so moving the slider only adds bars. Values
    sit in a column right of the axes, where no reference line crosses them."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    n = len(rungs)
    pitch = 0.42                                   # inches per rung
    ax_h = pitch * n + 0.25
    above, below, head_h = 0.8, 0.55, 0.25 + 0.2 * (1 + bool(smoke) + bool(title))
    fig_h = head_h + len(models) * (above + ax_h + below)
    fig = plt.figure(figsize=(FIG_W, fig_h), dpi=max(dpi, DPI))
    for m_i, model in enumerate(models):
        top = head_h + m_i * (above + ax_h + below) + above
        ax = fig.add_axes([LABEL_W / FIG_W, 1 - (top + ax_h) / fig_h,
                           (FIG_W - LABEL_W - VALUE_W) / FIG_W, ax_h / fig_h])
        mine = {r["rung"]: r for r in rows if r["model"] == model}
        s = summary(rows, model)
        vals = [r["ms_per_token"] for r in mine.values() if row_ok(r)]
        refs = [v for v in (s["floor_ms"], s["best_peer"] and s["best_peer"]["ms_per_token"])
                if v and v > 0]
        allv = vals + refs or [1.0]
        lo, hi = min(allv) / 1.6, max(allv) * 1.6
        ax.set_xscale("log")
        ax.set_xlim(lo, hi)
        # plain numbers on the log axis: matplotlib labels minor ticks "2x10^0" when a
        # range spans less than a decade, and they overlap; keep only a few, plainly
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(n - 0.5, -0.5)
        ax.set_yticks(range(n))
        ax.set_yticklabels([label(g, rows) for g in rungs], fontsize=FONT)
        ax.tick_params(axis="x", labelsize=FONT)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        side = ax.get_yaxis_transform()            # x in axes coordinates, y in data
        for i, g in enumerate(rungs):
            if i > k:
                ax.get_yticklabels()[i].set_alpha(0.3)
                continue
            r = mine.get(g)
            color = "#8c8c8c" if is_peer(g) or (r and is_peer(r)) else "#1f6fb4"
            if i == k:
                color = "#d9480f" if color == "#1f6fb4" else "#555555"
            if r is None:
                ax.text(1.03, i, "not measured", transform=side, va="center", fontsize=FONT,
                        color="#777777", clip_on=False)
                continue
            first, second, tcolor = value_text(r, s["floor_ms"])
            if not row_ok(r):
                ax.barh(i, hi - lo, left=lo, height=0.62, color="none", hatch="//",
                        edgecolor="#c92a2a", lw=0)
            else:
                ax.barh(i, r["ms_per_token"] - lo, left=lo, color=color, height=0.62)
            if second:
                ax.text(1.03, i - 0.2, first, transform=side, va="center", fontsize=FONT,
                        color=tcolor, clip_on=False)
                ax.text(1.03, i + 0.22, second, transform=side, va="center", fontsize=FONT,
                        color="#c92a2a" if tcolor != "black" else "#555555", clip_on=False)
            else:
                ax.text(1.03, i, first, transform=side, va="center", fontsize=FONT,
                        color=tcolor, clip_on=False)
        if s["floor_ms"]:
            ax.axvline(s["floor_ms"], color="black", ls="--", lw=1.2,
                       label=f"bandwidth floor, {s['floor_ms']:.3g} ms")
        if s["best_peer"]:
            bp = s["best_peer"]
            ax.axvline(bp["ms_per_token"], color="#e67700", ls=":", lw=1.8,
                       label=f"best peer, {label(bp, rows)}: {bp['ms_per_token']:.3g} ms")
        ctx = next(iter(mine.values()), {}).get("ctx", "")
        fig.text(0.012, 1 - (top - above + 0.05) / fig_h, f"{model}, context {ctx}", va="top",
                 ha="left", fontsize=FONT + 1, fontweight="bold")
        ax.set_xlabel("ms per token (log scale; shorter is faster)", fontsize=FONT)
        if s["floor_ms"] or s["best_peer"]:
            ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=1, fontsize=FONT,
                      frameon=False, borderaxespad=0.1, handlelength=2.2)
        ax.grid(axis="x", which="both", alpha=0.2)
    if head is None:
        head = f"rung {k + 1} of {n}: {label(rungs[k], rows)}"
    lines = [head] + (["CPU SMOKE RUN, NOT A MEASUREMENT (tiny models on a CPU)"] if smoke else []) \
        + ([title] if title else [])
    fig.text(0.012, 1 - 0.12 / fig_h, "\n".join(lines), va="top", ha="left", fontsize=FONT + 1,
             color="#c92a2a" if smoke else "black", linespacing=1.35)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=max(dpi, DPI))
    plt.close(fig)
    return buf.getvalue()


def figure_caption(rows: list[dict], rungs: list[str], models: list[str]) -> str:
    """One sentence per model saying what the figure draws, from the same rows and rule:
    prose about a figure is generated, never typed."""
    parts = []
    for model in models:
        mine = {r["rung"]: r for r in rows if r["model"] == model}
        shown = [g for g in rungs if g in mine]
        st = {g: check_status(mine[g]) for g in shown}
        bars = [g for g in shown if st[g] != "refused"]
        bits = [f"a bar for {len(bars)} of its {len(shown)} rungs" if len(bars) < len(shown)
                else f"a bar for each of its {len(shown)} rungs"]
        ties = [label(g, rows) for g in bars if st[g] == "near ties only"]
        if ties:
            bits.append("differing from the oracle only at near ties: " + "; ".join(ties))
        refused = [f"{label(g, rows)} ({mine[g].get('agree')})" for g in shown if st[g] == "refused"]
        if refused:
            bits.append("hatched, with no time, because the check failed: " + "; ".join(refused))
        missing = [label(g, rows) for g in rungs if g not in mine]
        if missing:
            bits.append("not measured: " + "; ".join(missing))
        parts.append(f"{model}: " + ", ".join(bits) + ".")
    return "The figure draws, " + " ".join(parts)


class _Figure:
    """A figure and its generated caption, displayed one after the other."""

    def __init__(self, png: bytes, caption: str):
        self.png, self.caption = png, caption

    def _ipython_display_(self):
        from IPython.display import Image, Markdown, display
        display(Image(self.png))
        display(Markdown(self.caption))


def _reference_flips_for(rows: list[dict], root: Path = RESULTS) -> list[dict]:
    """``rows`` with each "oracle eager" row judged by its check against HF: the
    disagreements come from an ``oracle_check.json`` of the same commit."""
    rows = [dict(r) for r in rows]
    for p in sorted(Path(root).glob("*/oracle_check.json")):
        data = json.loads(p.read_text())
        commit = data.get("meta", {}).get("commit")
        same = [r for r in rows if r.get("commit") in (None, commit)]
        attach_reference_flips(same, data.get("rows", []))
    return rows


def ladder_figure(rows: list[dict], smoke: bool = False, title: str = "",
                  head: str = "", dpi: int = DPI):
    """One static picture of every rung in ``rows`` (a chapter's own rows), followed by
    a caption generated from the same rows: the last frame of the slider."""
    rows = _reference_flips_for(rows)
    models = list(dict.fromkeys(r["model"] for r in rows))
    rungs = rung_order(rows)
    png = render_frame(rows, rungs, len(rungs) - 1, models, title, smoke, dpi, head=head)
    return _Figure(png, figure_caption(rows, rungs, models))


def run_key(row: dict):
    """The run a row comes from: its ``run`` id where it has one, else its commit."""
    return row.get("run") or row.get("commit")


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


def ladder_frames(data: dict, ctx: int | None = None, models: list[str] | None = None):
    """(rungs, frames, info) for a ladder file's rows of one run at one context length;
    ``info["left_out"]`` lists the rows of other runs, which are not drawn."""
    rows = [r for r in data.get("rows", []) if "rung" in r and "model" in r]
    rows, left_out = one_run(rows)
    ctx = pick_ctx(rows) if ctx is None else ctx
    rows = [r for r in rows if r["ctx"] == ctx]
    if models is None:
        models = list(dict.fromkeys(r["model"] for r in rows))
    rows = [r for r in rows if r["model"] in models]
    rungs = rung_order(rows)
    meta = data.get("meta", {})
    smoke = meta.get("gpu") == "cpu"
    commits = sorted({str(r.get("commit")) for r in rows if r.get("commit")})
    title = (f"{meta.get('gpu_name', meta.get('gpu', '?'))}, torch {meta.get('torch', '?')}, "
             f"triton {meta.get('triton', '?')}"
             + (f", commit {commits[0]}" if len(commits) == 1 else ""))
    frames = [render_frame(rows, rungs, k, models, title, smoke) for k in range(len(rungs))]
    return rungs, frames, {"ctx": ctx, "models": models, "smoke": smoke, "meta": meta,
                           "rows": rows, "left_out": left_out, "commits": commits}


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
