"""The near-tie figure: every step where a run chose another token than its reference,
placed at the reference's own logit gap between the two (in bf16 ulps of its top logit),
against the agreement rule's threshold (:data:`onelaunch.measure.agree.NEAR_TIE_ULPS`).
Drawn in the style of :mod:`.figures`, with a caption generated from the same rows."""
from __future__ import annotations

import io
from collections import Counter

from ..measure.agree import NEAR_TIE_ULPS
from .chapter import tie_rows
from .figures import DPI, FONT, PAGE_W, _Figure

MODEL_C = ("#4c72b0", "#dd8452")          # the first model's marks, the second's
MODEL_M = ("o", "s")


def tie_groups(check_rows: list[dict], ladder_rows: list[dict], rungs) -> list[dict]:
    """One group per comparison and model: ``{"label", "model", "agree", "gaps"}``, the
    gaps in ulps. ``check_rows``: ``oracle_check.json``'s (the oracle against Hugging
    Face); ``ladder_rows``: the rows of ``rungs`` (each against the oracle)."""
    def group(name, r):
        gaps = [t["gap_ulps"] for t in tie_rows([r]) if t.get("gap_ulps") is not None]
        return {"label": name, "model": r["model"], "agree": r.get("agree"),
                "gaps": gaps}
    out = [group("oracle vs HF", r) for r in check_rows]
    for rung in rungs:
        out += [group(f"{rung} vs oracle", r) for r in ladder_rows
                if r["rung"] == rung and r.get("agree")]
    return out


def tie_figure(groups: list[dict], head: str, dpi: int = DPI) -> _Figure:
    """Each differing step of each group as a mark at its gap; one line per comparison,
    the models side by side in it; the threshold dashed, the region of flips shaded."""
    from matplotlib.figure import Figure

    names = list(dict.fromkeys(g["label"] for g in groups))
    models = list(dict.fromkeys(g["model"] for g in groups))
    n = len(names)
    label_w, value_w, pitch = 2.05, 1.1, 0.5                # inches
    ax_h, head_h, below = pitch * n, 0.85, 0.6
    fig_h = head_h + ax_h + below
    fig = Figure(figsize=(PAGE_W, fig_h), dpi=dpi)
    ax = fig.add_axes([label_w / PAGE_W, below / fig_h,
                       (PAGE_W - label_w - value_w) / PAGE_W, ax_h / fig_h])
    top = max([NEAR_TIE_ULPS * 1.45] + [x + 1 for g in groups for x in g["gaps"]])
    ax.axvspan(NEAR_TIE_ULPS, top, color="#c44e52", alpha=0.12, lw=0)
    ax.axvline(NEAR_TIE_ULPS, color="black", ls="--", lw=1.2)
    ax.text(NEAR_TIE_ULPS + 0.2, -0.42, "flip:\nrefused", fontsize=FONT, va="top",
            color="#c44e52")
    side = ax.get_yaxis_transform()
    for g in groups:
        i, k = names.index(g["label"]), models.index(g["model"])
        y = i + (k - (len(models) - 1) / 2) * 0.3
        for gap, count in sorted(Counter(g["gaps"]).items()):
            ax.plot([gap], [y], MODEL_M[k % 2], color=MODEL_C[k % 2], ms=7,
                    mec="black", mew=0.5)
            if count > 1:
                ax.text(gap + 0.2, y, f"×{count}", fontsize=FONT, va="center")
        ax.text(1.03, y, f"{g['agree']} agree", transform=side, fontsize=FONT,
                va="center", color=MODEL_C[k % 2], clip_on=False)
    ax.set_xlim(-0.5, top)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n))
    ax.set_yticklabels(names, fontsize=FONT)
    ax.tick_params(axis="x", labelsize=FONT)
    ax.set_xlabel("the reference's logit gap to the token chosen (bf16 ulps)",
                  fontsize=FONT)
    ax.grid(axis="x", alpha=0.25)
    for k, m in enumerate(models):
        ax.plot([], [], MODEL_M[k % 2], color=MODEL_C[k % 2], mec="black", mew=0.5,
                label=m)
    ax.plot([], [], ls="--", color="black", label=f"threshold, {NEAR_TIE_ULPS} ulps")
    ax.legend(loc="lower left", bbox_to_anchor=(-label_w / (PAGE_W - label_w - value_w),
              1.0), ncol=3, fontsize=FONT, frameon=False, borderaxespad=0.2)
    fig.text(0.012, 1 - 0.1 / fig_h, head, va="top", ha="left", fontsize=FONT + 1)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    gaps = [x for g in groups for x in g["gaps"]]
    steps = sum(int(str(g["agree"]).split("/")[1]) for g in groups
                if "/" in str(g["agree"]))
    caption = (f"Each mark is a step whose token differed from its reference's: "
               f"{len(gaps)} of {steps} checked steps, placed at the reference's own "
               f"logit gap between the two tokens. The largest is "
               f"{max(gaps, default=0):.3g} ulps; the threshold is "
               f"{NEAR_TIE_ULPS}, and a step beyond it would have refused its run.")
    return _Figure(buf.getvalue(), caption)
