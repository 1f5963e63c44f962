"""The step profile's figures: where each rung's step time goes, per op
(:func:`draw_profile`), one persistent layer phase by phase (:func:`draw_phases`), and two
GPUs' steps split into compute and communication (:func:`draw_tp_split`),
each with a caption written from the same rows. Drawn in the book's one figure style
(:mod:`onelaunch.report.figures`).
"""
from __future__ import annotations

import statistics

from . import chapter
from .figures import DPI, FONT, PAGE_W


def op_order(rows: list[dict]) -> list[str]:
    """The ops of every rung in step order: each rung's order, an op a later rung adds
    (split-K's partial and reduce) placed just before the op that follows it there."""
    merged: list[str] = []
    for rung in dict.fromkeys(r["rung"] for r in rows):
        seq = [r["op"] for r in sorted((r for r in rows if r["rung"] == rung and r.get("op")),
                                       key=lambda r: r.get("step", 0))]
        for i, op in enumerate(seq):
            if op not in merged:
                after = next((o for o in seq[i + 1:] if o in merged), None)
                merged.insert(merged.index(after) if after else len(merged), op)
    return merged


# Every op's colour, the same in every figure and for both models: the ops in step
# order, a MoE op beside its dense counterpart (they share a colour: the same place in
# the layer), then any op not listed, in the order it comes.
OP_COLOR_ORDER = ("embed", "rms_qkv", "rope_kv_write", "attention", "attention_partial",
                  "attention_reduce", "o_proj_residual", "moe_router",
                  ("rms_gate_up_swiglu", "moe_gate_up_swiglu"),
                  ("down_residual", "moe_down_residual"), "lm_head_argmax",
                  "layer_persistent")


def op_colors(ops: list[str]) -> dict[str, tuple]:
    """op -> (solid colour, light colour): tab20's pairs but its grey (the legend's
    solid/hatched keys are black and white), then tab20b's, given out by
    :data:`OP_COLOR_ORDER` so that an op has one colour whichever model or figure
    draws it; ops not in it take the colours left, in order."""
    import matplotlib
    t20, t20b = matplotlib.colormaps["tab20"], matplotlib.colormaps["tab20b"]
    pairs = [(t20(2 * i), t20(2 * i + 1)) for i in range(10) if i != 7]
    pairs += [(t20b(4 * j), t20b(4 * j + 2)) for j in range(5)]
    slot = {}
    for i, key in enumerate(OP_COLOR_ORDER):
        for op in (key if isinstance(key, tuple) else (key,)):
            slot[op] = i
    extra = [op for op in ops if op not in slot]
    for j, op in enumerate(extra):
        slot[op] = len(OP_COLOR_ORDER) + j
    return {op: pairs[slot[op] % len(pairs)] for op in ops}


def draw_profile(rows: list[dict], model: str | None = None, head: str = "",
                 smoke: bool = False, per_op: bool = True):
    """One figure for one model's profile rows (:func:`profile_rows`).

    Top: one horizontal bar per rung, stacked from the left in step order; each op is
    the time its bytes need at the measured read bandwidth (solid) and the time it adds
    beyond that (light, hatched). The step's span and its ratio to the floor (the dashed
    line: every byte of the plan at the read bandwidth) stand right of each bar, with how
    much the rung removed from the one above. Bottom (``per_op``): the time beyond the
    bytes per op, one bar per rung: where each rung's savings came from. Returns the
    matplotlib Figure (6.5 inches wide, 150 dpi, no text under 10 pt)."""
    import matplotlib
    import matplotlib.pyplot as plt      # (no backend switch: a notebook keeps its own)
    from matplotlib.patches import Patch

    models = list(dict.fromkeys(r["model"] for r in rows))
    if not models:
        raise ValueError("draw_profile: no rows")
    model = model or models[0]
    rows = [r for r in rows if r["model"] == model]
    rungs = list(dict.fromkeys(r["rung"] for r in rows))
    ops = op_order(rows)
    colors = op_colors(ops)
    by = {(r["rung"], r.get("op")): r for r in rows}
    refused = {}                                  # rung -> why it has no bar
    for r in rows:
        if r.get("refused"):
            refused[r["rung"]] = "check failed: not profiled"
        elif r.get("error"):
            refused.setdefault(r["rung"], "no profile (error)")
    first = {g: next(r for r in rows if r["rung"] == g) for g in rungs}
    n = len(rungs)

    label_w = 0.15 + 0.075 * max(len(g) for g in rungs)
    value_w = 1.8
    ax_w = PAGE_W - label_w - value_w - 0.1
    head_lines = [head or f"{model}: where the step's time goes, context "
                          f"{first[rungs[0]].get('ctx', '')}"]
    if smoke:
        head_lines.append("CPU SMOKE RUN, NOT A MEASUREMENT")
    head_h = 0.15 + 0.22 * len(head_lines)
    top_h = 0.45 * n + 0.1
    floors = [first[g].get("floor_ms") for g in rungs if first[g].get("floor_ms")]
    floor = statistics.median(floors) if floors else None
    leg_rows = -(-(len(ops) + 2 + bool(floor)) // 3)
    leg_h = 0.22 * leg_rows + 0.15
    gap1 = 0.6                                   # x label of the top axes
    bot_h, bot_lab = (2.3, 0.5 + 0.075 * max(len(o) for o in ops) * 0.6) if per_op else (0, 0)
    gap2 = 0.45 if per_op else 0
    fig_h = head_h + 0.25 + top_h + gap1 + leg_h + gap2 + bot_h + bot_lab + 0.1
    fig = plt.figure(figsize=(PAGE_W, fig_h), dpi=DPI)
    y = lambda inch: 1 - inch / fig_h            # inches from the top -> figure fraction

    fig.text(0.012, y(0.1), "\n".join(head_lines), va="top", ha="left", fontsize=FONT + 1,
             color="#c92a2a" if smoke else "black", linespacing=1.35)

    # ---- top: stacked bars, one per rung ------------------------------------------------
    t0 = head_h + 0.25
    ax = fig.add_axes([label_w / PAGE_W, y(t0 + top_h), ax_w / PAGE_W, top_h / fig_h])
    side = ax.get_yaxis_transform()
    totals, prev = [], None
    for i, g in enumerate(rungs):
        if g in refused:
            ax.text(0.02, i, refused[g], transform=side, va="center",
                    fontsize=FONT, color="#c92a2a", zorder=5,
                    bbox=dict(facecolor="white", edgecolor="none", pad=1.5))
            ax.text(1.03, i, "no time shown", transform=side, va="center", fontsize=FONT,
                    color="#c92a2a", clip_on=False)
            continue
        left = 0.0
        for op in ops:
            r = by.get((g, op))
            if r is None or r.get("ms") is None:
                continue
            dark, light = colors[op]
            solid = r["ms"] if r.get("bytes_ms") is None else min(r["ms"], r["bytes_ms"])
            ax.barh(i, solid, left=left, height=0.62, color=dark, lw=0)
            left += solid
            extra = r["ms"] - solid
            if extra > 0:
                ax.barh(i, extra, left=left, height=0.62, color=light, edgecolor=dark,
                        hatch="///", lw=0)
                left += extra
        totals.append(left)
        span = first[g].get("span_ms")
        lo, hi_ = first[g].get("span_min_ms"), first[g].get("span_max_ms")
        if span is not None and lo is not None and hi_ is not None:
            # the whisker: the fastest to the slowest replay's span, about the bar's end
            ax.errorbar([left], [i], xerr=[[max(span - lo, 0)], [max(hi_ - span, 0)]],
                        fmt="none", ecolor="black", elinewidth=1, capsize=3, zorder=4)
        line1 = f"{span:.3g} ms" + (f", {span / floor:.2f}x floor" if span and floor else "")
        ax.text(1.03, i - 0.17, line1, transform=side, va="center", fontsize=FONT,
                clip_on=False)
        if prev is not None and span is not None:
            ax.text(1.03, i + 0.24, f"{span - prev:+.3g} ms vs above", transform=side,
                    va="center", fontsize=FONT, color="#555555", clip_on=False)
        elif first[g].get("note"):
            ax.text(1.03, i + 0.24, "eager (not a graph)", transform=side, va="center",
                    fontsize=FONT, color="#555555", clip_on=False)
        prev = span if span is not None else prev
    hi = max(totals + [floor or 0, 1e-9])
    ax.set_xlim(0, hi * 1.04)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n))
    ax.set_yticklabels(rungs, fontsize=FONT)
    ax.tick_params(axis="x", labelsize=FONT)
    ax.set_xlabel("ms per step: each op is the time it adds to the step", fontsize=FONT)
    ax.grid(axis="x", alpha=0.2)
    if floor:
        ax.axvline(floor, color="black", ls="--", lw=1.2, zorder=1)
    handles = [Patch(facecolor=colors[o][0], label=o) for o in ops]
    handles += [Patch(facecolor="black", label="bytes at read bandwidth"),
                Patch(facecolor="white", edgecolor="black", hatch="///", lw=0.8,
                      label="beyond the bytes")]
    if floor:
        from matplotlib.lines import Line2D
        handles.append(Line2D([], [], color="black", ls="--", lw=1.2,
                              label=f"floor {floor:.3g} ms"))
    leg_top = t0 + top_h + gap1
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.012, y(leg_top)),
               ncol=3, fontsize=FONT, frameon=False, handlelength=1.4, columnspacing=1.0,
               borderaxespad=0.0, handletextpad=0.5)

    # ---- bottom: time beyond the bytes, per op and rung ---------------------------------
    if per_op:
        b0 = leg_top + leg_h + gap2
        bx = fig.add_axes([0.75 / PAGE_W, y(b0 + bot_h), (PAGE_W - 0.95) / PAGE_W, bot_h / fig_h])
        shown = [g for g in rungs if g not in refused]
        width = 0.8 / max(1, len(shown))
        shades = [matplotlib.colormaps["Blues"](0.35 + 0.6 * k / max(1, len(shown) - 1))
                  for k in range(len(shown))]
        for k, g in enumerate(shown):
            xs, vs = [], []
            for j, op in enumerate(ops):
                r = by.get((g, op))
                if r is not None and r.get("beyond_ms") is not None:
                    xs.append(j - 0.4 + width * (k + 0.5))
                    vs.append(r["beyond_ms"])
            bx.bar(xs, vs, width=width * 0.92, color=shades[k], label=g)
        bx.axhline(0, color="black", lw=0.8)
        bx.set_xticks(range(len(ops)))
        bx.set_xticklabels(ops, rotation=35, ha="right", fontsize=FONT)
        bx.tick_params(axis="y", labelsize=FONT)
        bx.set_xlim(-0.6, len(ops) - 0.4)
        bx.set_ylabel("ms beyond the bytes", fontsize=FONT)
        bx.grid(axis="y", alpha=0.2)
        bx.legend(fontsize=FONT, frameon=False, ncol=min(4, len(shown)), loc="lower left",
                  bbox_to_anchor=(0.0, 1.0), borderaxespad=0.1, handlelength=1.4)
    return fig


SHOWS = ("Where each rung's step goes, op by op in step order (one colour an op, the "
         "same in both models' figures): the time its bytes need at the read bandwidth "
         "of the same run (solid) and the time it takes beyond them (light, hatched), "
         "against the floor of the whole step (dashed), with a whisker from the fastest "
         "to the slowest replay's step; below, the time beyond the bytes of each op, one "
         "bar a rung.")


def caption(rows: list[dict], model: str | None = None) -> str:
    """What the figure shows (:data:`SHOWS`), then one clause per rung: its step, the
    change from the rung above and the op with the most time beyond its bytes."""
    model = model or rows[0]["model"]
    rows = [r for r in rows if r["model"] == model]
    parts, prev, prev_row = [], None, None
    for g in dict.fromkeys(r["rung"] for r in rows):
        mine = [r for r in rows if r["rung"] == g]
        if any(r.get("refused") for r in mine):
            parts.append(f"{g}: refused by the oracle check, not profiled")
            continue
        if any(r.get("error") for r in mine):
            parts.append(f"{g}: not profiled (its kernels could not be attributed)")
            continue
        top = max((r for r in mine if r.get("beyond_ms") is not None),
                  key=lambda r: r["beyond_ms"], default=None)
        span = mine[0]["span_ms"]
        s = f"{g}: {span:.3g} ms a step"
        if prev is not None:
            s += (" (no different within the replays' spread)"
                  if _overlap(mine[0], prev_row) else f" ({span - prev:+.3g} ms)")
        if top is not None and top["beyond_ms"] > 0:
            s += f", most time beyond its bytes in {top['op']} ({top['beyond_ms']:.3g} ms)"
        parts.append(s)
        prev, prev_row = span, mine[0]
    return f"{SHOWS} {model}: " + "; ".join(parts) + "."


def _overlap(a: dict, b: dict) -> bool:
    """Whether two profile rows' step spans differ by less than their replays' range
    (False when either recorded no range): a difference prose must not claim."""
    return bool(chapter.within_spread(a, b, ("span_ms", "span_min_ms", "span_max_ms")))


PHASE_PARTS = (("bytes_us", "its bytes at the read bandwidth"),
               ("beyond_us", "work beyond the bytes"),
               ("wait_us", "waiting for the slowest program"),
               ("release_us", "the barrier's release"))


def draw_phases(rows: list[dict]):
    """One panel per model (:func:`phase_rows`): a horizontal bar per phase of one layer,
    stacked from the left as :data:`PHASE_PARTS`. Returns the matplotlib Figure."""
    import matplotlib.pyplot as plt
    rows = [r for r in rows if r.get("phase")]
    models = list(dict.fromkeys(r["model"] for r in rows))
    if not models:
        raise ValueError("draw_phases: no rows")
    n = [sum(r["model"] == m for r in rows) for m in models]
    height = 1.6 + 0.32 * sum(n) + 0.6 * len(models)                # inches
    fig, axes = plt.subplots(len(models), 1, figsize=(PAGE_W, height), dpi=DPI,
                             squeeze=False, gridspec_kw={"height_ratios": n})
    colors = ("#1f77b4", "#aec7e8", "#ff7f0e", "#d62728")
    for ax, m in zip(axes[:, 0], models):
        mine = [r for r in rows if r["model"] == m][::-1]          # first phase on top
        left = [0.0] * len(mine)
        for (key, label), c in zip(PHASE_PARTS, colors):
            vals = [max(r[key], 0.0) for r in mine]
            ax.barh(range(len(mine)), vals, left=left, color=c, label=label, height=0.7)
            left = [a + b for a, b in zip(left, vals)]
        labels = [r["phase"] + (" (in the next)" if r.get("inside") else "") for r in mine]
        ax.set_yticks(range(len(mine)), labels, fontsize=FONT)
        total = sum(r["span_us"] + r["release_us"] for r in mine)
        ax.set_title(f"{m}: one layer, {total:.3g} µs", fontsize=FONT + 1, loc="left")
        ax.tick_params(axis="x", labelsize=FONT)
        ax.set_xlabel("µs", fontsize=FONT)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=FONT, loc="lower center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.55 / fig.get_size_inches()[1], 1, 1))   # the legend below
    return fig


def phase_caption(rows: list[dict]) -> str:
    """What :func:`draw_phases` shows, from the same rows: per model, one layer's time,
    what its bytes need, and the time spent waiting and releasing."""
    out = []
    for m in dict.fromkeys(r["model"] for r in rows if r.get("phase")):
        mine = [r for r in rows if r["model"] == m and r.get("phase")]
        total = sum(r["span_us"] + r["release_us"] for r in mine)
        need = sum(r["need_us"] for r in mine)
        beyond = sum(r["beyond_us"] for r in mine)
        wait = sum(r["wait_us"] for r in mine)
        barriers = [r for r in mine if not r.get("inside")]
        rel = sum(r["release_us"] for r in barriers)
        worst = max(mine, key=lambda r: r["wait_us"])
        inside = "".join(f" ({r['phase']} runs inside {r['inside']}: no barrier of its own)"
                         for r in mine if r.get("inside"))
        light = [r for r in mine if r["need_us"] < 0.01 * need]       # (almost) no bytes
        lt = sum(r["span_us"] + r["release_us"] for r in light)
        out.append(f"{m}: one layer takes {total:.3g} µs, of which its bytes need {need:.3g} "
                   f"({need / total:.0%}); the median program works {beyond:.3g} µs beyond "
                   f"them, programs wait {wait:.3g} µs for the slowest one (most in "
                   f"{worst['phase']}, {worst['wait_us']:.2g} µs), and the {len(barriers)} "
                   f"releases take {rel:.2g} µs{inside}; over {mine[0]['layers']} layers "
                   f"that is {total * mine[0]['layers'] / 1e3:.3g} ms."
                   + (f" The phases with almost no bytes ({', '.join(r['phase'] for r in light)}) "
                      f"take {lt:.3g} µs of the layer ({lt / total:.0%})." if light else ""))
    return " ".join(out)


def _whiskers(ax, bars: list[tuple[float, float, dict]], unit: str = "ms"):
    """Horizontal whiskers at each bar's end ``(y, value, row)``: the row's fastest to
    slowest timed repeat (``<unit>_min``, ``<unit>_max``), where it recorded them."""
    lo_k, hi_k = f"{unit}_min", f"{unit}_max"
    have = [(y, v, r[lo_k], r[hi_k]) for y, v, r in bars
            if r.get(lo_k) is not None and r.get(hi_k) is not None]
    if have:     # stored rounded: a median within its rounding of an end gives no whisker
        ax.errorbar([v for _, v, _, _ in have], [y for y, _, _, _ in have],
                    xerr=[[max(v - a, 0) for _, v, a, _ in have],
                          [max(b - v, 0) for _, v, _, b in have]],
                    fmt="none", ecolor="black", elinewidth=0.8, capsize=2.5, zorder=4)
    return bool(have)


def draw_tp_split(panels: list[tuple[str, list[dict]]]):
    """Two GPUs: per model (``panels``: (name, a ``bench --tp`` run's rows)), each rung's
    step as the rank's compute alone (the ``none`` row) plus the rest (communication),
    the one-GPU step of the same run dashed. A rung without a compute split is one grey
    bar. Whiskers at a bar's end span its fastest to slowest timed step (``ms_min``,
    ``ms_max``, the widest of its ranks) where the rows carry them. Returns the
    matplotlib Figure."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(len(panels), 1, figsize=(PAGE_W, 2.4 * len(panels) + 0.6),
                             dpi=DPI, squeeze=False)
    for ax, (name, rows) in zip(axes[:, 0], panels):
        by = {r["rung"]: r for r in rows}
        bars = [r for r in rows
                if r["rung"] not in ("one GPU", "none") and r.get("ms_per_token")]
        y = {r["rung"]: i for i, r in enumerate(bars)}
        split = [r for r in bars if r.get("compute_ms")]
        whole = [r for r in bars if not r.get("compute_ms")]
        if split:
            ax.barh([y[r["rung"]] for r in split], [r["compute_ms"] for r in split],
                    color="#4c72b0", label="the step with no exchange")
            ax.barh([y[r["rung"]] for r in split], [r["comm_ms"] for r in split],
                    left=[r["compute_ms"] for r in split], color="#dd8452",
                    label="the exchanges")
        if whole:
            ax.barh([y[r["rung"]] for r in whole], [r["ms_per_token"] for r in whole],
                    color="#9a9a9a", label="the step (no split measured)")
        one = by.get("one GPU", {}).get("ms_per_token")
        if one:
            ax.axvline(one, color="black", lw=1.2, ls="--")
            ax.text(one, len(bars) - 0.45, f"one GPU {one:.2f} ms ", fontsize=FONT,
                    va="bottom", ha="right")
        _whiskers(ax, [(y[r["rung"]], r["ms_per_token"], r) for r in bars], "ms")
        ax.set_yticks(list(y.values()), list(y), fontsize=FONT)
        ax.set_xlabel("ms per token", fontsize=FONT)
        ax.set_title(name, fontsize=FONT + 1)
        ax.tick_params(labelsize=FONT)
        ax.set_ylim(-0.6, len(bars) + 0.2)
    handles = {}
    for ax in axes[:, 0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.legend(handles.values(), handles.keys(), fontsize=FONT, loc="lower center",
               ncol=2, frameon=False, bbox_to_anchor=(0.5, 0))
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


BYTES_C, BEYOND_C = "#4c72b0", "#c8c8c8"    # HBM (its bytes), waiting and fixed costs


def draw_ops(per_model: dict[str, list[dict]], head: str = ""):
    """Where one rung's step goes, op by op (the closing page): one panel per model
    (``per_model``: model -> its profile rows in step order), a bar per op stacked from
    the time its bytes need at the run's read bandwidth (blue) and the time it takes
    beyond them (grey), summed over the op's launches, with a whisker from the fastest to
    the slowest replay (``ms_min``, ``ms_max``) where the rows carry one. Returns a
    figure with its caption (:class:`onelaunch.report.figures._Figure`)."""
    import io

    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from .figures import _Figure
    n = [len(rows) for rows in per_model.values()]
    pitch, above, below, label_w, value_w = 0.3, 0.5, 0.45, 1.9, 1.5
    fig_h = 0.3 + sum(above + pitch * k + 0.1 + below for k in n)
    fig = Figure(figsize=(PAGE_W, fig_h), dpi=DPI)
    top_ms = max(r["ms"] for rows in per_model.values() for r in rows)
    at = 0.3
    for model, rows in per_model.items():
        ax_h = pitch * len(rows) + 0.1
        at += above
        ax = fig.add_axes([label_w / PAGE_W, 1 - (at + ax_h) / fig_h,
                           (PAGE_W - label_w - value_w) / PAGE_W, ax_h / fig_h])
        ys = range(len(rows))
        ax.barh(ys, [r["bytes_ms"] for r in rows], color=BYTES_C, height=0.64)
        ax.barh(ys, [r["beyond_ms"] for r in rows], left=[r["bytes_ms"] for r in rows],
                color=BEYOND_C, height=0.64)
        _whiskers(ax, [(y, r["ms"], r) for y, r in zip(ys, rows)], "ms")
        side = ax.get_yaxis_transform()
        for y, r in zip(ys, rows):
            ax.text(1.03, y, f"{r['ms'] * 1e3:.0f} µs, {r['launches']}×", transform=side,
                    va="center", fontsize=FONT, clip_on=False)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_yticks(list(ys))
        ax.set_yticklabels([r["op"] for r in rows], fontsize=FONT)
        ax.set_xlim(0, top_ms * 1.05)
        ax.tick_params(axis="x", labelsize=FONT)
        ax.grid(axis="x", alpha=0.2)
        fig.text(0.012, 1 - (at - above + 0.08) / fig_h,
                 f"{model}, {rows[0]['rung']}: {rows[0]['step_ms']:.3f} ms a step",
                 va="top", ha="left", fontsize=FONT + 1, fontweight="bold")
        ax.legend(handles=[Patch(color=BYTES_C, label="its bytes at the read bandwidth"),
                           Patch(color=BEYOND_C, label="beyond its bytes")],
                  loc="lower left", bbox_to_anchor=(0, 1.0), ncol=2, fontsize=FONT,
                  frameon=False, borderaxespad=0.1)
        at += ax_h + below
        ax.set_xlabel("ms a step, summed over the op's launches", fontsize=FONT)
    if head:
        fig.text(0.012, 1 - 0.08 / fig_h, head, va="top", ha="left", fontsize=FONT)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    return _Figure(buf.getvalue(), ops_caption(per_model))


def ops_caption(per_model: dict[str, list[dict]]) -> str:
    """The per-op figure's caption: what it shows, then per model the time beyond the
    bytes in all and the op that takes most of it, from the same rows."""
    parts = ["Each op of the step, in step order: the time its bytes need at the read "
             "bandwidth of the same run (blue) and the time it takes beyond them (grey), "
             "summed over its launches; beside each op its time and its launches."]
    spread = any(r.get("ms_min") is not None and r.get("ms_max") is not None
                 for rows in per_model.values() for r in rows)
    parts.append("The whiskers span the fastest to the slowest replay." if spread else
                 "These rows recorded no spread over their replays.")
    for model, rows in per_model.items():
        beyond = sum(r["beyond_ms"] for r in rows)
        top = max(rows, key=lambda r: r["beyond_ms"])
        parts.append(f"{model}: {beyond:.3f} ms beyond the bytes in all, the most in "
                     f"{top['op']} ({top['beyond_ms'] * 1e3:.0f} µs).")
    return " ".join(parts)
