"""The book's answer in one figure (the introduction's): for each model, our chain, the
one launch, the strongest compiled peer and llama.cpp, in milliseconds per token,
against the floor of the same run; drawn from :func:`onelaunch.report.answer.answer`
in the book's one figure style (:mod:`.figures`), with a caption written from the same
numbers (:mod:`.wording` says which is faster).
"""
from __future__ import annotations

import io

from . import answer as _answer
from .figures import DPI, FONT, PAGE_W, PEER_C, _Figure
from .ladder_file import label
from .wording import faster

OURS_C = "#dd8452"           # the book's accent: ours
LABEL_W, VALUE_W = 2.2, 1.55  # inches: names left of the bars, values right of them


def bars(a: dict) -> list[tuple[str, dict | None, bool]]:
    """(label, row or None, ours) of one model's bars, top to bottom: the chain, the one
    launch, the strongest compiled peer, llama.cpp."""
    best, one = a["best"], a["one_launch"]
    c = a["compiled"]
    return [(f"the chain ({best['rung']})" if best else "the chain", best, True),
            ("one launch (megakernel)", one, True),
            (label(c) if c else "compiled peer", c, False),
            ("llama.cpp", a["llama"] if a["llama"] and a["llama"].get("ms_per_token")
             else None, False)]


def draw(ans: dict):
    """The figure and its caption (a :class:`onelaunch.report.figures._Figure`)."""
    from matplotlib.figure import Figure

    models = list(ans["models"])
    pitch, above, below = 0.34, 0.45, 0.5
    ax_h = pitch * 4 + 0.1
    fig_h = 0.25 + len(models) * (above + ax_h + below)
    fig = Figure(figsize=(PAGE_W, fig_h), dpi=DPI)
    top_ms = max([r["ms_per_token"] for a in ans["models"].values()
                  for _, r, _ in bars(a) if r] + [1.0])
    for i, m in enumerate(models):
        a = ans["models"][m]
        top = 0.25 + i * (above + ax_h + below) + above
        ax = fig.add_axes([LABEL_W / PAGE_W, 1 - (top + ax_h) / fig_h,
                           (PAGE_W - LABEL_W - VALUE_W) / PAGE_W, ax_h / fig_h])
        side = ax.get_yaxis_transform()
        shown = bars(a)
        for y, (text, r, ours) in enumerate(shown):
            if r is None:
                ax.text(1.03, y, "not in this run", transform=side, va="center",
                        fontsize=FONT, color="#777777", clip_on=False)
                continue
            ax.barh(y, r["ms_per_token"], color=OURS_C if ours else PEER_C, height=0.62)
            x = _answer.x_floor(r, a["floor_ms"])
            ax.text(1.03, y, f"{r['ms_per_token']:.3g} ms, {x:.2f}x",
                    transform=side, va="center", fontsize=FONT, clip_on=False)
        if a["floor_ms"]:
            ax.axvline(a["floor_ms"], color="black", ls="--", lw=1.2)
            ax.text(a["floor_ms"], -0.75, f" floor {a['floor_ms']:.3g} ms", fontsize=FONT,
                    va="bottom", ha="left")
        ax.set_xlim(0, top_ms * 1.08)
        ax.set_ylim(len(shown) - 0.5, -0.5)
        ax.set_yticks(range(len(shown)))
        ax.set_yticklabels([t for t, _, _ in shown], fontsize=FONT)
        ax.tick_params(axis="x", labelsize=FONT)
        ax.grid(axis="x", alpha=0.2)
        fig.text(0.012, 1 - (top - above + 0.08) / fig_h,
                 f"{_answer.name(m)}, context {a['ctx']}", va="top", ha="left",
                 fontsize=FONT + 1, fontweight="bold")
        if i == len(models) - 1:
            ax.set_xlabel("ms per token, batch 1 (shorter is faster); x: its floor",
                          fontsize=FONT)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return _Figure(buf.getvalue(), caption(ans))


def caption(ans: dict) -> str:
    """What the figure shows and, per model, how the chain stands against the fastest
    peer, from the same numbers (the one launch against the chain is the introduction's
    prose, in :func:`onelaunch.report.chapter.compare`'s words)."""
    parts = [f"Milliseconds per token for one request on one {ans['gpu_name']}: ours in "
             "orange, the peers a user would pick in grey, the floor of the same run "
             "dashed; beside each bar its ratio to the floor. llama.cpp is timed by its "
             "own llama-bench, with no oracle check possible."]
    for m, a in ans["models"].items():
        best = a["best"]
        if not best:
            continue
        rivals = [r for _, r, ours in bars(a)[1:] if r is not None]
        fastest_peer = min((r for r in rivals if r["rung"] != _answer.MEGA),
                           key=lambda r: r["ms_per_token"], default=None)
        s = f"{_answer.name(m)}: the chain"
        if fastest_peer:
            s = faster(best["ms_per_token"], fastest_peer["ms_per_token"], s,
                       f"the fastest peer ({label(fastest_peer)})")
        parts.append(s + ".")     # the one launch against the chain: the page's prose
    return " ".join(parts)
