"""The ladder slider: ms/token of every rung so far, one pre-rendered frame per rung.

An ``IntSlider`` over the rungs is linked with ``jslink`` to a ``Stack`` of ``Image``
widgets, so moving it needs no kernel: the static book page switches frames in the
browser (the widget JavaScript is served from the book's ``_static/``). Frame *k* draws
the rungs 0..k for each model, with two reference lines measured in the same run: the
bandwidth floor and the best peer (the fastest thing a user could pick instead).

Rows, their order and labels: :mod:`.ladder_file`; the frames: :mod:`.figures`.
"""
from __future__ import annotations

from pathlib import Path

from .figures import render_frame
from .ladder_file import load_ladder, one_run, pick_ctx, rung_order
from .results import RESULTS


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
