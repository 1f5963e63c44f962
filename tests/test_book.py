"""The book pipeline on the CPU: executed chapters match their sources, every chapter
runs under papermill with its CPU parameters, and the book builds with warnings as
errors (`jupyter-book build . -W -n --keep-going`, through ci/book.sh's staging).

The browser test (tests/test_browser.py, marker `browser`) then opens what this built.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
sys.path.insert(0, str(ROOT / "ci"))


def _run(*cmd, timeout=1500, env=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{p.stdout[-4000:]}\n{p.stderr[-6000:]}"
    return p


def test_executed_chapters_match_sources():
    _run(PY, "ci/check_stale.py")


def test_check_stale_catches_changed_code(tmp_path):
    """A notebook whose code cell was edited after its run is reported."""
    import nbformat
    from notebooks import read_source
    src = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))[0]
    nb = read_source(src)
    code = [c for c in nb.cells if c.cell_type == "code"]
    code[-1].source += "\nprint('edited')"
    (tmp_path / src.name).write_text(src.read_text())
    nbformat.write(nb, tmp_path / (src.stem + ".ipynb"))
    p = subprocess.run([PY, "ci/check_stale.py", str(tmp_path / (src.stem + ".ipynb"))],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 1 and "code differs" in p.stderr


def test_chapters_run_on_cpu():
    """Every chapter executes with papermill (CPU parameters); a raising cell fails."""
    _run(PY, "ci/notebooks.py", "cpu")
    import nbformat
    out = ROOT / "_build" / "cpu-notebooks"
    for src in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md")):
        nb = nbformat.read(out / f"{src.stem}.ipynb", as_version=4)
        assert nb.metadata["onelaunch"]["run"] == "cpu"
        glued = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                 if "scrapbook" in o.get("metadata", {})]
        assert glued, f"{src.stem} glued no numbers"
    ladder = json.loads((ROOT / "results" / "cpu" / "ladder.json").read_text())
    rungs = {r["rung"] for r in ladder["rows"]}
    assert {"HF eager", "HF static", "oracle eager", "oracle compiled"} <= rungs


def test_ladder_slider_widget():
    """The slider is one frame per rung, linked in the browser (jslink), and a rung
    whose check failed is drawn without a time."""
    from onelaunch import widgets
    rows = [
        {"model": "m", "rung": "HF eager", "ctx": 8, "ms_per_token": 20.0, "floor_ms": 1.0, "agree": "8/8"},
        {"model": "m", "rung": "fused", "ctx": 8, "ms_per_token": 3.0, "floor_ms": 1.0, "agree": "6/8", "order": 2},
        {"model": "m", "rung": "graph", "ctx": 8, "ms_per_token": 2.0, "floor_ms": 1.0, "agree": "8/8", "order": 1},
        {"model": "m", "rung": "oracle compiled", "ctx": 8, "ms_per_token": 4.0, "floor_ms": 1.0, "agree": "8/8"},
    ]
    assert widgets.rung_order(rows) == ["HF eager", "oracle compiled", "graph", "fused"]
    assert not widgets.row_ok(rows[1]) and widgets.row_ok(rows[0])
    assert widgets.summary(rows, "m")["best_peer"]["rung"] == "oracle compiled"
    # a flip counts only at a recorded near tie of the reference's own logits
    tie = dict(rows[1], flips=[{"step": 3, "margin": 0.0, "near_tie_below": 0.125}])
    real = dict(rows[1], flips=[{"step": 3, "margin": 0.9, "near_tie_below": 0.125}])
    assert widgets.row_ok(tie) and not widgets.row_ok(real)
    assert not widgets.row_ok(dict(tie, refused="differs"))


def test_book_builds():
    """ci/book.sh: stage (reusing the CPU runs above) and jupyter-book build -W -n."""
    _run("bash", "ci/book.sh", env={"ONELAUNCH_SKIP_SETUP": "1", "PY": PY})
    html = ROOT / "_build" / "html"
    results = (html / "book" / "results.html").read_text()
    assert "application/vnd.jupyter.widget-state+json" in results
    assert "jupyter-widgets/embed.js" in results
    assert "cdn.jsdelivr" not in results and "require.min.js" not in results
