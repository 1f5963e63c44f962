"""Figures, in one style: every figure here and in :mod:`.profile_figures` is drawn at
:data:`DPI` with no text under :data:`FONT` points, :data:`FIG_W` (the ladder's frames)
or :data:`PAGE_W` (a page's text width) inches wide, and each comes with a caption
generated from the same rows. They are drawn on a bare ``matplotlib.figure.Figure``
(no pyplot, no backend switch), so a chapter's own ``plt`` figures after them still
show inline.

The ladder's frame (:func:`render_frame`, one per rung for the slider of
:mod:`.widgets`; :func:`ladder_figure`, the last frame with its caption, for a chapter),
and the kernel and sweep figures. A row whose oracle check failed is drawn as "check
failed", never as a number (:func:`onelaunch.report.results.check_status`).
"""
from __future__ import annotations

import io

from .ladder_file import _reference_flips_for, label, rung_order, summary, is_peer
from .results import NO_CHECK, agree_ok, check_status
from .results import row_passes as row_ok
from .chapter import MS_SPREAD
from .wording import faster


DPI = 150                # every figure: 150 dpi or more
FONT = 10                # points, the smallest text in a figure


FIG_W = 7.9              # inches: shown about 760 px wide, so 10 pt reads as 10 pt
PAGE_W = 6.5             # inches: a page's text width (the profile's figures)
LABEL_W, VALUE_W = 2.1, 1.65    # inches: rung names left of the bars, values right of them
PEER_C, OURS_C, NOW_C = "#8c8c8c", "#1f6fb4", "#d9480f"   # the ladder's bar colours
PEER_NOW_C, FAILED_C = "#555555", "#c92a2a"   # this frame's peer; a failed check (hatched)
BAR_KEYS = [(PEER_C, "a peer (what a user runs instead)"), (PEER_NOW_C, "this frame's peer"),
            (OURS_C, "our rung"), (NOW_C, "this frame's rung"),
            (FAILED_C, "no time: check failed or did not run")]     # the legend's key of each colour
# the colours in a caption's words (the same bars: :func:`frame_bars`)
COLOUR_WORDS = {PEER_C: "grey", PEER_NOW_C: "dark grey", OURS_C: "blue", NOW_C: "orange",
                FAILED_C: "red, hatched"}
WHISKER_KEY = "min-max of the timed repeats"


def _short_x(x: float) -> str:
    return f"{x:.3g}x"


def value_text(r: dict, floor_ms: float | None) -> tuple[str, str | None, str]:
    """What a figure writes beside a rung: (first line, second line or None, colour),
    from the same fields and the same rule (:func:`~onelaunch.report.results.check_status`) as
    the ladder page's table."""
    status = check_status(r)
    if status == "refused":
        why = (f"check failed ({r.get('agree')})" if r.get("agree") is not None
               and not agree_ok(r.get("agree")) else "no valid time")
        return "no time shown", why, "#c92a2a"
    v = r["ms_per_token"]
    first = f"{v:.3g} ms" + (f", {_short_x(v / floor_ms)} floor" if floor_ms else "")
    second = (f"{r['agree']}, near ties" if status == "near ties only" else
              NO_CHECK if status == NO_CHECK else None)
    return first, second, "black"


def bar_colour(r: dict, i: int, k: int, highlight: bool = True) -> str:
    """The colour of row ``r``'s bar, the ``i``-th rung, in frame ``k`` (the slider's
    frame marks its own rung, ``highlight``; a chapter's static figure marks none)."""
    if not row_ok(r):
        return FAILED_C
    if i == k and highlight:
        return PEER_NOW_C if is_peer(r) else NOW_C
    return PEER_C if is_peer(r) else OURS_C


def spread(r: dict) -> tuple[float, float] | None:
    """(min, max) ms of a row's timed repeats, or None: the row recorded none, or its
    check failed (no time is shown, so no spread either)."""
    lo, hi = (r.get(key) for key in MS_SPREAD)
    return None if lo is None or hi is None or not row_ok(r) else (lo, hi)


def frame_bars(mine: dict, rungs: list[str], k: int,
               highlight: bool = True) -> list[tuple[int, dict, str]]:
    """(position, row, colour) of each bar in frame ``k`` of one model (``mine``: its rows
    by rung): the rungs 0..k that have a row."""
    return [(i, mine[g], bar_colour(mine[g], i, k, highlight))
            for i, g in enumerate(rungs[:k + 1]) if g in mine]


def bar_keys(bars: list) -> list[tuple[str, str]]:
    """The legend's (colour, label) for the colours among ``bars``, and only those."""
    drawn = {c for _, _, c in bars}
    return [(c, text) for c, text in BAR_KEYS if c in drawn]


def _legend_len(rows: list[dict], model: str, rungs: list[str], k: int,
                highlight: bool = True) -> int:
    mine = {r["rung"]: r for r in rows if r["model"] == model}
    s = summary(rows, model)
    bars = frame_bars(mine, rungs, k, highlight)
    return (bool(s["floor_ms"]) + bool(s["best_peer"]) + len(bar_keys(bars))
            + any(spread(r) for _, r, _ in bars))


def render_frame(rows: list[dict], rungs: list[str], k: int, models: list[str],
                 title: str = "", smoke: bool = False, dpi: int = DPI,
                 head: str | None = None, highlight: bool = True) -> bytes:
    """PNG of frame ``k``: rungs[0..k] for each model, with floor and best-peer lines.
    Every frame has the same size and axes, so moving the slider only adds bars. Values
    sit in a column right of the axes, where no reference line crosses them.
    ``highlight``: frame ``k``'s own rung in its own colour (the slider's frames)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    n = len(rungs)
    pitch = 0.42                                   # inches per rung
    ax_h = pitch * n + 0.25
    # room above each model's axes for its legend's rows (two to a row), the same in
    # every frame of these rows so that the slider's frames have one size
    keys = max(_legend_len(rows, m, rungs, j, highlight) for m in models for j in range(n))
    above = max(1.05, 0.42 + 0.21 * ((keys + 1) // 2))
    below, head_h = 0.55, 0.25 + 0.2 * (1 + bool(smoke) + bool(title))
    fig_h = head_h + len(models) * (above + ax_h + below)
    fig = Figure(figsize=(FIG_W, fig_h), dpi=max(dpi, DPI))
    for m_i, model in enumerate(models):
        top = head_h + m_i * (above + ax_h + below) + above
        ax = fig.add_axes([LABEL_W / FIG_W, 1 - (top + ax_h) / fig_h,
                           (FIG_W - LABEL_W - VALUE_W) / FIG_W, ax_h / fig_h])
        mine = {r["rung"]: r for r in rows if r["model"] == model}
        s = summary(rows, model)
        vals = [r["ms_per_token"] for r in mine.values() if row_ok(r)]
        vals += [v for r in mine.values() for v in spread(r) or ()]
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
            elif g not in mine:
                ax.text(1.03, i, "not measured", transform=side, va="center", fontsize=FONT,
                        color="#777777", clip_on=False)
        bars = frame_bars(mine, rungs, k, highlight)
        for i, r, color in bars:
            if color == FAILED_C:
                ax.barh(i, hi - lo, left=lo, height=0.62, color="none", hatch="//",
                        edgecolor=FAILED_C, lw=0)
            else:
                ax.barh(i, r["ms_per_token"] - lo, left=lo, color=color, height=0.62)
            first, second, tcolor = value_text(r, s["floor_ms"])
            if second:
                ax.text(1.03, i - 0.2, first, transform=side, va="center", fontsize=FONT,
                        color=tcolor, clip_on=False)
                ax.text(1.03, i + 0.22, second, transform=side, va="center", fontsize=FONT,
                        color="#c92a2a" if tcolor != "black" else "#555555", clip_on=False)
            else:
                ax.text(1.03, i, first, transform=side, va="center", fontsize=FONT,
                        color=tcolor, clip_on=False)
        # the whiskers: min to max of each row's timed repeats, where it recorded them
        spreads = [(i, r["ms_per_token"], spread(r)) for i, r, _ in bars if spread(r)]
        whisker = None
        if spreads:
            # the spread is stored rounded: a median within its rounding of the fastest
            # or the slowest repeat must not give a negative whisker
            whisker = ax.errorbar([m for _, m, _ in spreads], [i for i, _, _ in spreads],
                                  xerr=[[max(m - a, 0) for _, m, (a, b) in spreads],
                                        [max(b - m, 0) for _, m, (a, b) in spreads]],
                                  fmt="none", ecolor="black", elinewidth=1.1, capsize=3,
                                  label=WHISKER_KEY)
            whisker.lines[2][0].set_gid("whisker")
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
        # a key for every colour drawn in this frame, and for none that is not: the
        # lines', the bars' (bar_keys), and the whiskers' where there are any
        handles = [h for h in ax.get_lines() if not h.get_label().startswith("_")]
        handles += [Patch(facecolor="none", edgecolor=c, hatch="//", lw=0, label=text)
                    if c == FAILED_C else Patch(color=c, label=text)
                    for c, text in bar_keys(bars)]
        handles += [whisker] if whisker else []
        # from the figure's left edge, under the model's name: a long best-peer label
        # must not push the second column past the right edge
        ax.legend(handles=handles, loc="lower left", ncol=2,
                  bbox_to_anchor=(-(LABEL_W - 0.05) / (FIG_W - LABEL_W - VALUE_W), 1.0),
                  fontsize=FONT, frameon=False, borderaxespad=0.1, handlelength=1.8,
                  columnspacing=1.0)
        ax.grid(axis="x", which="both", alpha=0.2)
    if head is None:
        head = f"rung {k + 1} of {n}: {label(rungs[k], rows)}"
    lines = [head] + (["CPU SMOKE RUN, NOT A MEASUREMENT (tiny models on a CPU)"] if smoke else []) \
        + ([title] if title else [])
    fig.text(0.012, 1 - 0.12 / fig_h, "\n".join(lines), va="top", ha="left", fontsize=FONT + 1,
             color="#c92a2a" if smoke else "black", linespacing=1.35)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=max(dpi, DPI))
    return buf.getvalue()


def _colour_text(rows: list[dict], rungs: list[str], models: list[str],
                 highlight: bool) -> str:
    """What the bars' colours mean, named from the bars the last frame draws (the same
    :func:`frame_bars`), so a caption never names a colour the figure lacks."""
    drawn = {c for m in models
             for _, _, c in frame_bars({r["rung"]: r for r in rows if r["model"] == m},
                                       rungs, len(rungs) - 1, highlight)}
    return ", ".join(f"{dict(BAR_KEYS)[c].split(' (')[0]} in {COLOUR_WORDS[c]}"
                     for c, _ in BAR_KEYS if c in drawn)


def figure_caption(rows: list[dict], rungs: list[str], models: list[str],
                   highlight: bool = False) -> str:
    """What the figure shows, then per model what it finds and which rungs have no bar,
    from the same rows and rule: prose about a figure is generated, never typed.
    ``highlight``: whether the figure marks its last rung (the slider's frames do)."""
    peer_line = any(summary(rows, m)["best_peer"] for m in models)   # what render_frame draws
    parts = ["Milliseconds per token of each rung (bars, log scale: shorter is faster: "
             + _colour_text(rows, rungs, models, highlight)
             + "), against the bandwidth floor of the same run (dashed)"
             + (" and the fastest peer (dotted)." if peer_line else ".")]
    if any(spread(r) for r in rows if r["model"] in models and r["rung"] in rungs):
        parts.append("The whiskers span the fastest to the slowest of each rung's timed "
                     "repeats.")
    for model in models:
        mine = {r["rung"]: r for r in rows if r["model"] == model}
        shown = [g for g in rungs if g in mine]
        st = {g: check_status(mine[g]) for g in shown}
        bars = [g for g in shown if st[g] != "refused"]
        s = summary(rows, model)
        ours = [mine[g] for g in bars if not is_peer(mine[g])]
        bits = []
        if ours:
            best = min(ours, key=lambda r: r["ms_per_token"])
            x = (f" ({best['ms_per_token'] / s['floor_ms']:.2f}x the floor)"
                 if s["floor_ms"] else "")
            bp = s["best_peer"]
            vs = (", " + faster(best["ms_per_token"], bp["ms_per_token"], "it",
                                f"the fastest peer ({label(bp, rows)})") if bp else "")
            bits.append(f"the fastest of ours is {label(best, rows)} at "
                        f"{best['ms_per_token']:.3g} ms{x}{vs}")
        if len(bars) < len(shown):
            bits.append(f"a bar for {len(bars)} of its {len(shown)} rungs")
        ties = [label(g, rows) for g in bars if st[g] == "near ties only"]
        if ties:        # labels hold commas ("HF generate, eager"): quoted apart
            names = ", ".join(f"*{t}*" for t in ties[:-1]) + (" and " if len(ties) > 1 else "")
            bits.append(f"{names}*{ties[-1]}* differ{'s' if len(ties) == 1 else ''} from "
                        "the oracle only at near ties")
        unchecked = [label(g, rows) for g in bars if st[g] == NO_CHECK]
        if unchecked:
            bits.append("timed by its own tool, with no oracle check possible: "
                        + "; ".join(unchecked))
        refused = [f"{label(g, rows)} ({mine[g].get('agree')})" for g in shown
                   if st[g] == "refused"]
        if refused:
            bits.append("hatched, with no time, because the check failed: "
                        + "; ".join(refused))
        missing = [label(g, rows) for g in rungs if g not in mine]
        if missing:
            bits.append("not measured: " + "; ".join(missing))
        if bits:       # labels hold commas ("HF generate, eager"): one sentence a fact
            parts.append(f"{model}: " + ". ".join(b[0].upper() + b[1:] for b in bits)
                         + ".")
    return " ".join(parts)


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
    png = render_frame(rows, rungs, len(rungs) - 1, models, title, smoke, dpi, head=head,
                       highlight=False)
    return _Figure(png, figure_caption(rows, rungs, models, highlight=False))


def _pct(p: float) -> str:
    return "<1%" if p < 1 else f"{p:.0f}%"


def _gbps(v: float) -> str:
    """Plain digits: thousands grouped, small values to three figures (no exponent)."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def kernel_figure(rows: list[dict], read_tbps: float, head: str, smoke: bool = False,
                  slow: str = "attention (plain)", dpi: int = DPI):
    """Each checked kernel's bandwidth (bytes it must move / its time) against the
    streaming read of the same run, on a log axis so that a kernel at 1% of the read
    bandwidth still shows a bar; the values sit in a column right of the axes, where no
    line crosses them. ``rows``: kernel rows with ``kernel``, ``gbps``, ``pct_of_read``
    and ``bytes`` (a row without ``gbps`` failed its check and is left out)."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    shown = [r for r in rows if r.get("gbps")]
    n = len(shown)
    label_w, value_w, pitch = 2.3, 1.55, 0.36              # inches
    ax_h = pitch * n + 0.2
    head_h, below = 0.35 + 0.2 * bool(smoke) + 0.5, 0.6
    fig_h = head_h + ax_h + below
    fig = Figure(figsize=(PAGE_W, fig_h), dpi=dpi)
    ax = fig.add_axes([label_w / PAGE_W, below / fig_h,
                       (PAGE_W - label_w - value_w) / PAGE_W, ax_h / fig_h])
    read = read_tbps * 1e3
    vals = [r["gbps"] for r in shown] + [read]
    lo, hi = min(vals) / 2, max(vals) * 1.5
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0,)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _gbps(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())
    colors = ["#c92a2a" if r["kernel"] == slow else "#1f6fb4" for r in shown]
    ax.barh(range(n), [r["gbps"] - lo for r in shown], left=lo, color=colors,
            height=0.62)
    spread = [(i, r) for i, r in enumerate(shown) if r.get("us_min") and r.get("us_max")]
    if spread:     # the whiskers: the bandwidth at the slowest and the fastest replay
        gb = lambda r, us: r["bytes"] / (us * 1e3)
        ax.errorbar([r["gbps"] for _, r in spread], [i for i, _ in spread],
                    xerr=[[max(r["gbps"] - gb(r, r["us_max"]), 0) for _, r in spread],
                          [max(gb(r, r["us_min"]) - r["gbps"], 0) for _, r in spread]],
                    fmt="none", ecolor="black", elinewidth=1, capsize=3)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n))
    ax.set_yticklabels([r["kernel"] for r in shown], fontsize=FONT)
    ax.tick_params(axis="x", labelsize=FONT)
    side = ax.get_yaxis_transform()
    for i, r in enumerate(shown):
        ax.text(1.03, i, f"{_gbps(r['gbps'])} GB/s, {_pct(r['pct_of_read'])}",
                transform=side, va="center", fontsize=FONT, clip_on=False)
    ax.axvline(read, color="black", ls="--", lw=1.2)
    ax.set_xlabel("GB/s: bytes the kernel must move / its time (log scale)",
                  fontsize=FONT)
    ax.grid(axis="x", which="major", alpha=0.25)
    handles = [Patch(color="#1f6fb4", label="fused kernel"),
               Patch(color="#c92a2a", label=f"{slow}: one program a head"),
               Line2D([], [], color="black", ls="--",
                          label=f"streaming read, this run: {_gbps(read)} GB/s")]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(-label_w /
              (PAGE_W - label_w - value_w), 1.0), ncol=2, fontsize=FONT, frameon=False,
              borderaxespad=0.2, handlelength=1.6, columnspacing=1.0)
    smoke_line = "CPU SMOKE RUN, NOT A MEASUREMENT (tiny model)"
    lines = [head] + ([smoke_line] if smoke else [])
    fig.text(0.012, 1 - 0.1 / fig_h, "\n".join(lines), va="top", ha="left",
             fontsize=FONT + 1, color="#c92a2a" if smoke else "black")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    best = max(shown, key=lambda r: r["gbps"])
    worst = min(shown, key=lambda r: r["gbps"])
    caption = (f"Each kernel's bandwidth (the bytes it must move over its time), one "
               f"bar per checked kernel, against the streaming read measured in the same "
               f"run "
               f"(dashed, {_gbps(read)} GB/s). The fastest, {best['kernel']}, reaches "
               f"{_pct(best['pct_of_read'])} of it; the slowest, {worst['kernel']}, "
               f"{_pct(worst['pct_of_read'])}. The axis is logarithmic, so that the "
               "smallest kernels show a bar."
               + (" The whiskers span the slowest to the fastest timed replay."
                  if spread else " No spread was recorded for these rows."))
    return _Figure(buf.getvalue(), caption)


def sweep_figure(rows: list[dict], head: str, smoke: bool = False, dpi: int = DPI):
    """ms/token of one rung against the context (log axis), beside the floor of the same
    run at each context, each point labelled with its ratio to the floor; a row's
    spread over its timed repeats (``ms_min``, ``ms_max``) is drawn where it has one."""
    from matplotlib.figure import Figure

    rows = sorted((r for r in rows if r.get("ms_per_token")), key=lambda r: r["ctx"])
    if not rows:
        raise ValueError("sweep_figure: no timed rows")
    fig = Figure(figsize=(PAGE_W, 3.9 + 0.2 * bool(smoke)), dpi=dpi)
    ax = fig.add_axes([0.11, 0.15, 0.86, 0.62 - 0.04 * bool(smoke)])
    cs = [r["ctx"] for r in rows]
    ms = [r["ms_per_token"] for r in rows]
    # the spread is stored rounded (Timing.spread): a median within its rounding of the
    # fastest or slowest call would give a negative bar
    lo = [max(0.0, m - (r.get("ms_min") or m)) for m, r in zip(ms, rows)]
    hi = [max(0.0, (r.get("ms_max") or m) - m) for m, r in zip(ms, rows)]
    ax.errorbar(cs, ms, yerr=[lo, hi], fmt="o-", color=OURS_C, capsize=3,
                label=f"{rows[0]['rung']}, ms per token")
    ax.plot(cs, [r["floor_ms"] for r in rows], "s--", color="black",
            label="bandwidth floor, this run")
    for r in rows:
        if r.get("x_floor"):
            ax.annotate(f"{r['x_floor']:.2f}x", (r["ctx"], r["ms_per_token"]),
                        textcoords="offset points", xytext=(0, 9), ha="center",
                        fontsize=FONT)
    ax.set_xscale("log", base=2)
    ax.set_xticks(cs)
    ax.set_xticklabels([f"{c:,}" for c in cs], fontsize=FONT)
    ax.minorticks_off()
    ax.tick_params(axis="y", labelsize=FONT)
    ax.set_ylim(0, max(ms) * 1.25)
    ax.set_xlabel("context (tokens, log scale)", fontsize=FONT)
    ax.set_ylabel("ms per token", fontsize=FONT)
    ax.grid(alpha=0.2)
    ax.legend(loc="lower left", bbox_to_anchor=(0.0, 1.0), ncol=2, fontsize=FONT,
              frameon=False, borderaxespad=0.2)
    lines = [head] + (["CPU SMOKE RUN, NOT A MEASUREMENT (tiny model, no graph)"]
                      if smoke else [])
    fig.text(0.012, 0.98, "\n".join(lines), va="top", ha="left", fontsize=FONT + 1,
             color="#c92a2a" if smoke else "black")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    xs = [r["x_floor"] for r in rows if r.get("x_floor")]
    caption = (f"The step's time (dots) and the floor of the same run (squares) at "
               f"{len(rows)} context lengths from {cs[0]:,} to {cs[-1]:,} tokens"
               + (f"; the label on each dot is its ratio to the floor, from "
                  f"{min(xs):.2f}x to {max(xs):.2f}x" if xs else "") + ".")
    return _Figure(buf.getvalue(), caption)
