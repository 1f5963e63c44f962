"""The book pipeline on the CPU: executed chapters match their sources, every chapter
runs under papermill with its CPU parameters (two at a time), and the book builds with
warnings as errors (`jupyter-book build . -W -n --keep-going`, through ci/book.sh's
staging, which reuses those runs); the built book keeps to its word budget, prints no
process words and prints one value per quantity of a run.

The browser test (tests/test_browser.py, marker `browser`) then opens what this built.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

WORD = "ses" + "sion"      # a process word, spelled apart: the tree's own search skips it

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
    from chapter_source import read_source
    src = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))[0]
    nb = read_source(src)
    code = [c for c in nb.cells if c.cell_type == "code"]
    code[-1].source += "\nprint('edited')"
    (tmp_path / src.name).write_text(src.read_text())
    nbformat.write(nb, tmp_path / (src.stem + ".ipynb"))
    p = subprocess.run([PY, "ci/check_stale.py", str(tmp_path / (src.stem + ".ipynb"))],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 1 and "code differs" in p.stderr


def test_check_stale_allows_layout_but_not_values(tmp_path):
    """Re-wrapping a cell or editing a comment leaves the syntax tree as it ran: not stale.
    Changing a number in it is."""
    import nbformat
    from chapter_source import read_source
    src = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))[0]
    text = src.read_text()
    nb = read_source(src)
    (tmp_path / src.name).write_text(text)
    code = [c for c in nb.cells if c.cell_type == "code"]
    code[-1].source = "# a comment the run did not have\n" + code[-1].source.replace(", ", ",\n    ", 1)
    nbformat.write(nb, tmp_path / (src.stem + ".ipynb"))
    run = lambda: subprocess.run([PY, "ci/check_stale.py", str(tmp_path / (src.stem + ".ipynb"))],
                                 cwd=ROOT, capture_output=True, text=True)
    assert run().returncode == 0, run().stderr
    code[-1].source += "\nx = 1"
    nbformat.write(nb, tmp_path / (src.stem + ".ipynb"))
    assert run().returncode == 1


def test_staging_keeps_one_of_a_glue_repeated_with_the_same_value():
    import nbformat
    from stage_book import _drop_repeated_glue

    def out(name, v):
        return nbformat.v4.new_output("display_data", data={"text/plain": v},
                                      metadata={"scrapbook": {"name": name}})
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("", outputs=[out("a", "1"), out("b", "2")]),
                nbformat.v4.new_code_cell("", outputs=[out("a", "1"), out("b", "3")])]
    assert _drop_repeated_glue(nb) == ["a"]
    assert [len(c.outputs) for c in nb.cells] == [2, 1]     # b differs: the build decides


def test_parameters_are_hidden_and_one_line_says_what_ran():
    import nbformat
    from notebooks import gpu_parameters, hide_parameters
    from stage_book import ran_note
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("device = 'cpu'\nresults_gpu = 'h200'"),
                nbformat.v4.new_code_cell("device = 'cuda'"),
                nbformat.v4.new_code_cell("x = 1")]
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.cells[1].metadata["tags"] = ["injected-parameters"]
    hide_parameters(nb)
    assert [c.metadata.get("tags", []) for c in nb.cells] == [
        ["parameters", "remove-cell"], ["injected-parameters", "remove-cell"], []]
    # a GPU run shows its own results: results_gpu None, without a null in front matter
    assert gpu_parameters(nb) == {"device": "cuda", "results_gpu": None}
    gpu = ran_note({"run": "gpu", "commit": "abc", "parameters": {"device": "cuda",
                                                                 "ctx": 512, "m": [1]}})
    assert gpu == "This page ran on the GPU (device cuda, ctx 512) at commit `abc`."
    cpu = ran_note({"run": "cpu"}, {"device": "cuda", "results_gpu": None, "ctx": 512})
    assert "tiny shapes" in cpu and "\n" not in cpu
    assert cpu.endswith("the GPU run it names, which runs it with device cuda, ctx 512.")


def test_chapters_run_side_by_side_in_order():
    import threading
    import time
    from notebooks import in_parallel
    started, live, most = [], [0], [0]
    lock = threading.Lock()

    def run(srcs):
        with lock:
            started.append(srcs[0])
            live[0] += 1
            most[0] = max(most[0], live[0])
        time.sleep(0.05)
        with lock:
            live[0] -= 1
    in_parallel(list("abcde"), run, workers=2)
    assert sorted(started) == list("abcde") and started[:2] == ["a", "b"] and most[0] == 2


def test_a_cpu_run_is_reused_only_with_its_parameters(tmp_path):
    import nbformat
    from notebooks import package_hash, source_hash
    from stage_book import _fresh_cpu_run
    src = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md"))[0]
    nb = nbformat.v4.new_notebook()
    nb.metadata["onelaunch"] = {"source_hash": source_hash(src),
                                "package_hash": package_hash(), "parameters": {}}
    nbformat.write(nb, tmp_path / "x.ipynb")
    assert _fresh_cpu_run(src, tmp_path / "x.ipynb", {})
    assert not _fresh_cpu_run(src, tmp_path / "x.ipynb", {"results_gpu": "rtx4090"})


def test_a_book_page_is_executed_with_results_gpu(tmp_path, monkeypatch):
    """ci/book.sh -p results_gpu G: a book page that computes is executed in the staged
    tree with the parameter it has (and no other), its parameters hidden, its source
    replaced by the executed notebook."""
    import nbformat
    import stage_book
    src = tmp_path / "page.md"
    src.write_text("---\nkernelspec:\n  display_name: Python 3\n  language: python\n"
                   "  name: python3\njupytext:\n  text_representation:\n    extension: "
                   ".md\n    format_name: myst\n---\n\n# P\n\n```{code-cell} ipython3\n"
                   ":tags: [parameters, remove-cell]\n\nresults_gpu = None\n```\n\n"
                   "```{code-cell} ipython3\nprint('shows', results_gpu)\n```\n")
    (tmp_path / "stage" / "book").mkdir(parents=True)
    (tmp_path / "stage" / "book" / "page.md").write_text(src.read_text())
    monkeypatch.setattr(stage_book, "STAGE", tmp_path / "stage")
    monkeypatch.setattr(stage_book, "ROOT", tmp_path)
    stage_book._stage_page(src, {"results_gpu": "rtx4090", "model": "x"}, 120)
    out = tmp_path / "stage" / "book" / "page.ipynb"
    assert out.exists() and not (tmp_path / "stage" / "book" / "page.md").exists()
    nb = nbformat.read(out, as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "shows rtx4090" in text
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert injected and "model" not in injected[0].source
    assert all("remove-cell" in c.metadata["tags"] for c in nb.cells
               if "parameters" in c.metadata.get("tags", [])
               or "injected-parameters" in c.metadata.get("tags", []))


def test_the_words_rule_counts_prose_and_outputs_and_finds_process_words(tmp_path):
    from book_words import problems, read
    page = tmp_path / "p.html"
    page.write_text("<html><nav>menu words here</nav><main><p>one two three</p>"
                    "<div class='cell_input'><pre>code not counted</pre></div>"
                    "<div class='cell_output'><p>four five</p></div>"
                    f"<p>made in {WORD} 9</p><p>it is 0.62x faster</p></main></html>")
    got = read(page)
    assert (got["prose"], got["outputs"]) == (11, 2) and got["process_words"] == [WORD]
    assert got["contradictions"] == ["0.62x faster"]
    assert problems([got], book=100, page=100) == [
        f"p: process words ['{WORD}']",
        "p: a comparison word against its ratio ['0.62x faster']"]
    clean = dict(got, process_words=[], contradictions=[])
    assert problems([clean] * 3, book=38, page=12) == [
        "p: 13 words (over 12)"] * 3 + ["the book: 39 words (over 38)"]
    assert problems([clean], book=100, page=100) == []


def test_chapters_run_on_cpu():
    """Every chapter executes with papermill (CPU parameters); a raising cell fails."""
    _run(PY, "ci/notebooks.py", "cpu")
    import nbformat
    out = ROOT / "_build" / "cpu-notebooks"
    for src in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md")):
        nb = nbformat.read(out / f"{src.stem}.ipynb", as_version=4)
        assert nb.metadata["onelaunch"]["run"] == "cpu"
        params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
        assert params and all("remove-cell" in c.metadata["tags"] for c in params), \
            f"{src.stem}: its parameters cell is shown"
        glued = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
                 if "scrapbook" in o.get("metadata", {})]
        assert glued, f"{src.stem} glued no numbers"
    ladder = json.loads((ROOT / "results" / "cpu" / "ladder.json").read_text())
    rungs = {r["rung"] for r in ladder["rows"]}
    assert {"HF eager", "HF static", "oracle eager", "oracle compiled"} <= rungs


def test_ladder_slider_widget():
    """The slider is one frame per rung, linked in the browser (jslink), and a rung
    whose check failed is drawn without a time."""
    from onelaunch.report import ladder_file, results
    rows = [
        {"model": "m", "rung": "HF eager", "ctx": 8, "ms_per_token": 20.0, "floor_ms": 1.0, "agree": "8/8"},
        {"model": "m", "rung": "fused", "ctx": 8, "ms_per_token": 3.0, "floor_ms": 1.0, "agree": "6/8", "order": 2},
        {"model": "m", "rung": "graph", "ctx": 8, "ms_per_token": 2.0, "floor_ms": 1.0, "agree": "8/8", "order": 1},
        {"model": "m", "rung": "oracle compiled", "ctx": 8, "ms_per_token": 4.0, "floor_ms": 1.0, "agree": "8/8"},
    ]
    assert ladder_file.rung_order(rows) == ["HF eager", "oracle compiled", "graph", "fused"]
    assert not results.row_passes(rows[1]) and results.row_passes(rows[0])
    assert ladder_file.summary(rows, "m")["best_peer"]["rung"] == "oracle compiled"
    # a flip counts only at a recorded near tie of the reference's own logits
    tie = dict(rows[1], flips=[{"step": 3, "margin": 0.0, "near_tie_below": 0.125}])
    real = dict(rows[1], flips=[{"step": 3, "margin": 0.9, "near_tie_below": 0.125}])
    assert results.row_passes(tie) and not results.row_passes(real)
    assert not results.row_passes(dict(tie, refused="differs"))


def test_figures_say_what_the_table_says():
    """A figure's words for a rung come from the same rule as the ladder table's column
    (results.check_status), and its caption is generated from the same rows."""
    from onelaunch.report import figures, ladder_file, results
    tie = [{"step": 0, "margin": 0.0, "near_tie_below": 0.125}]
    rows = [
        {"model": "m", "rung": "HF eager", "ctx": 8, "ms_per_token": 20.0, "floor_ms": 1.0, "agree": "8/8"},
        {"model": "m", "rung": "oracle eager", "ctx": 8, "ms_per_token": 30.0, "floor_ms": 1.0,
         "agree": "10/12", "commit": "c0"},
        {"model": "m", "rung": "graph", "ctx": 8, "ms_per_token": 2.0, "floor_ms": 1.0,
         "agree": "11/12", "flips": tie},
        {"model": "m", "rung": "fused", "ctx": 8, "ms_per_token": 3.0, "floor_ms": 1.0,
         "agree": "6/8", "flips": [{"step": 1, "margin": 3.0, "near_tie_below": 0.125}]},
    ]
    assert [results.check_status(r) for r in rows] == ["pass", "refused", "near ties only", "refused"]
    assert figures.value_text(rows[0], 1.0)[:2] == ("20 ms, 20x floor", None)
    assert figures.value_text(rows[2], 1.0)[1] == "11/12, near ties"
    assert figures.value_text(rows[3], 1.0)[:2] == ("no time shown", "check failed (6/8)")
    cap = figures.figure_caption(rows, ladder_file.rung_order(rows), ["m"])
    assert "A bar for 2 of its 4 rungs" in cap and "graph" in cap
    assert "oracle, eager (10/12); fused (6/8)" in cap
    # the oracle's own row is judged by its check against HF, as on the ladder page
    check = [{"model": "m", "agree": "10/12", "disagreements": [{"step": 2, "hf_gap": 0.01}]}]
    judged = [dict(r) for r in rows]
    results.attach_reference_flips(judged, check)
    assert results.check_status(judged[1]) == "near ties only"
    fig = figures.ladder_figure(rows, title="t", head="h")
    assert fig.png[:4] == b"\x89PNG" and fig.caption.startswith("Milliseconds per token")
    assert ("The fastest of ours is graph at 2 ms (2.00x the floor), it is 10.00x faster "
            "than the fastest peer (HF generate, eager)") in fig.caption
    import io

    from PIL import Image
    im = Image.open(io.BytesIO(fig.png))
    assert im.info["dpi"][0] >= 149.9          # 150 dpi, as written
    one, left = ladder_file.one_run([dict(r, commit="a") for r in rows[:3]] + [dict(rows[3], commit="b")])
    assert len(one) == 3 and [r["rung"] for r in left] == ["fused"]


def test_kernel_startup_applies_the_memory_cap(tmp_path, monkeypatch):
    """ci/notebooks.py runs an IPython startup file in each chapter's kernel: the cap
    (ONELAUNCH_GPU_MEM_GB) is read there before the first cell, and the peak recorded."""
    import nbformat
    from notebooks import execute
    src = tmp_path / "99_probe.md"
    src.write_text("---\nkernelspec:\n  display_name: Python 3\n  language: python\n"
                   "  name: python3\njupytext:\n  text_representation:\n    extension: .md\n"
                   "    format_name: myst\n---\n\n```{code-cell} ipython3\n:tags: [parameters]\n\n"
                   "device = 'cpu'\n```\n\n```{code-cell} ipython3\n"
                   "print('cap', _memcap.cap_gb())\n```\n")
    monkeypatch.setenv("ONELAUNCH_GPU_MEM_GB", "24")
    out = tmp_path / "99_probe.ipynb"
    execute(src, out, "cpu", {}, 120)
    nb = nbformat.read(out, as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))
    assert "cap 24.0" in text
    m = nb.metadata["onelaunch"]
    assert m["gpu_mem_cap_gb"] == 24.0 and m["gpu_memory"] is None     # no GPU, no peak


def test_book_builds():
    """ci/book.sh: stage (reusing the CPU runs above) and jupyter-book build -W -n."""
    _run("bash", "ci/book.sh", env={"ONELAUNCH_SKIP_SETUP": "1", "PY": PY})
    html = ROOT / "_build" / "html"
    results = (html / "book" / "results.html").read_text()
    assert "application/vnd.jupyter.widget-state+json" in results
    assert "jupyter-widgets/embed.js" in results
    assert "cdn.jsdelivr" not in results and "require.min.js" not in results
    for page in html.rglob("*.html"):
        text = page.read_text()
        assert text.count("const THEBE_JS_URL") <= 1, f"{page}: thebe's script twice"
        assert "The The " not in text, f"{page}: 'The The'"
    run = (html / "book" / "run_yourself.html").read_text()
    assert "NVIDIA driver" in run and "llama-bench" in run and "results_gpu" in run
    intro = (html / "book" / "intro.html").read_text()
    assert "<img" in intro and "the chain" in intro.lower()
    for page in list((html / "notebooks").glob("*.html")) + [html / "book" / "intro.html"]:
        text = page.read_text()
        assert "results_gpu = " not in text, f"{page.name} shows its parameters cell"


def test_one_value_per_quantity_across_the_built_book():
    """Every keyed number the executed pages print agrees with every other page and
    with the run's ladder file (onelaunch.report.consistency)."""
    from onelaunch.report import consistency
    staged = sorted((ROOT / "_build" / "src").rglob("*.ipynb"))
    assert staged, "no staged book: tests/test_book.py::test_book_builds first"
    facts = consistency.book_facts(staged, ROOT / "results")
    assert consistency.conflicts(facts) == []


def test_book_words_within_budget():
    """The built book: at most 13,000 words of prose and outputs in all and about 2,000
    on one page, no page prints a process word, and no comparison word contradicts its
    ratio (ci/book_words.py)."""
    from book_words import pages, problems, read
    html = ROOT / "_build" / "html"
    stats = [read(p) for p in pages(html)]
    assert stats, "no built book: tests/test_book.py::test_book_builds first"
    bad = problems(stats)
    assert not bad, "\n".join(bad)
