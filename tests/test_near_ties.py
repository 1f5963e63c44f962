"""Near ties in one table form: every page that reports the oracle
check lists the steps that differ through ``chapter.near_ties``, from the rows' own
records (a rung's ``flips``, the oracle's ``disagreements`` against Hugging Face, an
older record's margin and bound)."""
from __future__ import annotations

import re
from pathlib import Path

from onelaunch.report import chapter

ROOT = Path(__file__).resolve().parent.parent


def _flip(step, ref, got, gap, thr=0.5, verdict=None):
    return {"step": step, "ref_token": ref, "got_token": got, "gap": gap,
            "gap_ulps": gap * 16, "threshold": thr,
            "verdict": verdict or ("near tie" if gap < thr else "flip")}


def _shown(monkeypatch):
    out = []
    monkeypatch.setattr(chapter, "markdown", out.append)
    return out


def test_tie_rows_read_every_record_form():
    rows = [{"model": "a", "rung": "graph", "flips": [_flip(0, 5, 7, 0.125)]},
            {"model": "a", "rung": "eager", "flips": []},
            {"model": "b", "disagreements": [_flip(2, 9, 3, 0.03)]},
            {"model": "b", "rung": "oracle eager",
             "flips": [{"step": 4, "margin": 0.6, "near_tie_below": 0.5}]}]
    t = chapter.tie_rows(rows)
    assert [(r["model"], r["rung"], r["step"], r["verdict"]) for r in t] == [
        ("a", "graph", 0, "near tie"), ("b", "oracle", 2, "near tie"),
        ("b", "oracle eager", 4, "flip")]
    assert t[0]["ref_token"] == 5 and t[0]["got_token"] == 7 and t[2]["gap"] == 0.6


def test_near_ties_is_one_table_or_says_none(monkeypatch):
    out = _shown(monkeypatch)
    assert chapter.near_ties([{"model": "a", "rung": "x", "flips": []}]) == []
    assert out == ["Every checked step chose the oracle's token: no near tie."]
    out.clear()
    chapter.near_ties([{"model": "a", "rung": "x", "flips": [_flip(1, 5, 7, 0.0625)]}],
                      reference="Hugging Face")
    text, tab = out
    assert "Hugging Face's" in text
    head, _, row = tab.splitlines()
    assert head.startswith("| rung | step |") and "model" not in head   # one model
    assert row == "| x | 1 | 5 | 7 | 0.0625 | 1.0 | 0.5 | near tie |"
    out.clear()
    chapter.near_ties([{"model": m, "rung": "x", "flips": [_flip(1, 5, 7, 0.1)]}
                       for m in ("a", "b")])
    assert out[1].startswith("| model | rung |")


# chapter 1 checks its rungs and leaves their differing steps to chapter 2's figure
DEFERRED = {"01_what_one_token_costs.md": "02_the_oracle.md"}


def test_chapters_show_near_ties_in_the_one_form():
    """Each page whose code runs the oracle check shows the steps that differ as the
    table (chapter.near_ties) or the figure (tie_figure), or leaves them to the page that
    draws its rows; none prints a row's flips another way."""
    pages = [p for p in sorted((ROOT / "notebooks").glob("0[1-7]_*.md"))]
    pages.append(ROOT / "book" / "results.md")
    for p in pages:
        text = p.read_text()
        shown = (ROOT / "notebooks" / DEFERRED[p.name]).read_text() \
            if p.name in DEFERRED else text
        assert "chapter.near_ties(" in shown or "tie_figure(" in shown, \
            f"{p.name}: near ties not shown as the table or the figure"
        assert not re.search(r"\{r\[.flips.\]\}", text), f"{p.name}: flips printed raw"


def test_tie_figure_places_every_differing_step():
    from onelaunch.report.tie_figure import tie_figure, tie_groups
    check = [{"model": "a", "agree": "10/12", "flips": 0,
              "disagreements": [_flip(2, 9, 3, 0.03)]}]
    ladder = [{"model": "a", "rung": "HF eager", "agree": "31/32",
               "flips": [_flip(1, 5, 7, 0.0625)]},
              {"model": "a", "rung": "fused eager", "agree": "12/12", "flips": []}]
    groups = tie_groups(check, ladder, ("HF eager",))
    assert [g["label"] for g in groups] == ["oracle vs HF", "HF eager vs oracle"]
    assert groups[0]["gaps"] == [0.48] and groups[1]["gaps"] == [1.0]
    fig = tie_figure(groups, "head")
    assert fig.png.startswith(b"\x89PNG")
    assert "2 of 44 checked steps" in fig.caption and "largest is 1 ulps" in fig.caption
