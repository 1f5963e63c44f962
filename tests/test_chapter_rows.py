"""A chapter's ladder figure draws the rows of one run, from the folder the page shows.

A page's numbers come from ``gpu = chapter.shown(device, results_gpu)``: on the CPU the
published GPU run's folder (``results/h200/``), on a GPU run its own. The ladder file there
may hold rows of two runs (``write_ladder`` keeps an older run's rows of keys the newer
one did not write). Each chapter that draws a ladder-style figure is executed here on the
CPU, its measuring cells left out, its figure replaced by a recorder, against a results
folder whose ladder holds every row a full GPU run writes (:data:`WRITES`) twice: once
of the run the file names, once of an earlier run; and ``results/cpu/`` holds a third.
Every figure must draw rows, all of the run the file names. The table itself is checked
against the chapters' ``results.write`` and ``write_ladder`` calls."""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "ci"))

from onelaunch.measure.rungs import LADDER, MEGA  # noqa: E402
from onelaunch.peers import llama_cpp  # noqa: E402
from onelaunch.report import figures, ladder_file, results  # noqa: E402

CTX = 512
DENSE, MOE = "qwen2.5-1.5b", "olmoe-1b-7b"
PEERS1 = ("HF eager", "HF static", "oracle eager", "oracle compiled")
PERSISTENT = ("persistent, nothing ahead", "persistent, tiles ahead")
# (chapter, rung, models): the ladder rows a full GPU run writes, in its order
WRITES = ([("01_what_one_token_costs", g, (DENSE, MOE)) for g in PEERS1]
          + [("03_fused_kernels", "fused eager", (DENSE,))]
          + [("04_one_graph", g, (DENSE,)) for g in LADDER]
          + [("05_split_k", g, (DENSE,)) for g in ("+ split-K", "+ PDL")]
          + [("06_mixture_of_experts", g, (MOE,)) for g in LADDER + (llama_cpp.NAME,)]
          + [("08_one_launch", g, (DENSE,)) for g in PERSISTENT]
          + [("08_one_launch", "+ persistent layer", (DENSE, MOE))]
          + [("08_one_launch", g, (DENSE,)) for g in (MEGA, "gpt-fast compiled",
                                                      llama_cpp.NAME)])
# the other results files each chapter's GPU run writes
FILES = {"01_what_one_token_costs": {"floor", "launches"},
         "02_the_oracle": {"oracle_check"}, "03_fused_kernels": {"kernels"},
         "04_one_graph": set(), "05_split_k": {"attention", "sweep", "long_context"},
         "06_mixture_of_experts": {"moe_ops", "moe_sweep", "moe_long_context"},
         "07_two_gpus": {"tp"}, "08_one_launch": {"step_clock"}, "09_the_answer": set()}
# names a chapter takes its rungs from, and the rungs they hold (bench_rows: ours, LADDER,
# unless told otherwise)
NAMED_RUNGS = {"LADDER": LADDER, "bench_rows(": LADDER, "MEGA": (MEGA,), "llama_cpp.NAME": (llama_cpp.NAME,),
               "LLAMA": (llama_cpp.NAME,), "RUNGS": PEERS1}
SHOWN, EARLIER = "d88688b7f8d5-20261202T235432Z", "153dd63c058b-20261130T120000Z"
STEMS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.md"))


def _cells(stem: str) -> list[str]:
    from chapter_source import code_cells, read_source
    return code_cells(read_source(ROOT / "notebooks" / f"{stem}.md"))


def _code(stem: str) -> str:
    return "\n".join(_cells(stem))


FIGURE_STEMS = [s for s in STEMS if "ladder_figure(" in _code(s)]


def test_the_writes_table_is_the_chapters_calls():
    """FILES and WRITES say what the chapters' code writes: each chapter's
    ``results.write("NAME"`` calls, whether it calls ``write_ladder``, and each rung of
    WRITES named in its code (as a string or through a name that holds it)."""
    for stem in STEMS:
        code = _code(stem)
        wrote = set(re.findall(r"results\.write\(\s*[\"'](\w+)[\"']", code))
        assert wrote == FILES[stem], f"{stem} writes {sorted(wrote)}"
        ladder = [g for c, g, _ in WRITES if c == stem]
        assert bool(ladder) == ("write_ladder(" in code), f"{stem}: write_ladder"
        for g in ladder:
            assert g in code or any(n in code and g in rungs
                                    for n, rungs in NAMED_RUNGS.items()), \
                f"{stem}: no sign in its code that it writes the rung {g!r}"


def _row(real: dict, chapter: str, rung: str, model: str, run: str, slower: float) -> dict:
    r = dict(real.get((model, rung)) or {"ms_per_token": 2.0, "floor_ms": 0.7,
                                         "x_floor": 2.0 / 0.7, "agree": "12/12",
                                         "flips": [], "launches": 200})
    for k in ("ms_per_token", "ms_min", "ms_max"):
        if r.get(k):
            r[k] *= slower
    return dict(r, model=model, rung=rung, ctx=CTX, chapter=chapter, run=run,
                commit=run.split("-")[0])


def _results(tmp: Path) -> Path:
    """A results tree: the published folder's files, its ladder replaced by WRITES'
    rows of the run it names and the same rows of an earlier run; a CPU ladder of a
    third."""
    shutil.copytree(ROOT / "results" / "h200", tmp / "h200",
                    ignore=shutil.ignore_patterns("2026-*", "*.pt", "ladder.json"))
    data = json.loads((ROOT / "results" / "h200" / "ladder.json").read_text())
    real = {(r["model"], r["rung"]): r for r in data["rows"] if r["ctx"] == CTX}
    rows = [_row(real, c, g, m, run, k) for run, k in ((EARLIER, 1.5), (SHOWN, 1.0))
            for c, g, ms in WRITES for m in ms]
    meta = dict(data["meta"], run=SHOWN, commit=SHOWN.split("-")[0])
    (tmp / "h200" / "ladder.json").write_text(json.dumps({"meta": meta, "rows": rows}))
    (tmp / "cpu").mkdir()
    cpu = [_row(real, c, g, m, "cpu-run", 9.0) for c, g, ms in WRITES for m in ms]
    (tmp / "cpu" / "ladder.json").write_text(json.dumps(
        {"meta": dict(meta, run="cpu-run", commit="cpu"), "rows": cpu}))
    return tmp


MEASURES = ("results.write", "write_ladder(", "measure_on_gpu()")


def drawn_rows(stem: str, tmp: Path, monkeypatch) -> list[list[dict]]:
    """Execute ``stem``'s cells on the CPU against ``_results(tmp)``, leaving out those
    that measure (and those that use what only they made); return the rows of each
    ladder figure it draws."""
    monkeypatch.setattr(results, "RESULTS", _results(tmp))
    monkeypatch.setenv("ONELAUNCH_RUN", "cpu-run")
    drawn = []
    monkeypatch.setattr(figures, "ladder_figure",
                        lambda rows, **kw: drawn.append([dict(r) for r in rows]))
    ns = {"__name__": "__main__", "display": lambda *a, **k: None}
    for i, cell in enumerate(_cells(stem)):
        if any(m in cell for m in MEASURES):
            continue
        try:
            exec(compile(cell, f"{stem} cell {i}", "exec"), ns)
        except NameError:
            if "ladder_figure(" in cell:
                raise
    return drawn


@pytest.mark.parametrize("stem", FIGURE_STEMS)
def test_figure_draws_one_run_of_the_shown_folder(stem, tmp_path, monkeypatch):
    drawn = drawn_rows(stem, tmp_path, monkeypatch)
    assert drawn, f"{stem}: no figure drawn"
    for rows in drawn:
        assert rows, f"{stem}: a figure drew no rows"
        runs = sorted({results.run_key(r) for r in rows})
        assert runs == [SHOWN], (f"{stem}'s figure draws rows of {runs}, not only of the "
                                 f"run its folder's ladder names ({SHOWN})")


def test_the_chapters_with_ladder_figures_are_found():
    assert {"01_what_one_token_costs", "04_one_graph",
            "06_mixture_of_experts"} <= set(FIGURE_STEMS)


def test_a_figure_of_two_runs_is_caught(tmp_path, monkeypatch):
    """The recorder and the mixed folder catch a figure drawn from every row there."""
    stem = "04_one_graph"
    src = [c.replace("ours, _ = one_run(", "ours, _ = (lambda rs: (rs, []))(")
           for c in _cells(stem)]
    monkeypatch.setattr(sys.modules[__name__], "_cells", lambda s: src)
    drawn = drawn_rows(stem, tmp_path, monkeypatch)
    assert drawn and {results.run_key(r) for r in drawn[0]} == {SHOWN, EARLIER}


def test_chapter_rows_filters_run_and_chapter(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "RESULTS", _results(tmp_path))
    monkeypatch.setenv("ONELAUNCH_RUN", "cpu-run")
    got = ladder_file.chapter_rows("03_fused_kernels", "cpu", CTX, [DENSE])
    assert sorted(r["rung"] for r in got) == sorted(PEERS1 + ("fused eager",))
    assert all(r["run"] == "cpu-run" for r in got)
    monkeypatch.setenv("ONELAUNCH_RUN", "another")
    assert ladder_file.chapter_rows("08_one_launch", "cpu") == []
