"""Near ties in one table form: every page that reports the oracle
check lists the steps that differ through ``chapter.near_ties``, from the rows' own
records (a rung's ``flips``, the oracle's ``disagreements`` against Hugging Face, an
older record's margin and bound)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

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


def test_agreement_names_the_near_ties_count():
    assert chapter.agreement({"agree": "12/12", "flips": []}) == "12/12"
    assert chapter.agreement({"agree": None}) == "reference"
    row = {"agree": "10/12", "flips": [_flip(1, 5, 7, 0.0625), _flip(4, 2, 3, 0.1)]}
    assert chapter.agreement(row) == "10/12 (2 near ties)"
    row["flips"][1] = _flip(4, 2, 3, 0.9)
    assert chapter.agreement(row) == "10/12 (1 near tie, 1 flip)"
    assert "not recorded" in chapter.agreement({"agree": "11/12"})


# an interpolation that prints a row's agreement, or a list of its differing steps, raw
RAW_AGREE = re.compile(r"\{[^{}]*\[[\"']agree[\"']\][^{}]*\}")
RAW_LIST = re.compile(r"\{[^{}]*\[[\"'](flips|disagreements|near_ties)[\"']\]\s*[!:}]")
PAGES = sorted((ROOT / "notebooks").glob("0[1-8]_*.md")) + [ROOT / "book" / "results.md"]


def _code(page: Path) -> str:
    import sys
    sys.path.insert(0, str(ROOT / "ci"))
    from chapter_source import code_cells, read_source
    return "\n".join(code_cells(read_source(page)))


def near_tie_problems(name: str, code: str) -> list[str]:
    """What a page's code does against the one form: a page that judges rungs
    (``chapter.require``) shows their differing steps through one shared function, the
    figure (``tie_figure``) or the check line's ``chapter.agreement`` (which names the
    near ties' count); no page prints a row's list of steps raw, nor its ``agree`` raw
    unless the page draws the figure that places its differing steps."""
    out = []
    if "chapter.require(" in code and not ("tie_figure(" in code
                                           or "chapter.agreement(" in code):
        out.append(f"{name}: judges rungs but shows no near ties (tie_figure or "
                   "chapter.agreement)")
    if "tie_figure(" not in code:
        out += [f"{name}: prints agreement raw, not through chapter.agreement: {m.group(0)}"
                for m in RAW_AGREE.finditer(code)]
    out += [f"{name}: prints a list of differing steps raw: {m.group(0)}"
            for m in RAW_LIST.finditer(code)]
    return out


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_chapters_show_near_ties_in_the_one_form(page):
    problems = near_tie_problems(page.name, _code(page))
    assert not problems, "\n".join(problems)


def test_the_one_form_rule_fails_on_a_raw_page():
    judged = 'chapter.require(rows, "x")\n'
    assert near_tie_problems("p", judged) and not near_tie_problems("p", judged + "tie_figure(g)")
    assert near_tie_problems("p", judged + 'print(f"{r[\'rung\']} {r[\'agree\']}")')
    assert near_tie_problems("p", 'print(f"{r[\'flips\']}")')
    assert not near_tie_problems(
        "p", judged + 'print(f"{len(j[\'near_ties\'])} {chapter.agreement(r)}")')


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
