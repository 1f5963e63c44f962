"""Figures, in one style: every figure here and in :mod:`.profile_figures` is drawn at
:data:`DPI` with no text under :data:`FONT` points, :data:`FIG_W` (the ladder's frames)
or :data:`PAGE_W` (a page's text width) inches wide, and each comes with a caption
generated from the same rows.

The ladder's frame (:func:`render_frame`, one per rung for the slider of
:mod:`.widgets`; :func:`ladder_figure`, the last frame with its caption, for a chapter),
and the kernel and sweep figures. A row whose oracle check failed is drawn as "check
failed", never as a number (:func:`onelaunch.report.results.check_status`).
"""
from __future__ import annotations

import io

from .ladder_file import _reference_flips_for, label, rung_order, summary, is_peer
from .results import agree_ok, check_status
from .results import row_passes as row_ok


DPI = 150                # every figure: 150 dpi or more
FONT = 10                # points, the smallest text in a figure


FIG_W = 7.9              # inches: shown about 760 px wide, so 10 pt reads as 10 pt
PAGE_W = 6.5             # inches: a page's text width (the profile's figures)
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


def ladder_figure(rows: list[dict], smoke: bool = False, title: str = "",
                  head: str = "", dpi: int = DPI):
    """One static picture of every rung in ``rows`` (a chapter's own rows), followed by
    a caption generated from the same rows: the last frame of the slider."""
    rows = _reference_flips_for(rows)
    models = list(dict.fromkeys(r["model"] for r in rows))
    rungs = rung_order(rows)
    png = render_frame(rows, rungs, len(rungs) - 1, models, title, smoke, dpi, head=head)
    return _Figure(png, figure_caption(rows, rungs, models))


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return buf.getvalue()


def _head(fig, head: str, smoke: bool, fig_h: float, note: str):
    lines = [head] + ([f"CPU SMOKE RUN, NOT A MEASUREMENT ({note})"] if smoke else [])
    fig.text(0.012, 1 - 0.12 / fig_h, "\n".join(lines), va="top", ha="left",
             fontsize=FONT + 1, color="#c92a2a" if smoke else "black", linespacing=1.35)


def bandwidth_figure(rows: list[dict], read_tbps: float, head: str = "", smoke: bool = False,
                     highlight=("attention (plain)",)):
    """Chapter 3's kernels: each kernel's bytes over its time (GB/s, whole numbers), with
    the streaming-read bandwidth of the same run as a dashed line; the values sit right of
    the axes, where the line does not cross them. ``rows``: ``bench.kernel_rows`` rows
    (``kernel``, ``gbps``, ``pct_of_read``, ``bytes``); rows with no time are left out and
    named in the caption."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    shown = [r for r in rows if r.get("gbps") is not None]
    n = max(1, len(shown))
    head_h = 0.1 + 0.2 * (1 + bool(smoke))
    ax_h, above, below = 0.42 * n + 0.2, 0.4, 0.6
    fig_h = head_h + above + ax_h + below
    label_w = 0.12 + 0.075 * max([len(r["kernel"]) for r in shown] + [8])   # 10 pt text
    fig = plt.figure(figsize=(FIG_W, fig_h), dpi=DPI)
    ax = fig.add_axes([label_w / FIG_W, below / fig_h,
                       (FIG_W - label_w - VALUE_W) / FIG_W, ax_h / fig_h])
    read = read_tbps * 1e3
    ys = list(range(len(shown)))
    ax.barh(ys, [r["gbps"] for r in shown], height=0.62,
            color=["#c92a2a" if r["kernel"] in highlight else "#1f6fb4" for r in shown])
    side = ax.get_yaxis_transform()
    for y, r in zip(ys, shown):
        ax.text(1.03, y - 0.2, f"{r['gbps']:,.0f} GB/s, {r['pct_of_read']:.0f}%",
                transform=side, va="center", fontsize=FONT, clip_on=False)
        size = (f"{r['bytes'] / 1e6:.3g} MB" if r["bytes"] >= 1e6
                else f"{r['bytes'] / 1e3:.3g} kB")
        ax.text(1.03, y + 0.22, size, transform=side, va="center",
                fontsize=FONT, color="#555555", clip_on=False)
    ax.axvline(read, color="black", ls="--", lw=1.2,
               label=f"streaming read, this run: {read:,.0f} GB/s")
    ax.set_yticks(ys)
    ax.set_yticklabels([r["kernel"] for r in shown], fontsize=FONT)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlim(0, max([read] + [r["gbps"] for r in shown]) * 1.08)
    ax.tick_params(axis="x", labelsize=FONT)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.set_xlabel("GB/s (bytes the kernel must move / its time)", fontsize=FONT)
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), fontsize=FONT, frameon=False,
              borderaxespad=0.1)
    ax.grid(axis="x", alpha=0.2)
    _head(fig, head, smoke, fig_h, "Triton interpreter, tiny model")
    missing = [r["kernel"] for r in rows if r.get("gbps") is None]
    best = max(shown, key=lambda r: r["pct_of_read"]) if shown else None
    cap = (f"The figure draws {len(shown)} kernels" + (
        f"; the closest to the read bandwidth is {best['kernel']}, at "
        f"{best['pct_of_read']:.0f}%" if best else "") +
        (f"; not timed (check failed): {', '.join(missing)}" if missing else "") + ".")
    return _Figure(_png(fig), cap)


def sweep_figure(rows: list[dict], head: str = "", smoke: bool = False):
    """Chapter 5's sweep: ms per token of the final step against the context, with the
    floor of the same run; each point's ratio to the floor on a white ground above it, so
    no line crosses a label. ``rows``: ``bench.sweep_rows`` rows."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    head_h = 0.1 + 0.2 * (1 + bool(smoke))
    fig_h = head_h + 4.0
    fig = plt.figure(figsize=(FIG_W, fig_h), dpi=DPI)
    ax = fig.add_axes([0.9 / FIG_W, 0.65 / fig_h, (FIG_W - 1.1) / FIG_W, 3.0 / fig_h])
    cs = [r["ctx"] for r in rows]
    ms = [r["ms_per_token"] for r in rows]
    ax.plot(cs, ms, "o-", color="#1f6fb4", label=f"{rows[0]['rung']} (graph)" if rows else "")
    ax.plot(cs, [r["floor_ms"] for r in rows], "s--", color="black",
            label="bandwidth floor, this run")
    for r in rows:
        ax.annotate(f"{r['x_floor']:.2f}x", (r["ctx"], r["ms_per_token"]),
                    textcoords="offset points", xytext=(0, 9), ha="center", fontsize=FONT,
                    bbox=dict(boxstyle="square,pad=0.1", fc="white", ec="none"), zorder=5)
    ax.set_xscale("log", base=2)
    ax.set_xticks(cs)
    ax.set_xticklabels([f"{c:,}" for c in cs], fontsize=FONT)
    ax.tick_params(axis="y", labelsize=FONT)
    ax.set_ylim(0, max(ms + [1e-9]) * 1.25)
    ax.set_xlabel("context (tokens, log scale)", fontsize=FONT)
    ax.set_ylabel("ms per token", fontsize=FONT)
    ax.legend(fontsize=FONT, frameon=False, loc="lower right")
    ax.grid(alpha=0.2)
    _head(fig, head, smoke, fig_h, "Triton interpreter, tiny model, no graph")
    xs = [r["x_floor"] for r in rows]
    cap = (f"The figure draws the step at {len(rows)} contexts, from {min(cs):,} to "
           f"{max(cs):,} tokens: between {min(xs):.2f} and {max(xs):.2f} times the floor."
           if rows else "No sweep rows.")
    return _Figure(_png(fig), cap)
