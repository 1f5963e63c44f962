"""Every time in a table or figure carries its spread: the kernel and
op rows (graph_time), the two-GPU rows (each rank's timed steps), the profile's ops and
step (its replays), and the figures and captions that show them."""
from __future__ import annotations

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


@pytest.mark.parametrize("page, keys", [("03_fused_kernels", "US_SPREAD"),
                                        ("05_split_k", "US_SPREAD"),
                                        ("06_mixture_of_experts", "US_SPREAD"),
                                        ("07_two_gpus", None)])
def test_the_chapters_tables_show_the_spread(page, keys):
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent / "notebooks" / f"{page}.md").read_text()
    assert "chapter.with_spread(" in text
    assert keys is None or f"keys=chapter.{keys}" in text
