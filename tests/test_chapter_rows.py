"""A chapter's figure draws only what its chapter's run had made.

A ladder file holds rows of two runs: an older one that measured every rung (chapter 8's
gpt-fast peer and persistent rungs among them) and this run, which has reached a given
chapter. Each chapter's figure cell is executed as the chapter has it, with the ladder
figure replaced by a recorder: it must draw rows of this run only, of its own chapter or
an earlier one, and some of them."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))

from onelaunch.report import ladder_file, results  # noqa: E402
from onelaunch.specs import get_spec  # noqa: E402

CTX = 512
DENSE, MOE = "qwen2.5-1.5b", "olmoe-1b-7b"
# (chapter, rung, models) in the order a full run writes them
WRITES = [("01_what_one_token_costs", "HF eager", (DENSE, MOE)),
          ("01_what_one_token_costs", "HF static", (DENSE, MOE)),
          ("02_the_oracle", "oracle eager", (DENSE, MOE)),
          ("02_the_oracle", "oracle compiled", (DENSE, MOE)),
          ("03_fused_kernels", "fused eager", (DENSE,)),
          ("04_one_graph", "fused + graph", (DENSE,)),
          ("05_split_k", "+ split-K", (DENSE,)),
          ("05_split_k", "+ PDL", (DENSE,)),
          ("06_mixture_of_experts", "+ PDL", (MOE,)),
          ("08_one_launch", "gpt-fast compiled", (DENSE,)),
          ("08_one_launch", "+ persistent layer", (DENSE, MOE))]


def _row(chapter, rung, model, run, ms):
    return {"model": model, "rung": rung, "ctx": CTX, "ms_per_token": ms, "floor_ms": 0.7,
            "agree": "12/12", "commit": run[:3], "run": run, "chapter": chapter}


def _ladder(tmp: Path, upto: str) -> Path:
    """results/cpu/ladder.json: run "old" wrote every rung; run "new" reached ``upto``."""
    rows = [_row(c, g, m, "old", 9.0) for c, g, ms in WRITES for m in ms]
    new = [_row(c, g, m, "new", 1.0) for c, g, ms in WRITES for m in ms if c <= upto]
    key = lambda r: (r["model"], r["rung"], r["ctx"])
    mine = {key(r) for r in new}
    rows = [r for r in rows if key(r) not in mine] + new     # write_ladder's merge
    p = tmp / "cpu" / "ladder.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"meta": {"run": "new", "commit": "new"}, "rows": rows}))
    return p


def _figure_cells(stem: str) -> list[str]:
    from chapter_source import code_cells, read_source
    return [c for c in code_cells(read_source(ROOT / "notebooks" / f"{stem}.md"))
            if "ladder_figure(" in c]


CHAPTERS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.md")
                  if _figure_cells(p.stem))


def test_chapters_with_ladder_figures_are_found():
    assert {"02_the_oracle", "03_fused_kernels", "04_one_graph", "05_split_k"} <= set(CHAPTERS)


@pytest.mark.parametrize("stem", CHAPTERS)
def test_figure_draws_only_its_own_runs_rows(stem, tmp_path, monkeypatch):
    _ladder(tmp_path, stem)
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    monkeypatch.setenv("ONELAUNCH_RUN", "new")
    drawn = []

    def record(rows, **kw):
        drawn.append([dict(r) for r in rows])

    own = [r for r in ladder_file.chapter_rows(stem, "cpu") if r["chapter"] == stem]
    ns = {"ladder_figure": record, "ctx": CTX, "models": [DENSE, MOE], "spec": get_spec(DENSE),
          "device": "cpu", "smoke": True, "run": {"gpu_name": "test"},
          "rows": own, "eager": own, "chapter_rows": ladder_file.chapter_rows,
          "is_peer": ladder_file.is_peer, "results": results}
    for cell in _figure_cells(stem):
        exec(compile(cell, f"{stem} figure cell", "exec"), ns)
    assert drawn, f"{stem}: no figure drawn"
    for rows in drawn:
        assert rows, f"{stem}: a figure drew no rows"
        other = [(r["rung"], r["run"]) for r in rows if r["run"] != "new"]
        assert not other, f"{stem}'s figure draws rows of another run: {other}"
        later = [(r["rung"], r["chapter"]) for r in rows if r["chapter"] > stem]
        assert not later, f"{stem}'s figure draws rows of later chapters: {later}"


def test_chapter_rows_filters_run_and_chapter(tmp_path, monkeypatch):
    _ladder(tmp_path, "08_one_launch")
    monkeypatch.setattr(results, "RESULTS", tmp_path)
    monkeypatch.setenv("ONELAUNCH_RUN", "new")
    got = ladder_file.chapter_rows("02_the_oracle", "cpu", CTX, [DENSE])
    assert sorted(r["rung"] for r in got) == ["HF eager", "HF static", "oracle compiled",
                                             "oracle eager"]
    assert all(r["run"] == "new" for r in got)
    monkeypatch.setenv("ONELAUNCH_RUN", "another")
    assert ladder_file.chapter_rows("08_one_launch", "cpu") == []
