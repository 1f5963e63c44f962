"""One value per quantity per run, and comparison words that agree with their numbers.

The rules (:mod:`onelaunch.report.consistency`, :mod:`onelaunch.report.wording`) on
made-up inputs, so that each can be seen to fail; then the captions and phrases the
report writes from the committed results, and the pages executed here (the closing
chapter, the introduction) against the run's ladder file. The built book is checked the
same way by tests/test_book.py."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))

from onelaunch.report import (answer, answer_figure, chapter, consistency,  # noqa: E402
                              figures, ladder_file, profile_figures, wording)

RESULTS = ROOT / "results"


def _glued(name, text, key, run):
    """A notebook output as chapter.glue writes it, with its key."""
    return nbformat.v4.new_output(
        "display_data", data={chapter.GLUE_PREFIX + "text/plain": text},
        metadata={"scrapbook": {"name": name}, "onelaunch": {"key": list(key), "run": run}})


def _nb(*outputs):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("", outputs=list(outputs))]
    return nb


KEY = ("m", "+ PDL", "512", "ms_per_token")


@pytest.mark.parametrize("a, b, same", [("1.176", "1.18", True), ("1.18", "1.2", True),
                                        ("1.18", "1.19", False), ("6.5% slower", "6.5", True),
                                        ("1.176", "1.1759359", True), ("2,268", "2268.4", True),
                                        ("0.992", "0.99", True), ("0.992", "1.0", True),
                                        ("0.992", "0.98", False), ("+ PDL", "+ PDL", True)])
def test_printed_values_agree_at_their_precision(a, b, same):
    assert consistency.agree(a, b) is same


def test_two_pages_printing_one_quantity_differently_fail():
    one = consistency.notebook_facts(_nb(_glued("chain", "1.18", KEY, "r1")), "intro")
    two = consistency.notebook_facts(_nb(_glued("ms", "1.25", KEY, "r1")), "09_the_answer")
    assert one[0]["key"] == KEY and one[0]["run"] == "r1"
    bad = consistency.conflicts(one + two)
    assert len(bad) == 1 and "1.18 (intro::chain) but 1.25 (09_the_answer::ms)" in bad[0]
    # the same quantity of another run may differ; the same value at another precision
    # is one value
    other = consistency.notebook_facts(_nb(_glued("ms", "1.25", KEY, "r0")), "07")
    same = consistency.notebook_facts(_nb(_glued("ms", "1.176", KEY, "r1")), "05")
    assert consistency.conflicts(one + other + same) == []


def test_a_page_that_differs_from_its_results_file_fails():
    rows = [{"model": "m", "rung": "+ PDL", "ctx": 512, "ms_per_token": 1.1759,
             "floor_ms": 0.7191, "run": "r1"},
            {"model": "m", "rung": "HF eager", "ctx": 512, "ms_per_token": 20.9,
             "floor_ms": 0.7191, "run": "r1"}]
    facts = consistency.ladder_facts({"rows": rows}, "ladder.json")
    right = consistency.notebook_facts(_nb(
        _glued("x", "1.64", ("m", "+ PDL", 512, "x_floor"), "r1"),
        _glued("f", "0.719", ("m", None, 512, "floor_ms"), "r1")), "intro")
    assert consistency.conflicts(facts + right) == []
    wrong = consistency.notebook_facts(_nb(
        _glued("f", "0.729", ("m", None, 512, "floor_ms"), "r1")), "intro")
    assert consistency.conflicts(facts + wrong)


@pytest.mark.parametrize("text, bad", [
    ("it is 0.62x faster than the fastest peer", ["0.62x faster"]),
    ("0.8 times slower than one GPU", ["0.8 times slower"]),
    ("1.66x faster than gpt-fast, 6.5% slower than the chain", []),
    ("0.80x one GPU, 1.32x the floor", [])])
def test_a_comparison_word_against_its_ratio_is_found(text, bad):
    assert wording.contradictions(text) == bad


def test_faster_says_it_the_right_way_round():
    assert wording.faster(1.0, 1.6, "ours", "theirs") == "ours is 1.60x faster than theirs"
    assert wording.faster(1.6, 1.0, "ours", "theirs") == "ours is 1.60x slower than theirs"
    assert wording.versus(2.0, 1.0, "x") == "2.00x slower than x"
    word = "ses" + "sion"                # spelled apart: the tree's own search skips it
    assert wording.process_words(f"the GPU machine lent in {word} 3; issue" + " 12") == \
        ["issue" + " 12", "lent", word, "the gpu machine"]


def test_a_ladder_caption_under_a_slower_rung_says_slower():
    """Chapter 3's figure: our fastest rung slower than the fastest peer."""
    rows = [{"model": "m", "rung": "oracle compiled", "ctx": 8, "ms_per_token": 2.6,
             "floor_ms": 1.0, "agree": "8/8"},
            {"model": "m", "rung": "fused eager", "ctx": 8, "ms_per_token": 4.2,
             "floor_ms": 1.0, "agree": "8/8", "order": 1}]
    cap = figures.ladder_figure(rows).caption
    assert "1.62x slower than the fastest peer" in cap
    assert wording.contradictions(cap) == []
    # a static figure marks no rung: every bar of ours is blue, and the caption says so
    assert "our rung in blue" in cap and "orange" not in cap


def test_llama_is_one_status_everywhere():
    llama = {"model": "m", "rung": "llama.cpp", "ctx": 8, "ms_per_token": 2.0,
             "floor_ms": 1.0, "agree": None, "unchecked": True, "peer": True}
    from onelaunch.report.results import NO_CHECK, agree_text, check_status
    assert check_status(llama) == NO_CHECK and agree_text(llama) == "–"
    assert figures.value_text(llama, 1.0)[1] == NO_CHECK
    cap = figures.ladder_figure([llama]).caption
    assert "no oracle check possible: llama.cpp" in cap


@pytest.fixture(scope="module")
def book_answer():
    ans = answer.answer(RESULTS)
    if not ans["models"]:
        pytest.fail("no results/<gpu>/ladder.json committed")
    return ans


def test_the_reports_captions_agree_with_their_numbers(book_answer):
    data = ladder_file.load_ladder()
    rows, _ = ladder_file.one_run(data["rows"])
    texts = [figures.figure_caption(rows, ladder_file.rung_order(rows),
                                    sorted({r["model"] for r in rows})),
             answer_figure.caption(book_answer),
             profile_figures.ops_caption({m: a["ops"] for m, a in
                                          book_answer["models"].items() if a["ops"]})]
    for t in texts:
        assert wording.contradictions(t) == [], t
        assert wording.process_words(t) == [], t


def test_the_executed_answer_pages_agree_with_the_ladder(tmp_path):
    """The closing chapter and the introduction, executed here on the CPU, print every
    keyed quantity as the run's ladder file has it."""
    from notebooks import execute, kernel_env
    import papermill as pm
    from chapter_source import read_source
    execute(ROOT / "notebooks" / "09_the_answer.md", tmp_path / "09.ipynb", "cpu", {}, 600)
    kernel_env()
    nbformat.write(read_source(ROOT / "book" / "intro.md"), tmp_path / "intro.in.ipynb")
    pm.execute_notebook(str(tmp_path / "intro.in.ipynb"), str(tmp_path / "intro.ipynb"),
                        kernel_name="python3", cwd=str(ROOT / "book"), progress_bar=False)
    facts = consistency.book_facts([tmp_path / "09.ipynb", tmp_path / "intro.ipynb"],
                                   RESULTS)
    keyed = [f for f in facts if f["where"].startswith(("09", "intro"))]
    assert len(keyed) >= 10
    assert consistency.conflicts(facts) == []
    words = " ".join(f["text"] for f in keyed)
    assert wording.contradictions(words) == []


def test_a_number_the_results_lack_is_glued_as_a_dash(monkeypatch):
    """A reader's run without a rung still builds: the page says "–" there, unkeyed."""
    got = []
    monkeypatch.setattr(chapter, "glue", lambda name, value, fmt=None, **kw:
                        got.append((name, value, fmt, kw)))
    chapter.glue_from("a", lambda: {}["one launch"]["ms"], ".2f", key=("m",), run="r")
    chapter.glue_from("b", lambda: 1.5, ".2f", key=("m",), run="r")
    assert got == [("a", "–", None, {}), ("b", 1.5, ".2f", {"key": ("m",), "run": "r"})]
