"""Attention's time against the context: one program a query head against split-K, in
the style of :mod:`.figures` (same DPI, fonts, width and caption habit).

Rows are ``results/<gpu>/attention.json``'s: ``ctx``, ``kernel`` ("plain" or
"split-K"), ``us`` (median per layer), ``us_min``/``us_max``, ``bytes`` (keys and values
of one layer) and ``read_gbps`` (the streaming read of the same run).
"""
from __future__ import annotations

import io

from .figures import DPI, FONT, OURS_C, PAGE_W, _Figure

PLAIN_C = "#c92a2a"          # the plain kernel, as in the kernel figure


def _us(v: float) -> str:
    return f"{v:,.0f} µs" if v >= 100 else f"{v:.3g} µs"


def attention_figure(rows: list[dict], head: str, smoke: bool = False, dpi: int = DPI):
    """µs per layer of both kernels against the context (log-log), with the time the
    keys and values need at the run's streaming read bandwidth; each point labelled."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    kinds = (("plain", PLAIN_C, "one program a query head", "o-"),
             ("split-K", OURS_C, "split-K (partial + merge)", "s-"))
    by = {k: sorted((r for r in rows if r["kernel"] == k and r.get("us")),
                    key=lambda r: r["ctx"]) for k, *_ in kinds}
    if not by["plain"] or not by["split-K"]:
        raise ValueError("attention_figure: rows of both kernels are needed")
    fig = Figure(figsize=(PAGE_W, 3.9 + 0.2 * bool(smoke)), dpi=dpi)
    ax = fig.add_axes([0.12, 0.14, 0.84, 0.64 - 0.04 * bool(smoke)])
    handles = []
    for k, colour, name, style in kinds:
        rs = by[k]
        cs, us = [r["ctx"] for r in rs], [r["us"] for r in rs]
        lo = [max(0.0, u - (r.get("us_min") or u)) for u, r in zip(us, rs)]
        hi = [max(0.0, (r.get("us_max") or u) - u) for u, r in zip(us, rs)]
        handles.append(ax.errorbar(cs, us, yerr=[lo, hi], fmt=style, color=colour,
                                   capsize=3, label=name))
        for i, (c, u) in enumerate(zip(cs, us)):
            last = k == "split-K" and i == len(cs) - 1       # clear of the dashed line
            ax.annotate(_us(u), (c, u), textcoords="offset points",
                        xytext=(0, 8) if k == "plain" else (-8, 4) if last else (0, -15),
                        ha="right" if last else "center", fontsize=FONT, color=colour)
    ref = by["split-K"]
    handles += ax.plot([r["ctx"] for r in ref],
                       [r["bytes"] / (r["read_gbps"] * 1e3) for r in ref], "--", color="black",
                       lw=1.2, label="its bytes at the read bandwidth")
    cs = sorted({r["ctx"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(cs)
    ax.set_xticklabels([f"{c:,}" for c in cs], fontsize=FONT)
    ax.minorticks_off()
    ax.tick_params(axis="y", labelsize=FONT)
    ax.set_xlim(cs[0] / 1.6, cs[-1] * 1.6)
    top = max(r["us"] for r in by["plain"])
    bottom = min(r["bytes"] / (r["read_gbps"] * 1e3) for r in ref)
    ax.set_ylim(bottom / 2, top * 3)
    ax.set_xlabel("context (positions, log scale)", fontsize=FONT)
    ax.set_ylabel("µs per layer (log scale)", fontsize=FONT)
    ax.grid(alpha=0.2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(-0.1, 1.0), ncol=2, fontsize=FONT,
              frameon=False, borderaxespad=0.2)
    lines = [head] + (["CPU SMOKE RUN, NOT A MEASUREMENT (tiny model)"] if smoke else [])
    fig.text(0.012, 0.98, "\n".join(lines), va="top", ha="left", fontsize=FONT + 1,
             color="#c92a2a" if smoke else "black")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    caption = (f"One layer's attention at {len(cs)} context lengths: the median of the "
               f"timed repeats (whiskers: fastest to slowest), on log axes. The dashed line "
               f"is the time its keys and values need at the streaming read bandwidth of "
               f"the same run.")
    return _Figure(buf.getvalue(), caption)
