"""Every time the book shows carries its spread: the kernel and op rows (graph_time), the
two-GPU rows (each rank's timed steps), the profile's ops and step (its replays); every
figure a chapter draws that shows a time draws the min–max whiskers of the rows that
recorded them; and a time a chapter's prose quotes from such a row goes without its
spread only where a figure of that page shows it."""
from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest

from onelaunch.measure import timing, tp
from onelaunch.measure.trace import attribute
from onelaunch.report import chapter, figures, profile_figures

from test_profile import events_for, layer_plan


def test_graph_time_hands_on_the_spread_per_launch():
    info = {}
    us = timing.graph_time(lambda: sum(range(3000)), 3, "cpu", 40, info)
    assert info["us_min"] <= us <= info["us_max"] and info["timed"] == 4
    row = {"us": us, **info}
    assert chapter.spread_text(row, keys=chapter.US_SPREAD) != "–"
    assert chapter.spread_text({"us": us}, keys=chapter.US_SPREAD) == "–"


def test_two_gpu_rows_take_the_widest_range_of_their_ranks():
    ranks = [{"ms_min": 0.95, "ms_max": 1.02, "timed": 100},
             {"ms_min": 0.97, "ms_max": 1.05, "timed": 100}]
    assert tp.rank_spread(ranks) == {"ms_min": 0.95, "ms_max": 1.05, "timed": 100}
    assert tp.rank_spread([ranks[0], {"ms_min": None, "ms_max": None}])["ms_min"] is None
    rows = tp.finish_rows([{"rung": "one GPU", "ms_per_token": 1.2, "floor_ms": 0.7,
                            "ms_min": 1.1, "ms_max": 1.3}])
    assert "1.100-1.300" in tp.format_rows(rows)


def test_profile_rows_carry_their_replays_range():
    plan = layer_plan()
    ev = events_for(plan, 4, dur=lambda k: 3.0 + k % 4)
    slow = events_for(plan, 1, dur=lambda k: 5.0, t=ev[-1][2] + 10)   # one slow replay
    rows = attribute(ev + slow, plan, replays=5, read_tbps=1.0)
    for r in rows:
        assert r["ms_min"] <= r["ms"] <= r["ms_max"]
        assert r["span_min_ms"] <= r["span_ms"] < r["span_max_ms"]


def _profile(rung, span, lo, hi):
    return {"model": "m", "rung": rung, "op": "rms_qkv", "ms": span, "bytes_ms": span / 2,
            "beyond_ms": span / 2, "span_ms": span, "span_min_ms": lo, "span_max_ms": hi}


def test_profile_caption_claims_no_difference_inside_the_spread():
    same = [_profile("a", 1.00, 0.98, 1.05), _profile("b", 0.99, 0.97, 1.04)]
    assert "b: 0.99 ms a step (no different within the replays' spread)" in \
        profile_figures.caption(same)
    apart = [_profile("a", 1.00, 0.98, 1.05), _profile("b", 0.80, 0.79, 0.82)]
    assert "b: 0.8 ms a step (-0.2 ms)" in profile_figures.caption(apart)
    assert "whisker" in profile_figures.caption(apart)


def test_kernel_figure_draws_the_spread_and_says_so():
    rows = [{"kernel": "rms_qkv", "gbps": 1333.2, "pct_of_read": 31.3, "bytes": 6.3e6,
             "us": 4.73, "us_min": 4.6, "us_max": 5.1},
            {"kernel": "lm_head_argmax", "gbps": 3865.0, "pct_of_read": 90.9,
             "bytes": 4.67e8, "us": 120.8, "us_min": 119.0, "us_max": 124.0}]
    f = figures.kernel_figure(rows, 4.25, "head")
    assert "whiskers span the slowest to the fastest" in f.caption
    bare = [{k: v for k, v in r.items() if not k.startswith("us_")} for r in rows]
    assert "No spread was recorded" in figures.kernel_figure(bare, 4.25, "head").caption


# --- every figure a chapter draws that shows a time draws its spread ------------------

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "results" / "h200"
# figures a chapter draws that show no time of a timed repeat
NO_TIME = {"tie_figure": "logit gaps in bf16 ulps, no time",
           "step_clock.draw": "one traced step's clock stamps, no repeats to spread"}
FIGURE_CALL = re.compile(r"\b((?:profile_figures|step_clock)\.draw\w*|\w+_figure)\(")


def _rows(name):
    return json.loads((H200 / f"{name}.json").read_text())["rows"]


def _with_spread(rows, key, unit):
    """``rows`` given a spread around ``key`` where the run that wrote them had none."""
    return [dict(r, **{f"{unit}_min": r.get(f"{unit}_min") or 0.9 * r[key],
                       f"{unit}_max": r.get(f"{unit}_max") or 1.1 * r[key]})
            if r.get(key) else r for r in rows]


def _ladder():
    from onelaunch.report.ladder_file import one_run
    return [r for r in one_run(_rows("ladder"))[0] if r["ctx"] == 512]


def _tp_bars():
    """One model's two-GPU rows; its bars (not the one-GPU line, nor the compute-alone
    row the bars split by) carry a spread."""
    rows = json.loads((ROOT / "results" / "h200x2" / "tp.json").read_text())["rows"]
    rows = [r for r in rows if r["model"] == rows[0]["model"]]
    bars = [r for r in rows if r["rung"] not in ("one GPU", "none")]
    return _with_spread(bars, "ms_per_token", "ms") + [r for r in rows if r not in bars]


def _ops():
    from onelaunch.report import answer
    ans = answer.answer(ROOT / "results", gpu="h200")
    return {m: _with_spread(a["ops"], "ms", "ms") for m, a in ans["models"].items()
            if a["ops"]}


# figure -> (draw it from rows, the rows, the spread keys those rows carry)
SPREAD_FIGURES = {
    "ladder_figure": (lambda rows: figures.ladder_figure(rows, head="h"), _ladder,
                      ("ms_min", "ms_max")),
    "kernel_figure": (lambda rows: figures.kernel_figure(rows, 4.3, "h"),
                      lambda: _rows("kernels"), ("us_min", "us_max")),
    "sweep_figure": (lambda rows: figures.sweep_figure(rows, "h"), lambda: _rows("sweep"),
                     ("ms_min", "ms_max")),
    "attention_figure": (lambda rows: __import__(
        "onelaunch.report.attention_figure", fromlist=["x"]).attention_figure(rows, "h"),
        lambda: _rows("attention"), ("us_min", "us_max")),
    "profile_figures.draw_tp_split": (
        lambda rows: profile_figures.draw_tp_split([("m", rows)]),
        lambda: _tp_bars(), 
        ("ms_min", "ms_max")),
    "profile_figures.draw_ops": (profile_figures.draw_ops, _ops, ("ms_min", "ms_max")),
}


def chapter_figures() -> set[str]:
    """The figure functions the chapters' code cells call."""
    sys.path.insert(0, str(ROOT / "ci"))
    from chapter_source import code_cells, read_source
    return {m for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))
            for c in code_cells(read_source(p)) for m in FIGURE_CALL.findall(c)}


def test_every_figure_the_chapters_draw_is_judged_here():
    called = chapter_figures()
    assert {"ladder_figure", "kernel_figure"} <= called     # the search finds them
    unknown = called - set(SPREAD_FIGURES) - set(NO_TIME)
    assert not unknown, f"figures the chapters draw with no spread case here: {unknown}"


def whiskers(draw, data, monkeypatch) -> int:
    """How many whiskers of non-zero length ``draw(data)`` puts on its axes."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.axes import Axes
    seen, real = [], Axes.errorbar

    def record(self, x, y, *a, xerr=None, yerr=None, **kw):
        for err in (xerr, yerr):
            if err is not None:
                lo, hi = (err, err) if len(err) != 2 else err
                seen.extend(1 for a_, b_ in zip(lo, hi) if a_ > 0 or b_ > 0)
        return real(self, x, y, *a, xerr=xerr, yerr=yerr, **kw)

    monkeypatch.setattr(Axes, "errorbar", record)
    draw(data)
    import matplotlib.pyplot as plt
    plt.close("all")
    return len(seen)


def _strip(data, keys):
    if isinstance(data, dict):
        return {m: _strip(rows, keys) for m, rows in data.items()}
    return [{k: v for k, v in r.items() if k not in keys} for r in data]


def _count(data, keys):
    rows = [r for rs in data.values() for r in rs] if isinstance(data, dict) else data
    return sum(all(r.get(k) is not None for k in keys) and r[keys[0]] != r[keys[1]]
               for r in rows)


@pytest.mark.parametrize("name", sorted(SPREAD_FIGURES))
def test_a_figure_that_draws_a_time_draws_its_spread(name, monkeypatch):
    draw, rows, keys = SPREAD_FIGURES[name]
    data = rows()
    n = _count(data, keys)
    assert n, f"{name}: no row with a spread to draw"
    assert whiskers(draw, data, monkeypatch) >= n, f"{name}: a row's spread is not drawn"
    assert whiskers(draw, _strip(data, keys), monkeypatch) == 0, \
        f"{name}: whiskers drawn from something else than {keys}"


# a glued time quoted straight from a row, by its field; the figures that show that
# field's spread, and the other way a page may show it (chapter.spread_text)
TIME_FIELDS = {"ms_per_token": {"ladder_figure", "sweep_figure",
                                "profile_figures.draw_tp_split"},
               "us": {"kernel_figure", "attention_figure"}}


def _reads(node, fields) -> set[str]:
    """The time fields ``node`` reads straight from a row (``r["us"]``, ``.get(...)``)."""
    out = set()
    for n in ast.walk(node):
        key = (n.slice if isinstance(n, ast.Subscript) else
               n.args[0] if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == "get" and n.args else None)
        if isinstance(key, ast.Constant) and key.value in fields:
            out.add(key.value)
    return out


def quoted_times(code: str) -> list[tuple[str, str]]:
    """(glue name, field) of each glue whose value is a row's time as it is: a subscript,
    a ``.get``, or a helper (a lambda or def of the page) that returns one; sums and
    ratios of times are not a quoted time."""
    tree = ast.parse(code)
    helpers = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Lambda):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    helpers[t.id] = _reads(n.value.body, TIME_FIELDS)
        elif isinstance(n, ast.FunctionDef):
            helpers[n.name] = _reads(n, TIME_FIELDS)
    out = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.Call) and len(n.args) >= 2
                and (getattr(n.func, "attr", None) in ("glue", "glue_from")
                     or getattr(n.func, "id", None) in ("glue", "glue_from"))):
            continue
        name = n.args[0].value if isinstance(n.args[0], ast.Constant) else \
            ast.unparse(n.args[0])
        v = n.args[1]
        v = v.body if isinstance(v, ast.Lambda) else v
        branches = [v.body, v.orelse] if isinstance(v, ast.IfExp) else [v]
        for b in branches:
            if isinstance(b, (ast.Subscript, ast.Call)) and not isinstance(b, ast.BinOp):
                direct = (_reads(b, TIME_FIELDS) if not (isinstance(b, ast.Call)
                          and isinstance(b.func, ast.Name)) else
                          helpers.get(b.func.id, set()))
                if isinstance(b, ast.Call) and isinstance(b.func, ast.Name) \
                        and b.func.id in ("max", "min", "sum", "len", "float", "int"):
                    direct = set()
                out += [(name, f) for f in sorted(direct)]
    return out


def spread_problems(name: str, code: str) -> list[str]:
    """Times a page quotes whose spread it shows nowhere: not in a figure of rows of
    that field, nor through chapter.spread_text."""
    drawn = set(FIGURE_CALL.findall(code))
    bare = [(g, f) for g, f in quoted_times(code) if not TIME_FIELDS[f] & drawn]
    if len(re.findall(r"\bspread_text\(", code)) >= len(bare):   # one spread per time
        return []
    return [f"{name}: glue {g!r} quotes a row's {f} with no spread shown (draw it in "
            f"{' or '.join(sorted(TIME_FIELDS[f]))}, or quote chapter.spread_text)"
            for g, f in bare]


def _chapter_code(p):
    sys.path.insert(0, str(ROOT / "ci"))
    from chapter_source import code_cells, read_source
    return "\n".join(code_cells(read_source(p)))


PAGES = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_a_quoted_time_has_its_spread_on_the_page(page):
    problems = spread_problems(page.name, _chapter_code(page))
    assert not problems, "\n".join(problems)


def test_the_quoted_time_rule_can_fail():
    code = ('ms = lambda m: lad.get(m, {}).get("ms_per_token")\n'
            'chapter.glue("a", ms("x"), ".3f")\n'
            'chapter.glue("b", r["us"], ".2g")\n'
            'chapter.glue("c", r["ms_per_token"] / s["ms_per_token"], ".2f")\n'
            'glue("d", lambda: best["ms_per_token"], ".3f")\n')
    assert quoted_times(code) == [("a", "ms_per_token"), ("b", "us"), ("d", "ms_per_token")]
    assert len(spread_problems("p", code)) == 3
    assert len(spread_problems("p", code + "ladder_figure(rows)\n")) == 1
    assert spread_problems("p", code + "ladder_figure(rows)\nkernel_figure(k, 1, 'h')\n") == []
    spreads = 'chapter.glue("a_spread", chapter.spread_text(r))\n'
    assert len(spread_problems("p", code + spreads * 2)) == 3        # one each, not one
    assert spread_problems("p", code + spreads * 3) == []
