"""ci/check_printed_width.py: no line of package source or docstring that a chapter
prints (show_source, show_kernel, show_doc, a module's ``__doc__``) is wider than the book
shows without scrolling (88 characters); every printing site resolves; and
ci/same_code.py's layout-only rule on small synthetic sources."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))
import check_printed_width as cpw  # noqa: E402
import same_code  # noqa: E402


def test_printed_code_fits():
    problems, blocks = cpw.check(cpw.chapters())
    if problems:
        pytest.fail("printed lines over 88 characters or unresolved sites:\n"
                    + "\n".join(problems), pytrace=False)
    # every chapter that shows package code was found (a lost site is not a pass)
    sites = {b.site.split(":")[0] for b in blocks}
    assert {f"notebooks/0{i}" for i in (2, 3, 4, 5, 6, 7, 8)} <= \
        {s[:len("notebooks/0x")] for s in sites}
    assert len(blocks) >= 50


def _chapter(tmp_path, code: str) -> Path:
    p = tmp_path / "09_x.md"
    p.write_text(f"# T\n\n```{{code-cell}} ipython3\n{code}\n```\n")
    return p


def test_resolves_imports_and_same_cell_names(tmp_path):
    p = _chapter(tmp_path, "import importlib\nfrom onelaunch import oracle\nfrom onelaunch.report import chapter\n"
                 "lp = importlib.import_module('onelaunch.kernels.layer_persistent')\n"
                 "n = 2\nchapter.show_source(oracle.rms_norm, lines=(0, n))\n"
                 "chapter.show_source(lp.grid_barrier.fn)")
    blocks = cpw.Chapter(p).printed()
    assert [len(b.lines) for b in blocks][0] == 2
    assert blocks[1].what.endswith("grid_barrier")


def test_unresolved_is_an_error(tmp_path):
    p = _chapter(tmp_path, "from onelaunch.report import chapter\nchapter.show_source(nowhere.f)")
    problems, _ = cpw.check([p])
    assert len(problems) == 1 and "cannot resolve" in problems[0]


def test_same_code_accepts_layout_only():
    old = 'def f(a, b):\n    """One two\n    three."""\n    return a + b  # sum\n'
    new = 'def f(a,\n      b):\n    """One two three."""\n    # sum\n    return (a +\n b)\n'
    assert same_code.same(old, new) == []
    assert same_code.same(old, old.replace("a + b", "b + a"))
    assert same_code.same(old, old.replace("two", "2"))
