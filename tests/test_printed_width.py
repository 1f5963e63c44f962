"""ci/check_printed_width.py: no line of package source or docstring that a chapter
prints (a ``{literalinclude}`` of a package object, show_source, show_kernel, show_doc,
a module's ``__doc__``) is wider than the book
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
    # every site was found (a lost site is not a pass): each {literalinclude} directive in
    # the chapters' text gives one block, and every chapter of the ladder shows its code
    directives = sum(p.read_text().count("```{literalinclude}") for p in cpw.chapters())
    from_text = [b for b in blocks if "::" in b.what]
    assert directives and len(from_text) == directives, (len(from_text), directives)
    sites = {b.site[:len("notebooks/0x")] for b in blocks}
    assert {f"notebooks/0{i}" for i in range(1, 9)} <= sites
    assert all(b.lines for b in blocks)


def test_literalinclude_cuts_as_sphinx_does(tmp_path):
    (tmp_path / "m.py").write_text("import x\n\n\nclass A:\n    @staticmethod\n"
                                   "    def f(a):\n        # one\n        b = a\n"
                                   "        return b\n")
    ch = tmp_path / "nb" / "01_x.md"
    ch.parent.mkdir()
    ch.write_text("# T\n\n```{literalinclude} ../m.py\n:pyobject: A.f\n:language: python\n"
                  "```\n\n```{literalinclude} ../m.py\n:pyobject: A.f\n:start-at: \"# one\"\n"
                  ":end-at: b = a\n:dedent:\n```\n")
    whole, cut = cpw.included(ch)
    assert (whole.first, whole.lines[0], len(whole.lines)) == (5, "    @staticmethod", 5)
    assert (cut.first, cut.lines) == (7, ["# one", "b = a"])
    ch.write_text(ch.read_text().replace("A.f", "A.g", 1))
    problems, _ = cpw.check([ch])
    assert len(problems) == 1 and "cannot resolve :pyobject: A.g" in problems[0]
    (tmp_path / "m.py").write_text("def f():\n    return '" + "x" * 90 + "'\n")
    ch.write_text("```{literalinclude} ../m.py\n:pyobject: f\n```\n")
    problems, _ = cpw.check([ch])
    assert problems and "m.py:2: 103 > 88 characters" in problems[0]


def _chapter(tmp_path, code: str) -> Path:
    p = tmp_path / "09_x.md"
    p.write_text(f"# T\n\n```{{code-cell}} ipython3\n{code}\n```\n")
    return p


def test_resolves_imports_and_same_cell_names(tmp_path):
    p = _chapter(tmp_path, "import importlib\nfrom onelaunch import oracle\nfrom onelaunch.report import chapter\n"
                 "lp = importlib.import_module('onelaunch.kernels.layer_persistent_kernel')\n"
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
