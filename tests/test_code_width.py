"""ci/check_code_width.py: no line of a chapter's code cell is wider than the book shows
without scrolling (88 characters), one test per chapter; and the checker's rules on small
synthetic sources (the width, and the layout-only comparison behind ``--against``)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))
import check_code_width as ccw  # noqa: E402

CHAPTERS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))


@pytest.mark.parametrize("src", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_chapter_code_fits(src):
    wide = ccw.too_wide(src.relative_to(ROOT), src.read_text(encoding="utf-8"))
    if wide:
        pytest.fail("code lines over 88 characters:\n" + "\n".join(wide), pytrace=False)


def _md(*cells: str) -> str:
    body = "\n\nSome prose.\n\n".join(f"```{{code-cell}} ipython3\n{c}\n```" for c in cells)
    return f"---\nkernelspec: {{}}\n---\n\n# Title\n\n{body}\n"


def test_too_wide_names_file_and_line():
    text = _md(":tags: [parameters]\n\nx = 1  # " + "a" * 80, "y = 2")
    wide = ccw.too_wide("nb.md", text)
    assert wide == ["nb.md:10: 89 > 88 characters"]
    assert text.splitlines()[9].startswith("x = 1")
    assert ccw.too_wide("nb.md", _md("x = 1  # " + "a" * 79)) == []


def test_main_exits_1_naming_the_line(tmp_path, capsys):
    src = tmp_path / "01_x.md"
    src.write_text(_md("y = 2", "x = 1  # " + "a" * 80))
    assert ccw.main([str(src)]) == 1
    assert f"{src}:14: 89 > 88 characters" in capsys.readouterr().err
    src.write_text(_md("y = 2", "x = 1"))
    assert ccw.main([str(src)]) == 0


def test_prose_is_not_checked():
    assert ccw.too_wide("nb.md", _md("x = 1") + "word " * 40 + "\n") == []


def test_compare_accepts_a_rewrap_only():
    old = _md(":tags: [parameters]\n\nn = 3  # a comment", "f(a, b, c)  # long comment")
    new = _md(":tags: [parameters]\n\nn = 3  # shorter", "# long comment\nf(a,\n  b, c)")
    assert ccw.compare("nb.md", old, new, "REF") == []


@pytest.mark.parametrize("new, what", [
    (_md(":tags: [parameters]\n\nn = 4", "f(a, b, c)"), "AST differs"),
    (_md(":tags: [remove-input]\n\nn = 3", "f(a, b, c)"), "metadata differs"),
    (_md(":tags: [parameters]\n\nn = 3", "f(a, b, c)").replace("Some", "Any"),
     "outside the code cells"),
    (_md(":tags: [parameters]\n\nn = 3"), "1 code cells"),
])
def test_compare_catches_more_than_layout(new, what):
    old = _md(":tags: [parameters]\n\nn = 3", "f(a, b, c)")
    problems = ccw.compare("nb.md", old, new, "REF")
    assert any(what in p for p in problems), problems
