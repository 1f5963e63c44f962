"""ci/check_one_commit.py: the executed chapters and the results the book shows come from
one GPU run. Synthetic trees for the rule; the committed tree for the book itself."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))


def _tree(tmp: Path, commits: dict[str, str], ladder_rows: list[str], run=None) -> Path:
    """A repository with two chapters and the results they write, at the given commits."""
    nbdir = tmp / "notebooks"
    nbdir.mkdir(parents=True)
    (nbdir / "01_a.md").write_text('```{code-cell} ipython3\nresults.write("floor", rows)\n'
                                   'results.write_ladder(rows)\n```\n')
    (nbdir / "02_b.md").write_text('```{code-cell} ipython3\nx = results.load("kernels", g)\n```\n')
    for stem in ("01_a", "02_b"):
        meta = {"onelaunch": {"commit": commits[stem], "run_id": run}}
        (nbdir / f"{stem}.ipynb").write_text(json.dumps({"metadata": meta, "cells": []}))
    res = tmp / "results" / "h200"
    res.mkdir(parents=True)
    for name in ("floor", "kernels", "notshown"):
        (res / f"{name}.json").write_text(json.dumps(
            {"meta": {"commit": commits.get(name, commits["01_a"]), "run": run}, "rows": [{}]}))
    (res / "ladder.json").write_text(json.dumps(
        {"meta": {"commit": commits["01_a"], "run": run},
         "rows": [{"rung": f"r{i}", "commit": c, "run": run} for i, c in enumerate(ladder_rows)]}))
    # a CPU smoke run is never what the book shows as a measurement
    (tmp / "results" / "cpu").mkdir()
    (tmp / "results" / "cpu" / "ladder.json").write_text(json.dumps(
        {"meta": {"commit": "cpu0"}, "rows": [{"commit": "cpu0"}]}))
    return tmp


def _check(root, *more):
    return subprocess.run([sys.executable, "ci/check_one_commit.py", "--root", str(root),
                           *more], cwd=ROOT, capture_output=True, text=True)


def test_one_commit_passes(tmp_path):
    from check_one_commit import shown_results
    root = _tree(tmp_path, {"01_a": "aaa", "02_b": "aaa", "notshown": "zzz"}, ["aaa", "aaa"])
    assert shown_results(root) == ["floor", "kernels", "ladder", "oracle_check"]
    p = _check(root)
    assert p.returncode == 0, p.stderr
    assert "one commit per machine kind: 1 GPU(s) aaa" in p.stdout


def test_a_chapter_from_another_commit_fails(tmp_path):
    root = _tree(tmp_path, {"01_a": "aaa", "02_b": "bbb"}, ["aaa"])
    p = _check(root)
    assert p.returncode == 1
    assert "notebooks/02_b.ipynb: commit bbb" in p.stderr


def test_results_rows_from_another_commit_fail(tmp_path):
    root = _tree(tmp_path, {"01_a": "aaa", "02_b": "aaa", "kernels": "bbb"}, ["aaa", "ccc"])
    p = _check(root)
    assert p.returncode == 1
    assert "results/h200/kernels.json: commit bbb" in p.stderr
    assert "results/h200/ladder.json, 1 row(s): commit ccc" in p.stderr


def test_two_runs_of_one_commit_fail(tmp_path):
    root = _tree(tmp_path, {"01_a": "aaa", "02_b": "aaa"}, ["aaa"], run="aaa-1")
    nb = root / "notebooks" / "02_b.ipynb"
    nb.write_text(json.dumps({"metadata": {"onelaunch": {"commit": "aaa", "run_id": "aaa-2"}}}))
    p = _check(root)
    assert p.returncode == 1 and "run aaa-2, not aaa-1" in p.stderr


def test_the_two_gpu_chapter_is_a_run_of_its_own(tmp_path):
    """Chapter 7 and results/h200x2/ may keep an earlier two-GPU run; within that kind
    one commit still rules."""
    root = _tree(tmp_path, {"01_a": "aaa", "02_b": "aaa"}, ["aaa"])
    nb = root / "notebooks"
    (nb / "07_tp.md").write_text("---\nonelaunch:\n  needs: 2 GPUs with NVLink\n---\n"
                                 '```{code-cell} ipython3\nresults.write("tp", rows)\n```\n')
    (nb / "07_tp.ipynb").write_text(json.dumps(
        {"metadata": {"onelaunch": {"commit": "old"}}, "cells": []}))
    x2 = root / "results" / "h200x2"
    x2.mkdir()
    (x2 / "tp.json").write_text(json.dumps({"meta": {"commit": "old"}, "rows": [{}]}))
    p = _check(root)
    assert p.returncode == 0, p.stderr
    assert "2 GPU(s) old" in p.stdout
    (x2 / "tp.json").write_text(json.dumps({"meta": {"commit": "aaa"}, "rows": [{}]}))
    p = _check(root)
    assert p.returncode == 1 and "results/h200x2/tp.json: commit aaa, not old" in p.stderr


def test_the_book_comes_from_one_run():
    """The committed tree: a results file of an earlier run passes only where each page
    that reads it names that run (with no executed page, through numbers_line)."""
    p = _check(ROOT)
    assert p.returncode == 0, p.stderr


def _reads_kernels_of(root: Path, run: str, named: str = "") -> None:
    """results/h200/kernels.json from run ``run``; chapter 02_b reads it and, where
    ``named`` is given, shows it with that code after its load."""
    (root / "results" / "h200" / "kernels.json").write_text(json.dumps(
        {"meta": {"commit": run, "run": f"book-{run}", "gpu_name": "H200", "torch": "t",
                  "triton": "t", "date": "2026-11-30"}, "rows": [{}]}))
    (root / "notebooks" / "02_b.md").write_text(
        '```{code-cell} ipython3\nx = results.load("kernels", g)\n' + named + "```\n")


def test_a_file_of_another_run_passes_only_where_its_page_names_it(tmp_path):
    root = _tree(tmp_path, {"01_a": "aaa", "02_b": "aaa"}, ["aaa"])
    for nb in (root / "notebooks").glob("*.ipynb"):
        nb.unlink()                      # no executed pages: the code must name the run
    _reads_kernels_of(root, "bbb")
    p = _check(root)
    assert p.returncode == 1 and "results/h200/kernels.json: commit bbb" in p.stderr
    _reads_kernels_of(root, "bbb", 'chapter.numbers_line(g, "kernels", "The kernels")\n')
    p = _check(root)
    assert p.returncode == 0, p.stderr
    assert "results/h200/kernels.json: run book-bbb, named by notebooks/02_b.md" in p.stdout
    # a second page that reads it without naming it fails the file again
    (root / "notebooks" / "03_c.md").write_text(
        '```{code-cell} ipython3\ny = results.load("kernels", g)\n```\n')
    p = _check(root)
    assert p.returncode == 1 and "results/h200/kernels.json: commit bbb" in p.stderr
    # a numbers line of another file names nothing here
    _reads_kernels_of(root, "bbb", 'chapter.numbers_line(g, "floor")\n')
    (root / "notebooks" / "03_c.md").unlink()
    assert _check(root).returncode == 1


def test_an_executed_page_must_show_the_run_it_reads(tmp_path):
    """Where a page has an executed version (the GPU run's notebook, or a --pages
    folder's), what it shows decides: its outputs must carry the run id or commit."""
    root = _tree(tmp_path, {"01_a": "aaa", "02_b": "aaa"}, ["aaa"])
    _reads_kernels_of(root, "bbb", 'chapter.numbers_line(g, "kernels", "The kernels")\n')
    nb = root / "notebooks" / "02_b.ipynb"
    page = lambda text: nb.write_text(json.dumps({
        "metadata": {"onelaunch": {"commit": "aaa"}},
        "cells": [{"cell_type": "code", "source": "", "outputs": [
            {"output_type": "display_data", "data": {"text/markdown": text}}]}]}))
    page("Numbers on this page: H200, commit `aaa`.")
    p = _check(root)
    assert p.returncode == 1 and "results/h200/kernels.json: commit bbb" in p.stderr
    page("The kernels: H200, torch t, Triton t, commit `bbb`, 2026-11-30.")
    assert _check(root).returncode == 0
    # a built page in a --pages folder counts the same way
    for x in (root / "notebooks").glob("*.ipynb"):
        x.unlink()
    _reads_kernels_of(root, "bbb")
    built = tmp_path / "html"
    built.mkdir()
    (built / "02_b.html").write_text("<p>The kernels: run <code>book-bbb</code></p>")
    p = _check(root, "--pages", str(built))
    assert p.returncode == 0, p.stderr
    (built / "02_b.html").write_text("<p>The kernels: 2026-11-30</p>")
    assert _check(root, "--pages", str(built)).returncode == 1


def test_chapters_without_executed_notebooks_are_the_results_run(tmp_path):
    """Chapters executed on the CPU (no committed .ipynb) show the GPU run's results
    files: those files alone must come from one run."""
    root = _tree(tmp_path, {"01_a": "aaa", "02_b": "aaa"}, ["aaa"])
    for nb in (root / "notebooks").glob("*.ipynb"):
        nb.unlink()
    p = _check(root)
    assert p.returncode == 0, p.stderr
    assert "one commit per machine kind: 1 GPU(s) aaa" in p.stdout
    (root / "results" / "h200" / "kernels.json").write_text(json.dumps(
        {"meta": {"commit": "bbb"}, "rows": [{}]}))
    p = _check(root)
    assert p.returncode == 1 and "results/h200/kernels.json: commit bbb" in p.stderr
