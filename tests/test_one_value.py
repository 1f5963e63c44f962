"""One value per quantity per run, with its spread.

Within one run the first chapter that writes a ladder row owns it; the run's bandwidth is
chapter 1's wherever a later chapter reads it; every timing carries its min and max, and
a difference inside them is never reported as one. Prose that reads values the executed
notebook lacks is not staged over it."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))

from onelaunch.measure import timing  # noqa: E402
from onelaunch.report import chapter, results  # noqa: E402


def _row(rung, ms, lo=None, hi=None):
    return {"model": "m", "rung": rung, "ctx": 8, "ms_per_token": ms, "floor_ms": 0.5,
            "agree": "4/4", "ms_min": lo, "ms_max": hi}


@pytest.fixture
def tmp_results(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    monkeypatch.setenv("ONELAUNCH_RUN", "run-a")
    return tmp_path


def _ladder(root):
    rows = json.loads((root / "cpu" / "ladder.json").read_text())["rows"]
    return {(r["rung"], r["chapter"]): r["ms_per_token"] for r in rows}


def test_the_first_chapter_of_a_run_owns_a_row(tmp_results, monkeypatch):
    results.write_ladder([_row("fused eager", 1.0)], device="cpu", chapter="03_a")
    results.write_ladder([_row("fused eager", 2.0), _row("fused + graph", 0.9)],
                         device="cpu", chapter="04_b")
    assert _ladder(tmp_results) == {("fused eager", "03_a"): 1.0,
                                    ("fused + graph", "04_b"): 0.9}
    # the same chapter rerun in the same run replaces its own row
    results.write_ladder([_row("fused eager", 1.5)], device="cpu", chapter="03_a")
    assert _ladder(tmp_results)[("fused eager", "03_a")] == 1.5
    # another run replaces it, whichever chapter writes it
    monkeypatch.setenv("ONELAUNCH_RUN", "run-b")
    results.write_ladder([_row("fused eager", 3.0)], device="cpu", chapter="04_b")
    assert _ladder(tmp_results)[("fused eager", "04_b")] == 3.0


def test_the_runs_bandwidth_is_chapter_ones(tmp_results, monkeypatch):
    monkeypatch.setattr(timing, "read_bandwidth", lambda *a, **k: 7.0)
    assert chapter.run_read_tbps("cpu", 0.01, 2) == (7.0, "measured in this chapter")
    results.write("floor", [{"model": "m", "read_tbps": 3.25}], device="cpu")
    assert chapter.run_read_tbps("cpu", 0.01, 2) == (3.25, "chapter 1, this run")
    monkeypatch.setenv("ONELAUNCH_RUN", "run-b")      # another run's floor.json: not read
    assert chapter.run_read_tbps("cpu", 0.01, 2)[0] == 7.0


def test_timing_carries_its_spread():
    t = timing.time_ms(lambda: sum(range(2000)), iters=9, warmup=1, device="cpu")
    assert t.min_ms <= t.median_ms <= t.max_ms
    s = t.spread()
    assert s["timed"] == 9 and s["ms_min"] <= s["ms_max"]


def test_a_difference_inside_the_spread_is_not_one():
    a, b = _row("a", 1.00, 0.98, 1.03), _row("b", 1.01, 0.99, 1.05)
    assert chapter.within_spread(a, b)
    assert chapter.compare(a, b).startswith("no different within the spread")
    c = _row("c", 1.20, 1.18, 1.22)
    assert chapter.within_spread(a, c) is False
    assert chapter.compare(c, a) == "20.0% slower"
    assert chapter.compare(a, c) == "16.7% faster"
    assert "no spread recorded" in chapter.compare(_row("d", 1.2), a)
    assert chapter.compare(None, a).startswith("(not measured")
    assert chapter.spread_text(a) == "0.98–1.03" and chapter.spread_text(_row("d", 1)) == "–"


def test_prose_needing_unglued_values_is_not_staged(tmp_path):
    from refresh_prose import missing_glue
    src = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "It takes {glue:text}`ms` ms, {glue}`new_x` times; see "
        "{glue}`other.ipynb::y`.")])
    glued = nbformat.v4.new_code_cell("glue")
    glued.outputs = [nbformat.v4.new_output("display_data", data={"text/plain": "1"},
                                            metadata={"scrapbook": {"name": "ms"}})]
    done = nbformat.v4.new_notebook(cells=[glued])
    assert missing_glue(src, done) == ["new_x"]
